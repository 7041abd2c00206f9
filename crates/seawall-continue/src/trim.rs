//! Joining a continuation to the text already delivered without duplicating any of it.
//!
//! Two cases:
//!
//! - a prefill sent to Anthropic leaves out the partial answer's trailing whitespace (which
//!   Anthropic refuses), so the model may write it again: [`Trim::exact`] drops as much of
//!   the continuation's start as matches the whitespace left out;
//! - a model asked by an instruction may repeat the last words it gave before going on:
//!   [`Trim::overlap`] drops the longest tail of the delivered text (starting at a word, within
//!   the last [`TAIL`] bytes) that the continuation starts with. The continuation's first
//!   deltas are held until that is decided: while what arrived could still grow into a longer
//!   tail, nothing is sent.

/// The most bytes of delivered text an overlap is looked for in.
pub(crate) const TAIL: usize = 256;

/// How the start of one continuation is trimmed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Trim {
    /// Nothing to trim.
    None,
    /// Drop the start of the continuation as far as it matches this text.
    Exact(String),
    /// Drop a tail of the delivered text the continuation starts with.
    Overlap {
        /// The candidate tails, longest first (each starts at a word).
        tails: Vec<String>,
        /// The continuation's text held while undecided.
        held: String,
    },
}

impl Trim {
    pub(crate) fn exact(text: &str) -> Trim {
        if text.is_empty() {
            Trim::None
        } else {
            Trim::Exact(text.to_owned())
        }
    }

    pub(crate) fn overlap(delivered: &str) -> Trim {
        let mut start = delivered.len().saturating_sub(TAIL);
        while !delivered.is_char_boundary(start) {
            start += 1;
        }
        let tail = &delivered[start..];
        let mut tails = Vec::new();
        let mut prev_space = start == 0
            || delivered[..start]
                .chars()
                .next_back()
                .is_some_and(char::is_whitespace);
        for (i, c) in tail.char_indices() {
            if prev_space && !c.is_whitespace() {
                tails.push(tail[i..].to_owned());
            }
            prev_space = c.is_whitespace();
        }
        if tails.is_empty() {
            Trim::None
        } else {
            Trim::Overlap {
                tails,
                held: String::new(),
            }
        }
    }

    /// Takes the next piece of the continuation's text; gives what to deliver now.
    pub(crate) fn feed(&mut self, text: &str) -> String {
        match self {
            Trim::None => text.to_owned(),
            Trim::Exact(left) => {
                let common = common_prefix(left, text);
                let out = text[common..].to_owned();
                if common == left.len() || !out.is_empty() {
                    *self = Trim::None;
                } else {
                    left.drain(..common);
                }
                out
            }
            Trim::Overlap { tails, held } => {
                held.push_str(text);
                let undecided = tails
                    .iter()
                    .any(|t| t.len() > held.len() && t.starts_with(held.as_str()));
                if undecided {
                    return String::new();
                }
                self.flush()
            }
        }
    }

    /// The continuation ended (or its finish arrived): gives what is still held.
    pub(crate) fn flush(&mut self) -> String {
        match std::mem::replace(self, Trim::None) {
            Trim::Overlap { tails, held } => {
                let cut = tails
                    .iter()
                    .filter(|t| held.starts_with(t.as_str()))
                    .map(String::len)
                    .max()
                    .unwrap_or(0);
                held[cut..].to_owned()
            }
            _ => String::new(),
        }
    }
}

fn common_prefix(a: &str, b: &str) -> usize {
    a.char_indices()
        .zip(b.chars())
        .find(|((_, x), y)| x != y)
        .map_or_else(|| a.len().min(b.len()), |((i, _), _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(mut trim: Trim, pieces: &[&str]) -> String {
        let mut out: String = pieces.iter().map(|p| trim.feed(p)).collect();
        out.push_str(&trim.flush());
        out
    }

    #[test]
    fn an_overlap_of_the_last_words_is_dropped_however_the_pieces_fall() {
        let t = || Trim::overlap("the storm passes over");
        assert_eq!(run(t(), &["over a quiet"]), " a quiet");
        assert_eq!(run(t(), &["o", "ver", " a", " quiet"]), " a quiet");
        assert_eq!(run(t(), &["passes over", " a"]), " a");
        assert_eq!(run(t(), &[" a quiet"]), " a quiet");
        assert_eq!(run(t(), &["harbor"]), "harbor");
        // A continuation that ends inside a candidate tail is delivered at the end.
        assert_eq!(run(t(), &["ov"]), "ov");
    }

    #[test]
    fn an_overlap_starts_at_a_word_only() {
        // "ver" is a tail of the text but not a word of it.
        assert_eq!(
            run(Trim::overlap("the storm passes over"), &["very"]),
            "very"
        );
    }

    #[test]
    fn exact_trim_drops_the_whitespace_left_out_of_a_prefill() {
        assert_eq!(run(Trim::exact(" \n"), &[" ", "\nnext"]), "next");
        assert_eq!(run(Trim::exact(" "), &["next"]), "next");
        assert_eq!(run(Trim::exact("  "), &[" x"]), "x");
        assert_eq!(run(Trim::exact(""), &[" x"]), " x");
    }

    #[test]
    fn the_tail_window_is_cut_at_a_character_boundary() {
        let long = "é".repeat(300);
        let Trim::Overlap { tails, .. } = Trim::overlap(&format!("{long} end")) else {
            panic!("a tail exists");
        };
        assert_eq!(tails.last().map(String::as_str), Some("end"));
    }
}
