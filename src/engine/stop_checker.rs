//! `StopChecker`: the text side of postprocessing. It holds a request's
//! decoded output, cuts it at the first stop string (searching only where a
//! new one could have appeared), and hands out text deltas that never contain
//! half a character nor the start of what could still become a stop string.
//! Token-level stops (EOS, stop token ids, max_tokens) are the engine's.

/// The decoded output of one request. Its stop strings stay in the
/// request's `SamplingParams` (shared by the request's sequences) and are
/// passed to `push`.
#[derive(Clone, Debug, Default)]
pub struct StopChecker {
    /// Bytes of the longest stop string.
    longest: usize,
    /// Output text so far (cut before a stop string once one is found).
    text: String,
    /// Bytes of `text` already handed out.
    emitted: usize,
}

impl StopChecker {
    /// `stop`: non-empty stop strings (`SamplingParams::validate` refuses empty ones).
    pub fn new(stop: &[String]) -> Self {
        let longest = stop.iter().map(String::len).max().unwrap_or(0);
        Self {
            longest,
            ..Self::default()
        }
    }

    /// The output text so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Appends newly decoded text; true when one of `stop` (the strings
    /// `new` was given) now appears, in which case the text is cut where the
    /// earliest one starts.
    pub fn push(&mut self, stop: &[String], delta: &str) -> bool {
        let old = self.text.len();
        self.text.push_str(delta);
        if self.longest == 0 {
            return false;
        }
        // A new match ends in the new text, so it starts at most longest - 1 bytes before it.
        let mut from = old.saturating_sub(self.longest - 1);
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        let hit = stop.iter().filter_map(|s| self.text[from..].find(s.as_str())).min();
        if let Some(pos) = hit {
            self.text.truncate(from + pos);
            self.emitted = self.emitted.min(self.text.len());
            return true;
        }
        false
    }

    /// The text not handed out yet that is safe to show: all of it when the
    /// request is `finished`, else all but the last longest - 1 bytes (which
    /// could be the start of a stop string), never splitting a character.
    pub fn take_delta(&mut self, finished: bool) -> String {
        let hold = if finished { 0 } else { self.longest.saturating_sub(1) };
        let mut end = self.text.len().saturating_sub(hold).max(self.emitted);
        while !self.text.is_char_boundary(end) {
            end -= 1;
        }
        let end = end.max(self.emitted);
        let out = self.text[self.emitted..end].to_string();
        self.emitted = end;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stop: &[&str], deltas: &[&str]) -> (Vec<String>, bool, String) {
        let stop: Vec<String> = stop.iter().map(|s| s.to_string()).collect();
        let mut c = StopChecker::new(&stop);
        let mut out = Vec::new();
        for d in deltas {
            let hit = c.push(&stop, d);
            out.push(c.take_delta(hit));
            if hit {
                return (out, true, c.text().to_string());
            }
        }
        out.push(c.take_delta(true));
        (out, false, c.text().to_string())
    }

    #[test]
    fn no_stop_strings_stream_everything_at_once() {
        let (out, hit, text) = run(&[], &["Hel", "lo", " world"]);
        assert_eq!(out, ["Hel", "lo", " world", ""]);
        assert!(!hit);
        assert_eq!(text, "Hello world");
    }

    #[test]
    fn a_stop_string_split_across_deltas_is_cut_and_never_shown() {
        let (out, hit, text) = run(&["STOP"], &["abc S", "TO", "P and more"]);
        assert!(hit);
        assert_eq!(text, "abc ");
        assert_eq!(out.concat(), "abc ");
        assert!(out.iter().all(|d| !d.contains('S')), "{out:?}");
    }

    #[test]
    fn held_text_is_released_when_it_cannot_become_a_stop_string() {
        let (out, hit, _) = run(&["xyz"], &["ab", "cx", "yq", "r"]);
        assert!(!hit);
        // The last two bytes are always held (a 3-byte stop string could start
        // there) and released as the text moves on, and all of it at the end.
        assert_eq!(out, ["", "ab", "cx", "y", "qr"]);
    }

    #[test]
    fn the_earliest_of_several_stop_strings_wins() {
        let (_, hit, text) = run(&["lo", "el"], &["Hello"]);
        assert!(hit);
        assert_eq!(text, "H");
    }

    #[test]
    fn deltas_never_split_a_character() {
        // "é" is two bytes and "日" three; a 2-byte hold must not cut through them.
        let (out, hit, text) = run(&["ab"], &["é", "日", "本"]);
        assert!(!hit);
        assert_eq!(text, "é日本");
        for d in &out {
            assert!(std::str::from_utf8(d.as_bytes()).is_ok());
        }
        assert_eq!(out.concat(), "é日本");
    }

    #[test]
    fn a_stop_string_after_multibyte_text_is_found() {
        let (_, hit, text) = run(&["日本"], &["é日", "本語"]);
        assert!(hit);
        assert_eq!(text, "é");
    }
}
