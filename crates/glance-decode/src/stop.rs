//! Stop strings over streamed text: text is held back while it could still be the start of a stop
//! string, so a client never sees a stop string or part of one.

/// Matches stop strings against text arriving piece by piece.
#[derive(Debug, Clone, Default)]
pub struct StopStrings {
    stops: Vec<String>,
    /// Text received but not yet released.
    pending: String,
}

/// What to do with a newly arrived piece of text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopStatus {
    /// Release this text and continue.
    Continue(String),
    /// A stop string matched: release this text (everything before the match) and stop.
    Stopped(String),
}

impl StopStrings {
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            pending: String::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    pub fn push(&mut self, piece: &str) -> StopStatus {
        self.pending.push_str(piece);
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min()
        {
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return StopStatus::Stopped(out);
        }
        // Hold back the longest suffix that is a proper prefix of some stop string.
        let hold = self
            .stops
            .iter()
            .flat_map(|s| {
                (1..s.len())
                    .rev()
                    .filter(|&n| s.is_char_boundary(n))
                    .find(|&n| self.pending.ends_with(&s[..n]))
            })
            .max()
            .unwrap_or(0);
        let cut = self.pending.len() - hold;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        StopStatus::Continue(out)
    }

    /// Releases whatever was held back (end of generation without a match).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_back_partial_matches_and_stops() {
        let mut s = StopStrings::new(vec!["###".into(), "END".into()]);
        assert_eq!(s.push("hello #"), StopStatus::Continue("hello ".into()));
        assert_eq!(s.push("# wor"), StopStatus::Continue("## wor".into()));
        assert_eq!(s.push("ld E"), StopStatus::Continue("ld ".into()));
        assert_eq!(s.push("ND more"), StopStatus::Stopped("".into()));
    }

    #[test]
    fn finish_releases_and_empty_is_passthrough() {
        let mut s = StopStrings::new(vec!["stop".into()]);
        assert_eq!(s.push("a st"), StopStatus::Continue("a ".into()));
        assert_eq!(s.finish(), "st");
        let mut none = StopStrings::new(vec![]);
        assert_eq!(none.push("x"), StopStatus::Continue("x".into()));
    }
}
