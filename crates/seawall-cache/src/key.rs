//! The cache key: a SHA-256 digest of everything that determines an answer, and nothing
//! else.
//!
//! Two requests get the same key exactly when they ask the same thing of the same upstream:
//! the method, the path and query (which carry the API, and for Azure the deployment), the
//! API-version headers, the partition (the tenant, unless configured to share), and the JSON
//! body in a canonical form: objects with their members sorted, whitespace gone, numbers
//! compared by value (`1`, `1.0` and `1e0` are one number), with the top-level `stream` and
//! `stream_options` left out, since a streamed request can be served from a non-streamed
//! answer and back.
//!
//! Why SHA-256 (the `sha2` crate, RustCrypto's, pure Rust, using the CPU's SHA extensions
//! where it has them): a collision would serve one request's answer to another, possibly
//! another tenant's, so collisions must be infeasible to find, not just unlikely: a 64-bit
//! hash is not enough, a fast non-cryptographic one can be attacked. BLAKE3 would be as safe
//! and faster on long inputs, but requests are a few hundred bytes to a few kilobytes, where
//! SHA-256 with the SHA extensions costs about 0.6 µs per kilobyte (the bench's
//! `sha256_of_300_bytes`: 0.19 µs), and `sha2` builds without a C compiler.
//!
//! What is hashed is kept short, since SHA-256 costs by the 64-byte block: each value is a
//! one-byte tag and, for a string or an integer, its length or value as LEB128 (one byte
//! below 128), so a short request's key takes a block or more fewer than with fixed
//! eight-byte lengths; and the names requests repeat (`messages`, `role`, `content`, ...)
//! are one byte each (`words`). The encoding is prefix-free, so two different bodies never
//! write the same bytes. The digest starts with a domain that names the encoding's version
//! (`seawall-cache/4`): replicas of two releases with different encodings that share a Redis
//! store only miss each other's entries (which expire by their time to live), never
//! mistake one request for another.
//!
//! The head (the domain, method, path, host, partition and versioned headers) comes first,
//! padded with zeros to a whole block. It is the same for every request of one route and
//! tenant, so each thread keeps the hasher's state after the last few heads it hashed, and a
//! request whose head it has seen hashes its body alone: the bench's small request takes
//! three blocks instead of four.
//!
//! Why no JSON tree: building a `serde_json::Value` costs an allocation per string, array
//! and object, on every call, hits included. The canonical form is written in one pass into a
//! reused per-thread buffer: each object's members are written as they come, then put in
//! order when the object closes (a copy of that object's bytes, only when they came out of
//! order). The pass is a plain scanner over the bytes (`fast`), which hands any body it is
//! not sure to read exactly as `serde_json` does to the general path, a serde visitor writing
//! the same form; a test holds the two to the same bytes on generated bodies. A request with a
//! normalisation hook does build the tree, since the hook edits it.
//!
//! The same pass reads the few fields the cache's policy needs (`temperature`, `n`,
//! `best_of`, `stream`, `stream_options.include_usage`), so a hit parses the body once.

use std::cell::RefCell;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::Request;
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use sha2::{Digest, Sha256};

pub(crate) mod fast;
mod words;

/// The deepest nesting of arrays and objects read; deeper bodies are not cached (`serde_json`
/// stops at 128 too).
const MAX_DEPTH: u32 = 128;

/// Scratch buffers above this size are given back after use, so one huge request does not
/// pin its memory to a thread for good.
const KEEP_SCRATCH: usize = 256 * 1024;

/// 2^64, exactly: every integral float below it in magnitude is an `i128` exactly.
const TWO_TO_THE_64: f64 = (1u128 << 64) as f64;

/// Headers whose values change the answer, hashed into the key.
pub(crate) const KEY_HEADERS: [http::HeaderName; 2] = [
    http::HeaderName::from_static("anthropic-version"),
    http::HeaderName::from_static("anthropic-beta"),
];

/// A request's cache key: a SHA-256 digest. `Debug` and `Display` show its first 8 bytes in
/// hex, enough to tell entries apart in a log.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct CacheKey([u8; 32]);

impl CacheKey {
    /// A key from its 32 bytes (as a store kept them).
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        CacheKey(bytes)
    }

    /// The digest's 32 bytes.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The hash a table files the key under: 8 of the digest's bytes, as uniform as any hash.
    pub(crate) fn table_hash(&self) -> u64 {
        let mut first = [0; 8];
        first.copy_from_slice(&self.0[..8]);
        u64::from_le_bytes(first)
    }

    /// The digest in lowercase hex (64 characters), for a store that keys by text.
    pub fn to_hex(&self) -> String {
        let mut s = String::with_capacity(64);
        for b in self.0 {
            use fmt::Write;
            let _ = write!(s, "{b:02x}");
        }
        s
    }
}

impl std::hash::Hash for CacheKey {
    // The key is already a uniform digest: 8 of its bytes are as good a hash as any.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.table_hash());
    }
}

impl fmt::Debug for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CacheKey({self})")
    }
}

impl fmt::Display for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// A hasher for maps keyed by [`CacheKey`]: takes the 8 bytes its `Hash` writes as they are.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// The `BuildHasher` of maps keyed by [`CacheKey`].
pub(crate) type KeyHash = std::hash::BuildHasherDefault<KeyHasher>;

/// A normalisation hook: edits a request body before it is keyed, to strip what varies but
/// does not change the answer (a request id or a timestamp in the prompt). Only the key sees
/// the edit; the request goes upstream as it came.
pub type Normalize = Arc<dyn Fn(&mut serde_json::Value) + Send + Sync>;

/// What keying a request body learned about it on the way.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BodyFacts {
    /// The top-level `temperature`, if it is a number.
    pub temperature: Option<f64>,
    /// `"stream": true`.
    pub stream: bool,
    /// `"stream_options": {"include_usage": true}`.
    pub include_usage: bool,
    /// The larger of `n` and `best_of` (1 when neither is set).
    pub choices: u64,
}

/// Why a request has no key (and so bypasses the cache).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unkeyable {
    /// The body is larger than the configured limit.
    TooLarge,
    /// The body is not JSON, not a JSON object, or nested deeper than 128 levels.
    NotJson,
}

impl fmt::Display for Unkeyable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Unkeyable::TooLarge => "request body larger than the cache's limit",
            Unkeyable::NotJson => "request body is not a JSON object (or too deeply nested)",
        })
    }
}

impl std::error::Error for Unkeyable {}

/// Derives cache keys. Cheap to clone; holds the optional normalisation hook and the body
/// limit.
///
/// ```
/// use bytes::Bytes;
/// use seawall_cache::KeyDeriver;
///
/// let req = |body: &'static str| {
///     http::Request::post("/v1/chat/completions").body(Bytes::from_static(body.as_bytes())).unwrap()
/// };
/// let keys = KeyDeriver::new();
/// let (a, _) = keys.key(&req(r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#), None)?;
/// let (b, facts) = keys.key(
///     &req(r#"{ "stream": true, "messages": [ {"content": "hi", "role": "user"} ], "model": "m" }"#),
///     None,
/// )?;
/// assert_eq!(a, b);
/// assert!(facts.stream);
/// # Ok::<(), seawall_cache::Unkeyable>(())
/// ```
#[derive(Clone)]
pub struct KeyDeriver {
    normalize: Option<Normalize>,
    max_body: usize,
}

impl fmt::Debug for KeyDeriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyDeriver")
            .field("normalize", &self.normalize.is_some())
            .field("max_body", &self.max_body)
            .finish()
    }
}

impl Default for KeyDeriver {
    fn default() -> Self {
        KeyDeriver::new()
    }
}

impl KeyDeriver {
    /// The default limit on the request bodies keyed: 1 MiB.
    pub const DEFAULT_MAX_BODY: usize = 1024 * 1024;

    /// A deriver without a normalisation hook, keying bodies up to 1 MiB.
    pub fn new() -> Self {
        KeyDeriver {
            normalize: None,
            max_body: Self::DEFAULT_MAX_BODY,
        }
    }

    /// Runs `hook` on each body (as a JSON tree) before keying it.
    pub fn with_normalize(mut self, hook: Normalize) -> Self {
        self.normalize = Some(hook);
        self
    }

    /// Keys bodies up to `bytes`; a larger one is [`Unkeyable::TooLarge`].
    pub fn with_max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

    /// The largest body keyed.
    pub fn max_body(&self) -> usize {
        self.max_body
    }

    /// The key of `req` within `partition` (a tenant's bytes, only hashed; `None` shares
    /// across tenants), and the
    /// facts read from its body on the way.
    pub fn key(
        &self,
        req: &Request<Bytes>,
        partition: Option<&[u8]>,
    ) -> Result<(CacheKey, BodyFacts), Unkeyable> {
        self.key_of(req, partition, true)
    }

    /// As [`key`](Self::key); the headers the key covers are read only when `keyed` (one is
    /// present).
    pub(crate) fn key_of(
        &self,
        req: &Request<Bytes>,
        partition: Option<&[u8]>,
        keyed: bool,
    ) -> Result<(CacheKey, BodyFacts), Unkeyable> {
        let body = req.body();
        if body.len() > self.max_body {
            return Err(Unkeyable::TooLarge);
        }
        with_scratch(|canon| {
            match &self.normalize {
                None => {
                    if fast::canonical(body, canon).is_none() {
                        // Not sure (or not JSON): the general path decides.
                        canon.reset();
                        general(body, canon)?;
                    }
                }
                Some(hook) => {
                    let mut tree: serde_json::Value =
                        serde_json::from_slice(body).map_err(|_| Unkeyable::NotJson)?;
                    hook(&mut tree);
                    Node::top(canon)
                        .deserialize(&tree)
                        .map_err(|_| Unkeyable::NotJson)?;
                }
            }
            if !canon.object {
                return Err(Unkeyable::NotJson);
            }
            let mut facts = canon.facts;
            facts.choices = facts.choices.max(1);
            let key = digest(b"seawall-cache/4\0", req, partition, keyed, canon);
            Ok((key, facts))
        })
    }

    /// The key of `req`'s *context*: its key computed after `strip` took the prompt's text out
    /// of its (normalised) body, in a domain of its own (a context key never equals a
    /// request's key). Two requests have the same context key when they differ at most in
    /// the text `strip` took (the semantic cache searches among those).
    pub(crate) fn context_key(
        &self,
        req: &Request<Bytes>,
        partition: Option<&[u8]>,
        strip: impl FnOnce(&mut serde_json::Value),
    ) -> Result<CacheKey, Unkeyable> {
        let body = req.body();
        if body.len() > self.max_body {
            return Err(Unkeyable::TooLarge);
        }
        let mut tree: serde_json::Value =
            serde_json::from_slice(body).map_err(|_| Unkeyable::NotJson)?;
        if let Some(hook) = &self.normalize {
            hook(&mut tree);
        }
        strip(&mut tree);
        with_scratch(|canon| {
            Node::top(canon)
                .deserialize(&tree)
                .map_err(|_| Unkeyable::NotJson)?;
            if !canon.object {
                return Err(Unkeyable::NotJson);
            }
            Ok(digest(
                b"seawall-cache/context/4\0",
                req,
                partition,
                true,
                canon,
            ))
        })
    }
}

/// The digest of a request's head, its partition and its canonical body, in `domain`.
fn digest(
    domain: &[u8],
    req: &Request<Bytes>,
    partition: Option<&[u8]>,
    keyed: bool,
    canon: &mut Canon,
) -> CacheKey {
    // The head is written out and hashed in one piece: each small `update` of the hasher
    // costs more than the bytes it hashes.
    let head = &mut canon.tmp;
    head.clear();
    head.extend_from_slice(domain);
    put_field(head, req.method().as_str().as_bytes());
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
    put_field(head, path.as_bytes());
    put_field(
        head,
        req.uri().authority().map_or("", |a| a.as_str()).as_bytes(),
    );
    match partition {
        Some(p) => {
            head.push(1);
            put_field(head, p);
        }
        None => head.push(0),
    }
    if keyed {
        for name in &KEY_HEADERS {
            for value in req.headers().get_all(name) {
                put_field(head, name.as_str().as_bytes());
                put_field(head, value.as_bytes());
            }
        }
    }
    head.push(0xff);
    // Zeros up to the block's end: the head then fills whole blocks, and the hasher's state
    // after them is the same for every request of one route and tenant. (The head's own bytes
    // say where it ends, so the padding cannot be taken for a body.)
    head.resize(head.len().next_multiple_of(BLOCK), 0);
    let mut h = canon.heads.after(head);
    h.update(&canon.buf);
    CacheKey(h.finalize().into())
}

/// SHA-256's block, in bytes.
const BLOCK: usize = 64;

/// The hasher's state after the heads hashed last on this thread, so a request of a route
/// and tenant seen lately hashes its body alone. A few heads are kept, for a thread serving
/// several tenants or routes in turn; a head longer than four blocks (a long partition) is
/// hashed each time.
#[derive(Default)]
struct Heads {
    kept: Vec<(Vec<u8>, Sha256)>,
    /// The slot the next new head replaces, once all are taken.
    next: usize,
}

impl Heads {
    const KEPT: usize = 4;

    /// A hasher that has hashed `head` (whole blocks).
    fn after(&mut self, head: &[u8]) -> Sha256 {
        if let Some((_, state)) = self.kept.iter().find(|(h, _)| h == head) {
            return state.clone();
        }
        let mut state = Sha256::new();
        state.update(head);
        if head.len() <= 4 * BLOCK {
            if self.kept.len() < Self::KEPT {
                self.kept.push((head.to_vec(), state.clone()));
            } else {
                let (h, s) = &mut self.kept[self.next];
                h.clear();
                h.extend_from_slice(head);
                *s = state.clone();
                self.next = (self.next + 1) % Self::KEPT;
            }
        }
        state
    }
}

/// The canonical form of `body` through serde's visitor: the reference the fast path must
/// agree with, and what decides every body the fast path is not sure of.
fn general(body: &[u8], canon: &mut Canon) -> Result<(), Unkeyable> {
    let mut de = serde_json::Deserializer::from_slice(body);
    Node::top(canon)
        .deserialize(&mut de)
        .and_then(|()| de.end())
        .map_err(|_| Unkeyable::NotJson)
}

/// Appends `bytes` after their length.
pub(crate) fn put_field(buf: &mut Vec<u8>, bytes: &[u8]) {
    leb128(bytes.len() as u64, |b| buf.push(b));
    buf.extend_from_slice(bytes);
}

/// Gives `n` out as LEB128, byte by byte: seven bits a byte, low bits first, the top bit set
/// on every byte but the last. A length below 128 (most strings' in a request) takes one
/// byte, not eight, and SHA-256 costs by the 64-byte block of its input.
pub(crate) fn leb128(mut n: u64, mut put: impl FnMut(u8)) {
    while n >= 0x80 {
        put(n as u8 | 0x80);
        n >>= 7;
    }
    put(n as u8);
}

/// How many bytes [`leb128`] gives for `n`.
pub(crate) fn leb128_len(n: u64) -> usize {
    (64 - (n | 1).leading_zeros() as usize).div_ceil(7)
}

thread_local! {
    static SCRATCH: RefCell<Canon> = RefCell::new(Canon::default());
}

fn with_scratch<T>(f: impl FnOnce(&mut Canon) -> T) -> T {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut canon) => {
            canon.reset();
            let out = f(&mut canon);
            canon.trim();
            out
        }
        // Re-entered (a normalisation hook that keys a request itself): a fresh buffer.
        Err(_) => f(&mut Canon::default()),
    })
}

/// The canonical form being written, and the scratch space for putting members in order.
#[derive(Default)]
struct Canon {
    buf: Vec<u8>,
    /// The members of the objects still open, innermost last.
    members: Vec<Member>,
    /// Scratch: an object's bytes while its members are put in order, then the request's
    /// head while the digest is taken.
    tmp: Vec<u8>,
    /// The last number written (for `temperature`).
    number: Option<f64>,
    /// The hasher's state after recent heads (kept across keys, unlike the rest).
    heads: Heads,
    facts: BodyFacts,
    /// The top-level value is an object.
    object: bool,
}

/// One object member in `buf`: its key from `start` to `key_end`, its value up to `end`.
#[derive(Clone, Copy)]
struct Member {
    start: usize,
    key_end: usize,
    end: usize,
}

impl Canon {
    fn reset(&mut self) {
        self.buf.clear();
        self.members.clear();
        self.number = None;
        self.facts = BodyFacts::default();
        self.object = false;
    }

    fn trim(&mut self) {
        for v in [&mut self.buf, &mut self.tmp] {
            if v.capacity() > KEEP_SCRATCH {
                *v = Vec::new();
            }
        }
        if self.members.capacity() > KEEP_SCRATCH / 16 {
            self.members = Vec::new();
        }
    }

    fn int(&mut self, v: i128) {
        // Most numbers fit 64 bits, written in as few bytes as they need (zigzag, then
        // LEB128); the tag says which form follows.
        match i64::try_from(v) {
            Ok(small) => {
                self.buf.push(b'i');
                let zigzag = ((small << 1) ^ (small >> 63)) as u64;
                leb128(zigzag, |b| self.buf.push(b));
                // From 64 bits, one instruction; from 128, a library call.
                self.number = Some(small as f64);
            }
            Err(_) => {
                self.buf.push(b'I');
                self.buf.extend_from_slice(&v.to_le_bytes());
                self.number = Some(v as f64);
            }
        }
    }

    fn float(&mut self, v: f64) {
        // An integral value is one number whichever way it was written (`1`, `1.0`, `1e0`),
        // over the whole range an integer is read in (serde reads integers up to `u64::MAX`
        // exactly, and larger ones as floats): `2^62` and `2^62.0` are one number too.
        if v.is_finite() && v.fract() == 0.0 && v.abs() < TWO_TO_THE_64 {
            self.int(v as i128);
        } else {
            self.buf.push(b'd');
            self.buf.extend_from_slice(&v.to_bits().to_le_bytes());
            self.number = Some(v);
        }
    }

    /// Reads the fact a top-level member's value gives, once the value is written.
    fn fact(&mut self, field: Field) {
        match field {
            Field::Temperature => self.facts.temperature = self.number,
            Field::Choices => {
                let n = self.number.unwrap_or(1.0);
                let n = if n >= 1.0 {
                    n.min(u64::MAX as f64) as u64
                } else {
                    1
                };
                self.facts.choices = self.facts.choices.max(n);
            }
            _ => {}
        }
    }

    /// Writes a string: one of the common [`words`] as its one byte, any other as its tag,
    /// length and text.
    fn str(&mut self, v: &str) {
        match words::word(v.as_bytes()) {
            Some(word) => self.buf.push(word),
            None => {
                self.buf.push(b's');
                put_field(&mut self.buf, v.as_bytes());
            }
        }
    }

    /// Puts the members written since `base` (of the object whose `{` ends at `start`) in
    /// key order.
    fn close_object(&mut self, start: usize, base: usize) {
        let Canon {
            buf, members, tmp, ..
        } = self;
        let list = &mut members[base..];
        let order =
            |a: &Member, b: &Member| key_order(&buf[a.start..a.key_end], &buf[b.start..b.key_end]);
        if !list.windows(2).all(|w| order(&w[0], &w[1]).is_le()) {
            list.sort_by(order);
            tmp.clear();
            tmp.extend_from_slice(&buf[start..]);
            buf.truncate(start);
            for m in list.iter() {
                buf.extend_from_slice(&tmp[m.start - start..m.end - start]);
            }
        }
        members.truncate(base);
        buf.push(b'}');
    }
}

/// The order of two written keys: their bytes' order, decided by the first (a word's one
/// byte, or a string's tag) or the second (below 128, a string's length) without a call to
/// compare the rest when they differ, as most keys' do.
fn key_order(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    match (a.first(), b.first()) {
        (Some(x), Some(y)) if x != y => x.cmp(y),
        _ => match (a.get(1), b.get(1)) {
            (Some(x), Some(y)) if x != y => x.cmp(y),
            _ => a.cmp(b),
        },
    }
}

/// A JSON value to write in canonical form.
struct Node<'c> {
    canon: &'c mut Canon,
    depth: u32,
}

impl<'c> Node<'c> {
    fn top(canon: &'c mut Canon) -> Self {
        Node { canon, depth: 0 }
    }

    fn child(&mut self) -> Result<Node<'_>, ()> {
        if self.depth >= MAX_DEPTH {
            return Err(());
        }
        Ok(Node {
            canon: self.canon,
            depth: self.depth + 1,
        })
    }
}

impl<'de> DeserializeSeed<'de> for Node<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

/// What the top-level key being read is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Field {
    /// Left out of the key (`stream`, `stream_options`), but read.
    Stream,
    StreamOptions,
    Temperature,
    Choices,
    Other,
}

impl Field {
    const STREAM: u8 = words::token("stream");
    const STREAM_OPTIONS: u8 = words::token("stream_options");
    const TEMPERATURE: u8 = words::token("temperature");
    const N: u8 = words::token("n");
    const BEST_OF: u8 = words::token("best_of");

    /// What a top-level key is, by its one-byte form (every field read is one of the words;
    /// 0, any other key, is none of them).
    fn of(word: u8) -> Field {
        match word {
            Self::STREAM => Field::Stream,
            Self::STREAM_OPTIONS => Field::StreamOptions,
            Self::TEMPERATURE => Field::Temperature,
            Self::N | Self::BEST_OF => Field::Choices,
            _ => Field::Other,
        }
    }
}

/// Writes an object key, and says which top-level field it is.
struct KeySeed<'c> {
    canon: &'c mut Canon,
    top: bool,
}

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = Field;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Field, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_> {
    type Value = Field;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Field, E> {
        let field = match words::word(v.as_bytes()) {
            Some(word) if self.top => Field::of(word),
            _ => Field::Other,
        };
        if !matches!(field, Field::Stream | Field::StreamOptions) {
            self.canon.str(v);
        }
        Ok(field)
    }
}

/// `stream_options`, read for its one flag.
#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct StreamOptions {
    include_usage: Option<bool>,
}

impl<'de> Visitor<'de> for Node<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.canon.buf.push(if v { b't' } else { b'f' });
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.canon.int(i128::from(v));
        Ok(())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.canon.int(i128::from(v));
        Ok(())
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        self.canon.float(v);
        Ok(())
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.canon.str(v);
        Ok(())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.canon.buf.push(b'n');
        Ok(())
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.visit_unit()
    }

    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        self.canon.buf.push(b'[');
        loop {
            let child = self
                .child()
                .map_err(|()| de::Error::custom("nested too deeply"))?;
            if seq.next_element_seed(child)?.is_none() {
                break;
            }
        }
        self.canon.buf.push(b']');
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        let top = self.depth == 0;
        if top {
            self.canon.object = true;
        }
        self.canon.buf.push(b'{');
        let start = self.canon.buf.len();
        let base = self.canon.members.len();
        loop {
            let member = self.canon.buf.len();
            let Some(field) = map.next_key_seed(KeySeed {
                canon: self.canon,
                top,
            })?
            else {
                break;
            };
            match field {
                Field::Stream => {
                    self.canon.facts.stream = map.next_value::<Option<bool>>()?.unwrap_or(false);
                }
                Field::StreamOptions => {
                    let o = map.next_value::<Option<StreamOptions>>()?;
                    self.canon.facts.include_usage =
                        o.and_then(|o| o.include_usage).unwrap_or(false);
                }
                field => {
                    let key_end = self.canon.buf.len();
                    self.canon.number = None;
                    let child = self
                        .child()
                        .map_err(|()| de::Error::custom("nested too deeply"))?;
                    map.next_value_seed(child)?;
                    self.canon.fact(field);
                    let end = self.canon.buf.len();
                    self.canon.members.push(Member {
                        start: member,
                        key_end,
                        end,
                    });
                }
            }
        }
        self.canon.close_object(start, base);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(body: &str) -> Request<Bytes> {
        Request::post("/v1/chat/completions")
            .body(Bytes::from(body.to_owned()))
            .unwrap()
    }

    fn key(body: &str) -> CacheKey {
        KeyDeriver::new().key(&req(body), None).unwrap().0
    }

    #[test]
    fn nested_objects_are_ordered_at_every_level() {
        assert_eq!(
            key(r#"{"a":{"y":1,"x":[{"q":2,"p":3}]},"b":2}"#),
            key(r#"{"b":2,"a":{"x":[{"p":3,"q":2}],"y":1}}"#)
        );
        assert_ne!(key(r#"{"a":[1,2]}"#), key(r#"{"a":[2,1]}"#));
    }

    #[test]
    fn an_integral_number_is_one_number_however_it_is_spelled_at_any_size() {
        let spellings: &[&[&str]] = &[
            &["1", "1.0", "1e0", "10e-1"],
            &["1000000000000000000", "1e18", "1000000000000000000.0"],
            &[
                "4611686018427387904",
                "4611686018427387904.0",
                "4.611686018427387904e18",
            ],
            &["18446744073709549568", "1.8446744073709549568e19"],
            &[
                "-9223372036854775808",
                "-9223372036854775808.0",
                "-9.223372036854775808e18",
            ],
        ];
        for same in spellings {
            let keys: Vec<CacheKey> = same
                .iter()
                .map(|n| key(&format!(r#"{{"model":"m","seed":{n}}}"#)))
                .collect();
            assert!(keys.windows(2).all(|w| w[0] == w[1]), "{same:?}");
        }
        // Values serde reads apart stay apart: an integer it reads exactly, beside the float
        // nearest to it.
        assert_ne!(
            key(r#"{"seed":1000000000000000001}"#),
            key(r#"{"seed":1000000000000000000}"#)
        );
        assert_ne!(
            key(r#"{"seed":18446744073709551615}"#),
            key(r#"{"seed":18446744073709551616.0}"#)
        );
    }

    #[test]
    fn the_names_requests_repeat_are_written_as_one_byte_each() {
        let body = br#"{"model":"m","messages":[{"content":"hi","role":"user"}]}"#;
        let w = words::token;
        // Members in the words' order: `messages` before `model`, `role` before `content`.
        let expect = [
            &[
                b'{',
                w("messages"),
                b'[',
                b'{',
                w("role"),
                w("user"),
                w("content"),
            ][..],
            b"s\x02hi}]",
            &[w("model")],
            b"s\x01m}",
        ]
        .concat();
        let mut canon = Canon::default();
        assert_eq!(fast::canonical(body, &mut canon), Some(()));
        assert_eq!(canon.buf, expect);
        let mut canon = Canon::default();
        general(body, &mut canon).unwrap();
        assert_eq!(canon.buf, expect);
    }

    #[test]
    fn a_string_is_never_confused_with_its_neighbours() {
        // Length prefixes keep the boundaries: these would collide if strings were concatenated.
        assert_ne!(key(r#"{"a":"bc","d":""}"#), key(r#"{"a":"b","d":"c"}"#));
        assert_ne!(key(r#"{"a":"1"}"#), key(r#"{"a":1}"#));
        assert_ne!(key(r#"{"a":null}"#), key(r#"{"a":false}"#));
    }

    /// Reads a canonical form back into the value it was written from: that it can be read
    /// back is what makes two different bodies write different bytes.
    fn decode(b: &[u8], i: &mut usize) -> Option<serde_json::Value> {
        use serde_json::Value;
        fn leb(b: &[u8], i: &mut usize) -> Option<u64> {
            let (mut n, mut shift) = (0u64, 0);
            loop {
                let byte = *b.get(*i)?;
                *i += 1;
                n |= u64::from(byte & 0x7f).checked_shl(shift)?;
                if byte & 0x80 == 0 {
                    return Some(n);
                }
                shift += 7;
            }
        }
        fn text(b: &[u8], i: &mut usize) -> Option<String> {
            let len = usize::try_from(leb(b, i)?).ok()?;
            let s = std::str::from_utf8(b.get(*i..i.checked_add(len)?)?).ok()?;
            *i += len;
            Some(s.to_owned())
        }
        fn word(b: &[u8], i: &mut usize) -> Option<String> {
            let w = words::WORDS.get(usize::from(b.get(*i)?.checked_sub(0x80)?))?;
            *i += 1;
            Some((*w).to_owned())
        }
        if let Some(w) = word(b, i) {
            return Some(Value::String(w));
        }
        let tag = *b.get(*i)?;
        *i += 1;
        Some(match tag {
            b'n' => Value::Null,
            b't' => Value::Bool(true),
            b'f' => Value::Bool(false),
            b'i' => {
                let z = leb(b, i)?;
                Value::from((z >> 1) as i64 ^ -((z & 1) as i64))
            }
            b's' => Value::String(text(b, i)?),
            b'[' => {
                let mut items = Vec::new();
                while *b.get(*i)? != b']' {
                    items.push(decode(b, i)?);
                }
                *i += 1;
                Value::Array(items)
            }
            b'{' => {
                let mut members = serde_json::Map::new();
                while *b.get(*i)? != b'}' {
                    let name = match word(b, i) {
                        Some(w) => w,
                        None => {
                            (*b.get(*i)? == b's').then_some(())?;
                            *i += 1;
                            text(b, i)?
                        }
                    };
                    members.insert(name, decode(b, i)?);
                }
                *i += 1;
                Value::Object(members)
            }
            _ => return None,
        })
    }

    /// Integers and strings around the widths where their LEB128 grows, text whose bytes look
    /// like tags and lengths, and the words written as one byte.
    fn value() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
        use proptest::prelude::*;
        use serde_json::Value;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            (0u32..9, -2i64..2, any::<bool>()).prop_map(|(w, d, minus)| {
                let v = (1i64 << (7 * w + 6)) + d;
                Value::from(if minus { -v } else { v })
            }),
            "[a-c\u{1}\u{7f}\u{80}-\u{ff}is\\[{]{0,4}".prop_map(Value::from),
            (125usize..131, "[ab]").prop_map(|(n, c)| Value::from(c.repeat(n))),
            proptest::sample::select(&words::WORDS[..]).prop_map(Value::from),
        ];
        let key = prop_oneof![
            "[a-c]{0,3}",
            proptest::sample::select(&words::WORDS[..]).prop_map(str::to_owned),
        ];
        leaf.prop_recursive(3, 24, 4, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map(key.clone(), inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(1_000))]

        #[test]
        fn the_canonical_form_reads_back_as_the_value_it_was_written_from(v in value()) {
            let body = serde_json::json!({ "a": v });
            let mut canon = Canon::default();
            Node::top(&mut canon).deserialize(&body).unwrap();
            let mut at = 0;
            let back = decode(&canon.buf, &mut at);
            proptest::prop_assert_eq!(back, Some(body));
            proptest::prop_assert_eq!(at, canon.buf.len());
        }
    }

    /// A thread keeps the hasher's state after the last few heads it hashed: a key must not
    /// depend on which heads came before it, nor on how many.
    #[test]
    fn a_key_is_the_same_whichever_heads_the_thread_hashed_before() {
        let long_tenant = "t".repeat(300);
        let heads: Vec<(String, Option<&str>)> = (0..7)
            .map(|i| {
                let partition = match i % 3 {
                    0 => None,
                    1 => Some("tenant-a"),
                    _ => Some(long_tenant.as_str()),
                };
                (format!("/v{i}/chat/completions"), partition)
            })
            .collect();
        let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
        let key_of = |path: &str, partition: Option<&str>| {
            let req = Request::post(path)
                .body(Bytes::from_static(body.as_bytes()))
                .unwrap();
            KeyDeriver::new()
                .key(&req, partition.map(str::as_bytes))
                .unwrap()
                .0
        };
        // Each on a thread of its own, which has kept nothing.
        let cold: Vec<CacheKey> = heads
            .iter()
            .map(|(path, partition)| {
                std::thread::scope(|s| s.spawn(|| key_of(path, *partition)).join().unwrap())
            })
            .collect();
        // On this thread, in turn and out of turn, more heads than a thread keeps.
        for order in [
            [0, 1, 2, 3, 4, 5, 6],
            [6, 0, 0, 5, 1, 4, 2],
            [3, 3, 2, 1, 0, 6, 5],
        ] {
            for i in order {
                let (path, partition) = &heads[i];
                assert_eq!(key_of(path, *partition), cold[i], "head {i}");
            }
        }
        let distinct: std::collections::HashSet<_> = cold.iter().collect();
        assert_eq!(distinct.len(), cold.len());
    }

    proptest::proptest! {
        /// The quick order of written keys is their bytes' order, whatever the bytes.
        #[test]
        fn keys_are_ordered_as_their_bytes(
            a in proptest::collection::vec(proptest::num::u8::ANY, 0..6),
            b in proptest::collection::vec(proptest::num::u8::ANY, 0..6),
        ) {
            proptest::prop_assert_eq!(key_order(&a, &b), a.cmp(&b));
            proptest::prop_assert_eq!(key_order(&a, &a), std::cmp::Ordering::Equal);
        }
    }

    #[test]
    fn the_scratch_buffer_is_given_back_after_a_huge_body() {
        let big = format!(r#"{{"a":"{}"}}"#, "x".repeat(KEEP_SCRATCH * 2));
        key(&big);
        SCRATCH.with(|c| assert!(c.borrow().buf.capacity() <= KEEP_SCRATCH));
    }
}
