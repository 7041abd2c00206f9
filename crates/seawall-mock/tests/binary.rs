//! The `seawall-mock` binary: one command, a profile file, a listening server.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_seawall-mock");

fn profile(name: &str) -> String {
    format!("{}/profiles/{name}.toml", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn it_serves_a_profile_file_with_one_command() {
    let mut child = Command::new(BIN)
        .args(["--profile", &profile("calm"), "--addr", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let addr = first
        .strip_prefix("seawall-mock listening on http://")
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
        .to_owned();

    let body = r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}"#;
    let mut conn = TcpStream::connect(&addr).unwrap();
    // A safety net against a hung server, not a timing assertion.
    conn.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    write!(
        conn,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer sk-test\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    conn.read_to_string(&mut response).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();

    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    let lower = response.to_ascii_lowercase();
    assert!(
        lower.contains("x-ratelimit-limit-requests: 500"),
        "{response}"
    );
    assert!(
        response.contains("\"object\":\"chat.completion\""),
        "{response}"
    );
}

#[test]
fn check_prints_the_parsed_profile() {
    let out = Command::new(BIN)
        .args(["--profile", &profile("storm"), "--seed", "5", "--check"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("seed = 5"), "{text}");
    assert!(text.contains("rpm = 600"), "{text}");
    let by_name = Command::new(BIN)
        .args(["--profile", "storm", "--check"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8(by_name.stdout)
            .unwrap()
            .contains("seed = 2024")
    );
}

#[test]
fn bad_input_fails_with_a_clear_message() {
    let dir = std::env::temp_dir().join(format!("seawall-mock-bin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("broken.toml");
    std::fs::write(&file, "[stream.cut]\nprobability = 3\n").unwrap();
    let out = Command::new(BIN)
        .args(["--profile", file.to_str().unwrap(), "--check"])
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("broken.toml"), "{err}");
    assert!(
        err.contains("stream.cut.probability must be between 0 and 1"),
        "{err}"
    );

    let out = Command::new(BIN)
        .args(["--addr", "nowhere"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8(out.stderr).unwrap().contains("HOST:PORT"));

    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8(out.stdout).unwrap().contains("--profile"));
}
