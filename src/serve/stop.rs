//! Stop strings (OpenAI's `stop`): the answer ends before the first occurrence of any of them,
//! which is never emitted, even when it spans several tokens or streamed chunks.

/// Holds back the tail of the text that could still begin a stop string.
#[derive(Debug, Clone, Default)]
pub struct StopScanner {
    stops: Vec<String>,
    held: String,
    hit: bool,
}

impl StopScanner {
    /// A scanner for `stops` (empty strings are ignored).
    pub fn new(stops: Vec<String>) -> StopScanner {
        StopScanner { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), held: String::new(), hit: false }
    }

    /// Whether a stop string was found (the answer is complete).
    pub fn stopped(&self) -> bool {
        self.hit
    }

    /// Add generated text; returns the part that can be emitted now: everything before a stop
    /// string (then [`StopScanner::stopped`] is true and later pushes return nothing), or
    /// everything except the longest tail that is a prefix of some stop string.
    pub fn push(&mut self, text: &str) -> String {
        if self.hit {
            return String::new();
        }
        self.held.push_str(text);
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min() {
            self.hit = true;
            let out = self.held[..at].to_string();
            self.held.clear();
            return out;
        }
        let keep = self.stops.iter().map(|s| longest_prefix_suffix(&self.held, s)).max().unwrap_or(0);
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        out
    }

    /// The text still held back, at the end of the answer (no stop string followed).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// The length in bytes of the longest suffix of `text` that is a proper prefix of `stop`
/// (cut at a character boundary of `text`).
fn longest_prefix_suffix(text: &str, stop: &str) -> usize {
    let max = text.len().min(stop.len().saturating_sub(1));
    (1..=max).rev().find(|&n| text.is_char_boundary(text.len() - n) && stop.starts_with(&text[text.len() - n..])).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_string_split_across_pushes_is_never_emitted() {
        let mut s = StopScanner::new(vec!["END".into(), "\n\n".into()]);
        let mut out = String::new();
        for piece in ["Hello E", "N", "x wor", "ld E", "ND more"] {
            out.push_str(&s.push(piece));
        }
        assert!(s.stopped());
        assert_eq!(out, "Hello ENx world ");
        assert_eq!(s.push("after"), "");
    }

    #[test]
    fn held_text_comes_out_at_the_end_and_the_earliest_stop_wins() {
        let mut s = StopScanner::new(vec!["abc".into()]);
        assert_eq!(s.push("xxab"), "xx");
        assert_eq!(s.finish(), "ab");
        let mut s = StopScanner::new(vec!["b".into(), "a".into()]);
        assert_eq!(s.push("zab"), "z");
        let mut s = StopScanner::new(vec!["é!".into()]);
        assert_eq!(s.push("café"), "caf");
        assert_eq!(s.push("!"), "");
        assert!(s.stopped());
    }
}
