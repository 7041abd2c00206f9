//! No retry is silent: every retry emits a `tracing` event with its facts.

mod common;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use common::{Ask, Mock, rate_limited, secs, server_error};
use seawall_core::FailureClass;
use seawall_retry::BackoffRetryLayer;
use tower::{Layer, Service, ServiceExt};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

type Fields = HashMap<String, String>;

/// Keeps the fields of every event.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<(String, Fields)>>>);

struct Collect<'a>(&'a mut Fields);

impl Visit for Collect<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields::new();
        event.record(&mut Collect(&mut fields));
        let target = event.metadata().target().to_owned();
        self.0.lock().unwrap().push((target, fields));
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[test]
fn every_retry_emits_an_event_with_its_facts() {
    let capture = Capture::default();
    let mock = Mock::new(|n| match n {
        0 => Err(rate_limited().with_retry_after(secs(2.0))),
        1 => Err(server_error()),
        _ => Err(seawall_core::LlmError::new(
            FailureClass::Authentication,
            "bad key",
        )),
    });
    tracing::subscriber::with_default(capture.clone(), || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let mut svc = BackoffRetryLayer::builder()
                .seed(1)
                .hint_jitter(0.0)
                .build()
                .unwrap()
                .layer(mock.clone());
            let _ = ServiceExt::<Ask>::ready(&mut svc)
                .await
                .unwrap()
                .call(Ask::default())
                .await;
        });
    });
    let events = capture.0.lock().unwrap();
    let retries: Vec<&Fields> = events
        .iter()
        .filter(|(target, f)| {
            target == "seawall::retry"
                && f.get("message").is_some_and(|m| m.starts_with("retrying"))
        })
        .map(|(_, f)| f)
        .collect();
    assert_eq!(retries.len(), 2, "{events:?}");
    assert_eq!(retries[0]["attempt"], "1");
    assert_eq!(retries[0]["class"], "rate_limited");
    assert_eq!(retries[0]["status"], "429");
    assert_eq!(retries[0]["delay_ms"], "2000");
    assert_eq!(retries[0]["reason"], "server_hint");
    assert_eq!(retries[1]["attempt"], "2");
    assert_eq!(retries[1]["class"], "server_error");
    assert_eq!(retries[1]["status"], "500");
    assert_eq!(retries[1]["reason"], "backoff");
    assert!(retries[1]["delay_ms"].parse::<u64>().unwrap() <= 1000);
    // And the give-up is reported too.
    assert!(events.iter().any(|(_, f)| {
        f.get("message").is_some_and(|m| m.starts_with("giving up"))
            && f.get("reason").map(String::as_str) == Some("not_retryable")
    }));
}
