//! The layer with a user's own typed request and response (no HTTP), cache included.

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::Extensions;
use seawall_core::{FailureClass, LlmError, LlmRequest, LlmResponse, OnComplete, ServedBy, Usage};
use seawall_fallback::{FallbackLayer, LastResort, Replay, RequestKey, ResponseCache, Target};
use tower::{Layer, ServiceExt};

#[derive(Clone, Hash)]
struct Ask {
    model: String,
    prompt: String,
}

impl LlmRequest for Ask {
    fn model(&self) -> Option<&str> {
        Some(&self.model)
    }
    fn max_output_tokens(&self) -> Option<u32> {
        None
    }
    fn estimated_input_tokens(&self) -> u32 {
        0
    }
    fn set_model(&mut self, model: &str) -> Result<(), LlmError> {
        model.clone_into(&mut self.model);
        Ok(())
    }
}

impl RequestKey for Ask {
    fn cache_key<H: Hasher>(&self, state: &mut H) -> bool {
        self.hash(state);
        true
    }
}

/// A fully-read answer that carries extensions, so it can be marked.
#[derive(Clone, Debug)]
struct Answer {
    text: String,
    ext: Extensions,
}

impl LlmResponse for Answer {
    type Hooked<G: OnComplete> = Answer;
    fn usage(&self) -> Option<Usage> {
        None
    }
    fn extensions(&self) -> Option<&Extensions> {
        Some(&self.ext)
    }
    fn extensions_mut(&mut self) -> Option<&mut Extensions> {
        Some(&mut self.ext)
    }
    fn on_complete<G: OnComplete>(self, hook: G) -> Answer {
        seawall_test_support::complete_now(hook);
        self
    }
}

impl Replay for Answer {
    type Snapshot = String;
    async fn capture(self, max_bytes: usize) -> (Self, Option<String>) {
        let snap = (self.text.len() <= max_bytes).then(|| self.text.clone());
        (self, snap)
    }
    fn replay(text: &String) -> Self {
        Answer {
            text: text.clone(),
            ext: Extensions::new(),
        }
    }
    fn snapshot_len(text: &String) -> usize {
        text.len()
    }
}

#[tokio::test(start_paused = true)]
async fn typed_requests_switch_models_and_typed_answers_are_cached_and_marked() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let upstream = tower::service_fn(move |ask: Ask| {
        let n = counter.fetch_add(1, Ordering::SeqCst);
        async move {
            match (n, ask.model.as_str()) {
                (0, _) => Ok(Answer {
                    text: format!("{} from {}", ask.prompt, ask.model),
                    ext: Extensions::new(),
                }),
                (_, "small") => Ok(Answer {
                    text: format!("{} from small", ask.prompt),
                    ext: Extensions::new(),
                }),
                _ => Err(LlmError::new(FailureClass::Overloaded, "busy")),
            }
        }
    });
    let layer = FallbackLayer::builder()
        .target(Target::model("small"))
        .cache(ResponseCache::new(Duration::from_secs(60)))
        .build()
        .unwrap();
    let svc = layer.layer(upstream);
    let ask = |prompt: &str| Ask {
        model: "big".into(),
        prompt: prompt.into(),
    };

    let first = svc.clone().oneshot(ask("q")).await.unwrap();
    assert_eq!(first.text, "q from big");
    assert_eq!(
        first.ext.get::<ServedBy>().unwrap().model.as_deref(),
        Some("big")
    );

    let second = svc.clone().oneshot(ask("q")).await.unwrap();
    assert_eq!(second.text, "q from small");
    assert_eq!(&*second.ext.get::<ServedBy>().unwrap().target, "small");
    // The small model's answer is now the last good one for this request.
    assert_eq!(layer.cache_usage(), (1, "q from small".len()));

    let no_small = FallbackLayer::builder()
        .cache(ResponseCache::new(Duration::from_secs(60)))
        .build()
        .unwrap();
    let only_big = no_small.layer(tower::service_fn(|ask: Ask| async move {
        match ask.prompt.as_str() {
            "warm" => Ok(Answer {
                text: "warm answer".into(),
                ext: Extensions::new(),
            }),
            _ => Err(LlmError::new(FailureClass::CircuitOpen, "open")),
        }
    }));
    let warm = only_big.clone().oneshot(ask("warm")).await.unwrap();
    assert_eq!(warm.text, "warm answer");
    let cold = only_big.oneshot(ask("cold")).await.unwrap_err();
    assert_eq!(cold.class(), FailureClass::CircuitOpen);
    assert!(matches!(
        no_small.cache_usage(),
        (1, n) if n == "warm answer".len()
    ));
}

#[tokio::test]
async fn a_typed_cached_answer_is_marked_degraded() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let upstream = tower::service_fn(move |_: Ask| {
        let n = counter.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                Ok(Answer {
                    text: "fresh".into(),
                    ext: Extensions::new(),
                })
            } else {
                Err(LlmError::new(FailureClass::QuotaExhausted, "quota"))
            }
        }
    });
    let layer = FallbackLayer::builder()
        .cache(ResponseCache::new(Duration::from_secs(60)))
        .build()
        .unwrap();
    let svc = layer.layer(upstream);
    let ask = Ask {
        model: "m".into(),
        prompt: "p".into(),
    };
    svc.clone().oneshot(ask.clone()).await.unwrap();
    let cached = svc.oneshot(ask).await.unwrap();
    assert_eq!(cached.text, "fresh");
    assert!(cached.ext.get::<ServedBy>().unwrap().degraded);
    assert!(matches!(
        cached.ext.get::<LastResort>(),
        Some(LastResort::Cached { .. })
    ));
}
