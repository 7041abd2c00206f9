//! `seawall-mock`: serves the chaos upstream over HTTP with a fault profile.
//!
//! ```text
//! seawall-mock --profile crates/seawall-mock/profiles/storm.toml --addr 127.0.0.1:8080
//! ```

use std::net::SocketAddr;
use std::process::ExitCode;

use axum::serve::ListenerExt;
use seawall_mock::{MockUpstream, Profile};

const USAGE: &str = "\
seawall-mock: an OpenAI- and Anthropic-compatible upstream that injects faults

USAGE:
    seawall-mock [--profile FILE|NAME] [--addr HOST:PORT] [--seed N] [--check]

OPTIONS:
    --profile FILE|NAME  a TOML fault profile, or a shipped one by name:
                         calm, storm, outage, flaky-streams, deepseek, example
                         (default: no faults, no latency, no limits)
    --addr HOST:PORT     where to listen (default 127.0.0.1:8080; port 0 picks one)
    --seed N             override the profile's seed
    --check              validate the profile, print it as TOML and exit
    -h, --help           this text

ENDPOINTS:
    POST /v1/chat/completions   OpenAI chat completions (stream: true for SSE)
    POST /v1/messages           Anthropic messages (stream: true for SSE)
    GET  /mock/stats            counters as JSON
";

/// What the command line asked for.
#[derive(Debug, PartialEq)]
struct Args {
    profile: Option<String>,
    addr: SocketAddr,
    seed: Option<u64>,
    check: bool,
    help: bool,
}

fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Args, String> {
    let mut out = Args {
        profile: None,
        addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
        seed: None,
        check: false,
        help: false,
    };
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
            _ => (arg, None),
        };
        let mut value = |name: &str| {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match flag.as_str() {
            "--profile" | "-p" => out.profile = Some(value("--profile")?),
            "--addr" | "-a" => {
                let v = value("--addr")?;
                out.addr = v
                    .parse()
                    .map_err(|_| format!("--addr {v:?} is not HOST:PORT (like 127.0.0.1:8080)"))?;
            }
            "--seed" => {
                let v = value("--seed")?;
                out.seed = Some(
                    v.parse()
                        .map_err(|_| format!("--seed {v:?} is not a number"))?,
                );
            }
            "--check" => out.check = true,
            "-h" | "--help" => out.help = true,
            other => return Err(format!("unknown argument {other:?} (see --help)")),
        }
    }
    Ok(out)
}

/// A file if it exists, else a shipped profile by name.
fn load_profile(arg: Option<&str>) -> Result<Profile, String> {
    let Some(arg) = arg else {
        return Ok(Profile::default());
    };
    if std::path::Path::new(arg).exists() {
        return Profile::load(arg).map_err(|e| e.to_string());
    }
    Profile::builtin(arg).ok_or_else(|| {
        let names: Vec<&str> = Profile::builtin_names().collect();
        format!(
            "no profile file {arg:?}, and no shipped profile of that name ({})",
            names.join(", ")
        )
    })
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("seawall-mock: {e}");
            return ExitCode::from(2);
        }
    };
    if args.help {
        print!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let mut profile = match load_profile(args.profile.as_deref()) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("seawall-mock: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(seed) = args.seed {
        profile.seed = seed;
    }
    if args.check {
        return match toml::to_string(&profile) {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("seawall-mock: cannot print the profile: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("seawall-mock: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args.addr, profile, args.profile)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("seawall-mock: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(addr: SocketAddr, profile: Profile, name: Option<String>) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))?;
    let local = listener.local_addr()?;
    let upstream = MockUpstream::new(profile);
    // The first line is for scripts and tests: they read the address from it.
    println!("seawall-mock listening on http://{local}");
    println!(
        "profile: {} (seed {}); stats at http://{local}/mock/stats; Ctrl-C stops",
        name.as_deref().unwrap_or("default (no faults)"),
        upstream.profile().seed
    );
    // Without Nagle's algorithm, which would hold each small SSE event of a stream until the
    // reader's delayed ACK (some 40 ms).
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, seawall_mock::router(upstream))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Result<Args, String> {
        parse_args(s.split_whitespace().map(String::from))
    }

    #[test]
    fn defaults() {
        let a = args("").unwrap();
        assert_eq!(a.addr, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(a.profile, None);
        assert!(!a.check && !a.help);
    }

    #[test]
    fn the_readme_command_line() {
        let a = args("--profile crates/seawall-mock/profiles/storm.toml --addr 127.0.0.1:8080")
            .unwrap();
        assert_eq!(
            a.profile.as_deref(),
            Some("crates/seawall-mock/profiles/storm.toml")
        );
        assert_eq!(a.addr.port(), 8080);
        let b = args("--profile=calm --addr=0.0.0.0:0 --seed 9 --check").unwrap();
        assert_eq!(b.profile.as_deref(), Some("calm"));
        assert_eq!(b.addr.port(), 0);
        assert_eq!(b.seed, Some(9));
        assert!(b.check);
    }

    #[test]
    fn bad_arguments_are_clear_errors() {
        assert!(args("--addr nowhere").unwrap_err().contains("HOST:PORT"));
        assert!(args("--profile").unwrap_err().contains("needs a value"));
        assert!(args("--seed x").unwrap_err().contains("not a number"));
        assert!(args("--verbose").unwrap_err().contains("unknown argument"));
    }

    #[test]
    fn profiles_by_path_and_by_name() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/profiles/storm.toml");
        let from_file = load_profile(Some(path)).unwrap();
        assert_eq!(from_file, Profile::builtin("storm").unwrap());
        assert_eq!(from_file.seed, 2024);
        assert_eq!(from_file.limits.rpm, Some(600));
        assert_eq!(load_profile(Some("calm")).unwrap().seed, 1);
        assert_eq!(load_profile(None).unwrap(), Profile::default());
        let err = load_profile(Some("no-such-profile")).unwrap_err();
        assert!(err.contains("storm"), "{err}");
    }

    #[test]
    fn a_bad_profile_file_names_the_file_and_the_problem() {
        let dir = std::env::temp_dir().join(format!("seawall-mock-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("bad.toml");
        std::fs::write(&file, "[limits]\nrpm = \"fast\"\n").unwrap();
        let err = load_profile(Some(file.to_str().unwrap())).unwrap_err();
        assert!(err.contains("bad.toml"), "{err}");
        assert!(err.contains("rpm"), "{err}");
        std::fs::write(&file, "[[errors]]\nstatus = 200\n").unwrap();
        let err = load_profile(Some(file.to_str().unwrap())).unwrap_err();
        assert!(err.contains("not an error status"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
