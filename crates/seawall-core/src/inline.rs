//! Small containers that hold their usual content without a heap allocation.
//!
//! A call through the recommended stack is counted in allocations as much as in instructions:
//! the frames a layer holds back before its commit point are almost always one data frame (a
//! small answer arrives whole), and the model names an application's answers report are a
//! handful. [`FrameQueue`] keeps that one frame inline and a boxed `VecDeque` only past it;
//! [`shared_name`] builds each of those names once per thread and hands out shared copies.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;

use http_body::Frame;

/// The body frames a layer holds back before it hands a response on, first in, first out.
///
/// A small answer arrives as one data frame, so the queue keeps a first data frame inline
/// (its `Bytes` handle, not the whole `Frame`, which is large enough to cost copies): holding
/// one frame and passing it on allocates nothing. Anything more (a second frame, trailers
/// first) goes to a `VecDeque`, boxed: the queue rides in bodies that every layer above moves,
/// so its unused overflow is a pointer, not a deque's 32 bytes.
///
/// ```
/// use bytes::Bytes;
/// use http_body::Frame;
/// use seawall_core::FrameQueue;
/// let mut q = FrameQueue::new();
/// q.push_back(Frame::data(Bytes::from_static(b"b")));
/// q.push_front(Frame::data(Bytes::from_static(b"a")));
/// assert_eq!(q.len(), 2);
/// let first = q.pop_front().unwrap().into_data().unwrap();
/// assert_eq!(first, "a");
/// assert_eq!(q.data().collect::<Vec<_>>(), [&Bytes::from_static(b"b")]);
/// ```
pub struct FrameQueue<D> {
    /// A data frame before everything in `rest`.
    first: Option<D>,
    /// The frames after it, once there are any. Boxed on purpose: a pointer inline, not a
    /// deque's 32 bytes, in every body that holds a queue (the box is the deque's second
    /// allocation, made only by the few bodies that hold more than one frame).
    #[allow(clippy::box_collection)]
    rest: Option<Box<VecDeque<Frame<D>>>>,
}

impl<D> FrameQueue<D> {
    /// An empty queue (no allocation).
    pub const fn new() -> Self {
        FrameQueue {
            first: None,
            rest: None,
        }
    }

    /// The overflow, made on first use.
    fn rest_mut(&mut self) -> &mut VecDeque<Frame<D>> {
        self.rest.get_or_insert_with(Box::default)
    }

    /// Whether the queue is empty.
    pub fn is_empty(&self) -> bool {
        self.first.is_none() && self.rest.as_ref().is_none_or(|r| r.is_empty())
    }

    /// How many frames the queue holds.
    pub fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.rest.as_ref().map_or(0, |r| r.len())
    }

    /// Adds a frame at the back.
    pub fn push_back(&mut self, frame: Frame<D>) {
        if self.is_empty() {
            match frame.into_data() {
                Ok(data) => self.first = Some(data),
                Err(frame) => self.rest_mut().push_back(frame),
            }
        } else {
            self.rest_mut().push_back(frame);
        }
    }

    /// Adds a frame at the front.
    pub fn push_front(&mut self, frame: Frame<D>) {
        if let Some(old) = self.first.take() {
            self.rest_mut().push_front(Frame::data(old));
        }
        match frame.into_data() {
            Ok(data) => self.first = Some(data),
            Err(frame) => self.rest_mut().push_front(frame),
        }
    }

    /// Takes the front frame.
    pub fn pop_front(&mut self) -> Option<Frame<D>> {
        match self.first.take() {
            Some(data) => Some(Frame::data(data)),
            None => self.rest.as_mut()?.pop_front(),
        }
    }

    /// The data of the data frames, front to back.
    pub fn data(&self) -> impl Iterator<Item = &D> {
        self.first.iter().chain(
            self.rest
                .iter()
                .flat_map(|r| r.iter())
                .filter_map(Frame::data_ref),
        )
    }

    /// Drops the data frames, keeping the others (trailers) in order.
    pub fn retain_non_data(&mut self) {
        self.first = None;
        if let Some(rest) = &mut self.rest {
            rest.retain(|f| !f.is_data());
        }
    }
}

impl<D> Default for FrameQueue<D> {
    fn default() -> Self {
        FrameQueue::new()
    }
}

impl<D> fmt::Debug for FrameQueue<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrameQueue")
            .field("frames", &self.len())
            .finish()
    }
}

/// Names [`shared_name`] keeps per thread.
const KEPT_NAMES: usize = 8;
/// The longest name [`shared_name`] keeps (a longer one is built for its call and dropped).
const KEPT_NAME_LEN: usize = 64;

/// The last names a thread shared, and which one the next new name replaces.
struct KeptNames {
    names: Vec<Arc<str>>,
    next: usize,
}

thread_local! {
    static KEPT: RefCell<KeptNames> = const {
        RefCell::new(KeptNames { names: Vec::new(), next: 0 })
    };
}

/// `name` as a shared string, for a layer that keeps a name the response gave it (the model
/// that served, in a fallback's [`ServedBy`](crate::ServedBy)).
///
/// The calls of an application are served by a handful of models, so each thread keeps the
/// last 8 names it was asked for and hands out clones of them: a reference count, no
/// allocation. A name is untrusted input: only names of at most 64 bytes are kept, so what a
/// thread keeps stays small whatever the upstream answers.
///
/// ```
/// use std::sync::Arc;
/// let a = seawall_core::shared_name("gpt-4o-2024-08-06");
/// let b = seawall_core::shared_name("gpt-4o-2024-08-06");
/// assert_eq!(&*a, "gpt-4o-2024-08-06");
/// assert!(Arc::ptr_eq(&a, &b));
/// ```
pub fn shared_name(name: &str) -> Arc<str> {
    if name.len() > KEPT_NAME_LEN {
        return Arc::from(name);
    }
    KEPT.try_with(|kept| {
        let mut kept = kept.borrow_mut();
        if let Some(found) = kept.names.iter().find(|n| ***n == *name) {
            return found.clone();
        }
        let new: Arc<str> = Arc::from(name);
        let kept = &mut *kept;
        if kept.names.len() < KEPT_NAMES {
            kept.names.push(new.clone());
        } else {
            kept.names[kept.next] = new.clone();
            kept.next = (kept.next + 1) % KEPT_NAMES;
        }
        new
    })
    // The thread is exiting (its locals are gone): build it as before.
    .unwrap_or_else(|_| Arc::from(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(s: &'static str) -> Frame<&'static str> {
        Frame::data(s)
    }

    fn trailers() -> Frame<&'static str> {
        Frame::trailers(http::HeaderMap::new())
    }

    /// Drains the queue: each data frame's text, `T` for trailers.
    fn drain(q: &mut FrameQueue<&'static str>) -> Vec<&'static str> {
        let mut out = Vec::new();
        while let Some(f) = q.pop_front() {
            out.push(f.into_data().unwrap_or("T"));
        }
        out
    }

    #[test]
    fn queue_keeps_order_across_the_inline_slot() {
        let mut q = FrameQueue::new();
        assert!(q.is_empty());
        q.push_back(data("a"));
        q.push_back(data("b"));
        q.push_back(trailers());
        q.push_front(data("0"));
        assert_eq!(q.len(), 4);
        assert_eq!(q.data().copied().collect::<Vec<_>>(), ["0", "a", "b"]);
        assert_eq!(drain(&mut q), ["0", "a", "b", "T"]);
        assert!(q.is_empty());
        assert_eq!(q.len(), 0);
    }

    #[test]
    fn queue_keeps_trailers_first_and_drops_only_data() {
        let mut q = FrameQueue::new();
        q.push_back(trailers());
        q.push_back(data("a"));
        assert_eq!(q.len(), 2);
        q.push_front(trailers());
        q.push_front(data("x"));
        assert_eq!(drain(&mut q), ["x", "T", "T", "a"]);
        q.push_back(data("a"));
        q.push_back(trailers());
        q.push_back(data("b"));
        q.retain_non_data();
        assert_eq!(drain(&mut q), ["T"]);
        q.push_front(data("z"));
        assert_eq!(format!("{q:?}"), "FrameQueue { frames: 1 }");
    }

    #[test]
    fn shared_names_are_kept_up_to_a_bound() {
        let long = "m".repeat(KEPT_NAME_LEN + 1);
        assert!(!Arc::ptr_eq(&shared_name(&long), &shared_name(&long)));
        let first = shared_name("model-0");
        // Eight other names push the first one out; it is built again, equal.
        for i in 1..=KEPT_NAMES {
            let n = format!("model-{i}");
            assert!(Arc::ptr_eq(&shared_name(&n), &shared_name(&n)));
        }
        let again = shared_name("model-0");
        assert_eq!(again, first);
        assert!(!Arc::ptr_eq(&again, &first));
    }
}
