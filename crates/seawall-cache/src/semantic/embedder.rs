//! The [`Embedder`] trait, which maps a prompt's text to a vector, and [`OpenAiEmbedder`],
//! which asks an OpenAI-compatible `POST /embeddings` endpoint through a seawall stack.
//!
//! The trait is object-safe with boxed `'static` futures, like [`CacheStore`](crate::CacheStore),
//! so the layer holds an `Arc<dyn Embedder>` whatever computes the vectors (a remote API, a
//! local model). An embedder that fails is never the caller's problem: the layer treats the
//! call as a plain miss.
//!
//! [`OpenAiEmbedder`] takes the same kind of service the rest of the stack is built of
//! (`Service<http::Request<Bytes>, Error = LlmError>`), so embedding calls go through retry,
//! gate and breaker like any other call, and it checks what comes back: a wrong shape, a value
//! that is not a finite `f32`, a zero vector or a wrong dimension is an [`EmbedError`], never a
//! vector the index would trust, and never a panic.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, Uri};
use http_body::Body;
use seawall_core::LlmError;
use tower_service::Service;

/// The future of an embedding.
pub type EmbedFuture = Pin<Box<dyn Future<Output = Result<Vec<f32>, EmbedError>> + Send + 'static>>;

/// Maps a prompt's text to a vector, for the semantic cache.
///
/// Prompts close in meaning must get vectors close in cosine similarity; the vectors of one
/// embedder must all have one dimension. The cache normalises them itself.
///
/// ```
/// use seawall_cache::{EmbedError, EmbedFuture, Embedder};
///
/// /// Counts letters: a toy, but a deterministic one.
/// struct Letters;
///
/// impl Embedder for Letters {
///     fn embed(&self, text: &str) -> EmbedFuture {
///         let mut v = vec![0.0f32; 26];
///         for b in text.bytes().filter(u8::is_ascii_alphabetic) {
///             v[usize::from(b.to_ascii_lowercase() - b'a')] += 1.0;
///         }
///         Box::pin(std::future::ready(Ok(v)))
///     }
/// }
/// ```
pub trait Embedder: Send + Sync + 'static {
    /// The vector of `text`.
    fn embed(&self, text: &str) -> EmbedFuture;
}

impl<T: Embedder + ?Sized> Embedder for Arc<T> {
    fn embed(&self, text: &str) -> EmbedFuture {
        (**self).embed(text)
    }
}

/// Why an embedding failed. Its messages never hold credentials.
#[derive(Debug)]
#[non_exhaustive]
pub enum EmbedError {
    /// The call failed: the stack's error (after its retries).
    Call(LlmError),
    /// The endpoint answered with another status than 2xx (a stack without a classifier).
    Status(StatusCode),
    /// The answer's body could not be read to its end, or is too large.
    Read(Arc<str>),
    /// The answer is not a usable embedding: not the expected JSON shape, a value that is not
    /// a finite `f32`, a zero vector, or a wrong dimension.
    BadAnswer(Arc<str>),
}

impl EmbedError {
    /// A bad answer, saying `what` is wrong with it.
    pub fn bad_answer(what: impl AsRef<str>) -> Self {
        EmbedError::BadAnswer(Arc::from(seawall_core::redact(what.as_ref()).as_ref()))
    }

    fn read(what: impl AsRef<str>) -> Self {
        EmbedError::Read(Arc::from(seawall_core::redact(what.as_ref()).as_ref()))
    }
}

impl std::fmt::Display for EmbedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EmbedError::Call(e) => write!(f, "embedding call failed: {e}"),
            EmbedError::Status(s) => write!(f, "embeddings endpoint answered {s}"),
            EmbedError::Read(m) => write!(f, "embeddings answer unreadable: {m}"),
            EmbedError::BadAnswer(m) => write!(f, "bad embeddings answer: {m}"),
        }
    }
}

impl std::error::Error for EmbedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            EmbedError::Call(e) => Some(e),
            _ => None,
        }
    }
}

/// The largest embeddings answer read: a 3,072-dimension vector in JSON is about 70 KB.
const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;

/// Embeds through an OpenAI-compatible `POST /embeddings` endpoint (`{"model", "input"}` in,
/// `data[0].embedding` out), sent through `service`: a seawall stack, so the calls are
/// retried, gated and broken like the others.
///
/// The request goes to the relative URI `/embeddings` by default, which a transport with an
/// upstream base URL (`https://api.openai.com/v1`) joins onto it and adds the key to, as it
/// does for `/chat/completions`; [`uri`](Self::uri) sends it elsewhere.
///
/// ```
/// use seawall_cache::{CacheLayer, MemoryStore, OpenAiEmbedder};
/// # fn run() -> Result<(), seawall_core::ConfigError> {
/// // `embeddings`: e.g. retry → breaker → gate → classify → HttpTransport, built like the
/// // chat stack (a service of its own, so its failures do not count against the chat's).
/// // Here a stand-in that answers every call with an empty body.
/// let embeddings = tower::service_fn(|_req: http::Request<bytes::Bytes>| async {
///     Ok::<_, seawall_core::LlmError>(http::Response::new(String::new()))
/// });
/// let layer = CacheLayer::builder(MemoryStore::new())
///     .semantic(OpenAiEmbedder::new(embeddings, "text-embedding-3-small").dimensions(512))
///     .build()?;
/// # let _ = layer; Ok(()) }
/// ```
#[derive(Clone)]
pub struct OpenAiEmbedder<S> {
    service: S,
    uri: Uri,
    model: Arc<str>,
    dimensions: Option<usize>,
    ask_dimensions: bool,
}

impl<S> std::fmt::Debug for OpenAiEmbedder<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiEmbedder")
            .field("uri", &seawall_core::redact(&self.uri.to_string()))
            .field("model", &self.model)
            .field("dimensions", &self.dimensions)
            .finish_non_exhaustive()
    }
}

impl<S> OpenAiEmbedder<S> {
    /// Embeds with `model`, through `service`, at `/embeddings`.
    pub fn new(service: S, model: impl AsRef<str>) -> Self {
        OpenAiEmbedder {
            service,
            uri: Uri::from_static("/embeddings"),
            model: Arc::from(model.as_ref()),
            dimensions: None,
            ask_dimensions: false,
        }
    }

    /// Sends the requests to `uri` (relative to the transport's base URL, or absolute).
    pub fn uri(mut self, uri: Uri) -> Self {
        self.uri = uri;
        self
    }

    /// Asks for vectors of `n` dimensions (the `dimensions` parameter of the
    /// `text-embedding-3` models) and refuses answers of another length.
    pub fn dimensions(mut self, n: usize) -> Self {
        self.dimensions = Some(n);
        self.ask_dimensions = true;
        self
    }

    /// Refuses answers whose length is not `n`, without asking for it (for models without
    /// the `dimensions` parameter).
    pub fn expect_dimensions(mut self, n: usize) -> Self {
        self.dimensions = Some(n);
        self.ask_dimensions = false;
        self
    }

    /// The service the requests go through.
    pub fn get_ref(&self) -> &S {
        &self.service
    }
}

#[derive(serde::Serialize)]
struct EmbeddingsRequest<'a> {
    model: &'a str,
    input: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    dimensions: Option<usize>,
}

impl<S, B> Embedder for OpenAiEmbedder<S>
where
    S: Service<Request<Bytes>, Response = Response<B>, Error = LlmError>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: std::fmt::Display,
{
    fn embed(&self, text: &str) -> EmbedFuture {
        let body = serde_json::to_vec(&EmbeddingsRequest {
            model: &self.model,
            input: text,
            dimensions: self.dimensions.filter(|_| self.ask_dimensions),
        })
        .map(Bytes::from);
        let mut req = Request::new(body.unwrap_or_default());
        *req.method_mut() = http::Method::POST;
        *req.uri_mut() = self.uri.clone();
        req.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        let mut svc = self.service.clone();
        let expected = self.dimensions;
        Box::pin(async move {
            std::future::poll_fn(|cx| svc.poll_ready(cx))
                .await
                .map_err(EmbedError::Call)?;
            let resp = svc.call(req).await.map_err(EmbedError::Call)?;
            if !resp.status().is_success() {
                return Err(EmbedError::Status(resp.status()));
            }
            let bytes = read(resp.into_body()).await?;
            parse(&bytes, expected)
        })
    }
}

/// Reads a body to its end, up to [`MAX_ANSWER_BYTES`].
async fn read<B>(body: B) -> Result<Vec<u8>, EmbedError>
where
    B: Body<Data = Bytes>,
    B::Error: std::fmt::Display,
{
    let mut body = std::pin::pin!(body);
    let mut out = Vec::new();
    while let Some(frame) = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        let frame = frame.map_err(|e| EmbedError::read(e.to_string()))?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > MAX_ANSWER_BYTES {
                return Err(EmbedError::read(format!(
                    "larger than {MAX_ANSWER_BYTES} bytes"
                )));
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out)
}

#[derive(serde::Deserialize)]
struct List {
    data: Vec<Item>,
}

#[derive(serde::Deserialize)]
struct Item {
    embedding: Vec<f64>,
}

/// The vector of an embeddings answer, checked.
pub(crate) fn parse(body: &[u8], expected: Option<usize>) -> Result<Vec<f32>, EmbedError> {
    let list: List = serde_json::from_slice(body).map_err(|e| {
        EmbedError::bad_answer(format!(
            "not a list of embeddings (`data[0].embedding`, an array of numbers): {e}"
        ))
    })?;
    let Some(item) = list.data.into_iter().next() else {
        return Err(EmbedError::bad_answer("`data` is empty"));
    };
    let vector: Vec<f32> = item.embedding.iter().map(|&x| x as f32).collect();
    if vector.is_empty() {
        return Err(EmbedError::bad_answer("the embedding is empty"));
    }
    if let Some(i) = vector.iter().position(|x| !x.is_finite()) {
        return Err(EmbedError::bad_answer(format!(
            "value {i} of the embedding ({}) is not a finite f32",
            item.embedding[i]
        )));
    }
    if let Some(n) = expected {
        if vector.len() != n {
            return Err(EmbedError::bad_answer(format!(
                "the embedding has {} dimensions, {n} expected",
                vector.len()
            )));
        }
    }
    if vector.iter().all(|&x| x == 0.0) {
        return Err(EmbedError::bad_answer("the embedding is the zero vector"));
    }
    Ok(vector)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bad(body: &str, expected: Option<usize>) -> String {
        match parse(body.as_bytes(), expected) {
            Err(e @ EmbedError::BadAnswer(_)) => e.to_string(),
            other => panic!("{body}: {other:?}"),
        }
    }

    #[test]
    fn an_answer_of_the_right_shape_gives_its_first_vector() {
        let v = parse(
            br#"{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5,-1,2e-3]}],"model":"e"}"#,
            Some(3),
        )
        .unwrap();
        assert_eq!(v, vec![0.5, -1.0, 0.002]);
    }

    #[test]
    fn every_bad_shape_is_a_clear_error() {
        assert!(bad("<html>", None).contains("not a list of embeddings"));
        assert!(bad(r#"{"data":{}}"#, None).contains("not a list"));
        assert!(bad(r#"{"data":[{"embedding":"AAAA"}]}"#, None).contains("not a list"));
        assert!(bad(r#"{"data":[{"embedding":[1,"x"]}]}"#, None).contains("not a list"));
        assert!(bad(r#"{"data":[{"embedding":[NaN]}]}"#, None).contains("not a list"));
        assert!(bad(r#"{"data":[]}"#, None).contains("`data` is empty"));
        assert!(bad(r#"{"data":[{"embedding":[]}]}"#, None).contains("empty"));
        assert!(bad(r#"{"data":[{"embedding":[1e39,1]}]}"#, None).contains("not a finite f32"));
        assert!(bad(r#"{"data":[{"embedding":[0,0]}]}"#, None).contains("zero vector"));
        assert!(bad(r#"{"data":[{"embedding":[1,2]}]}"#, Some(3)).contains("2 dimensions, 3"));
    }
}
