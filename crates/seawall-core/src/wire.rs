//! Which chat API a request speaks, for the layers that read or rewrite answers (the cache,
//! repair turns): one reading of the path, so they never disagree on what they handle.

use http::Request;

/// The two chat wire formats whose answers seawall reads and rewrites.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChatWire {
    /// OpenAI Chat Completions (`.../chat/completions`; Azure and compatible servers too).
    OpenAiChat,
    /// Anthropic Messages (`.../messages`).
    AnthropicMessages,
}

impl ChatWire {
    /// The wire format of a request, from its path; `None` for any other API (Responses,
    /// embeddings, ...).
    ///
    /// ```
    /// use seawall_core::ChatWire;
    ///
    /// let req = http::Request::post("https://api.anthropic.com/v1/messages/").body(()).unwrap();
    /// assert_eq!(ChatWire::of(&req), Some(ChatWire::AnthropicMessages));
    /// let req = http::Request::post("/v1/embeddings").body(()).unwrap();
    /// assert_eq!(ChatWire::of(&req), None);
    /// ```
    pub fn of<B>(req: &Request<B>) -> Option<ChatWire> {
        let path = req.uri().path().trim_end_matches('/');
        if path.ends_with("/chat/completions") {
            Some(ChatWire::OpenAiChat)
        } else if path.ends_with("/messages") || path == "messages" {
            Some(ChatWire::AnthropicMessages)
        } else {
            None
        }
    }
}
