//! Incremental detokenisation for streaming.
//!
//! The technique of HF text-generation-inference (`decode_token`): keep two offsets into the ids,
//! `prefix_offset ≤ read_offset`; on each new id decode the window `ids[prefix_offset..]` and the
//! already-emitted part `ids[prefix_offset..read_offset]`, and emit the difference. Decoding a
//! window rather than single tokens gets SentencePiece's `▁` spaces right (a decoder strips the
//! leading space of the *first* token only, which both decodes share) and joins byte-fallback
//! tokens (`<0xE4><0xBD><0xA0>` → `你`): while the window ends in U+FFFD (an incomplete UTF-8
//! sequence) nothing is emitted and the offsets stay put.
//!
//! On top of TGI:
//! * with a `ByteFallback` decoder, nothing is emitted while the last id is a byte token
//!   (`<0xNN>`): `tokenizers` decodes a run of byte tokens as one string if the whole run is valid
//!   UTF-8 and as one U+FFFD per byte otherwise, so a valid character could still be turned into
//!   U+FFFD by the next byte; the run is emitted when the first non-byte, non-special token
//!   arrives (or at `finish`); skipped special tokens do not end a run;
//! * the emitted text is checked to be a prefix extension (`starts_with`), falling back to a full
//!   decode when a decoder is not window-stable, so no slicing can land inside a character;
//! * [`StreamDecoder::finish`] diffs one full decode against everything emitted, so the pieces plus
//!   `finish()` equal `decode(all_ids, true)` exactly (a trailing incomplete sequence comes out as
//!   U+FFFD there, as in the full decode);
//! * with `clean_up_tokenization_spaces`, text that a later token could still change (a trailing
//!   `" "`, `" '"`, `" n"`, `" n'"`, `" 'v"`, `" 'r"`: proper prefixes of the clean-up patterns) is
//!   held back until it can no longer match, so the cleaned pieces concatenate to the cleaned whole.

use glance_core::Result;

use super::{clean_up_tokenization, TextProcessor};

/// Incremental detokeniser: push ids one at a time, get back the newly completed text. Never emits
/// a partial UTF-8 sequence that a later token completes; all pieces plus [`finish`](Self::finish)
/// equal `decode(all_ids, true)`.
pub struct StreamDecoder<'a> {
    processor: &'a TextProcessor,
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
    /// Everything the window technique has produced so far (before clean-up hold-back).
    raw_emitted: String,
    /// Produced but not yet emitted text (clean-up hold-back).
    pending: String,
}

const REPLACEMENT: char = '\u{FFFD}';

/// Proper prefixes of the clean-up patterns, longest first.
const HOLD_SUFFIXES: [&str; 6] = [" n'", " 'v", " 'r", " '", " n", " "];

/// If a window has grown this long without emitting, diff against a full decode instead.
const MAX_WINDOW: usize = 32;

impl<'a> StreamDecoder<'a> {
    pub(super) fn new(processor: &'a TextProcessor) -> Self {
        Self {
            processor,
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
            raw_emitted: String::new(),
            pending: String::new(),
        }
    }

    /// All ids pushed so far.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    fn decode(&self, ids: &[u32]) -> Result<String> {
        self.processor.decode_pipeline(ids, true)
    }

    /// Where a fresh window starts once everything is emitted: at the last id that decodes to
    /// text, so that the next token is not decoded as a first token (whose leading space
    /// SentencePiece decoders strip).
    fn anchor(&self) -> usize {
        let n = self.ids.len();
        (0..n)
            .rev()
            .find(|&i| !self.processor.is_special(self.ids[i]))
            .unwrap_or(n)
    }

    /// Adds one id; returns the text it completed (often empty).
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.ids.push(id);
        // A byte run's text is final only once the run ends: one invalid byte later turns the
        // whole run into U+FFFDs in the full decode. Skipped special tokens do not end a run.
        let last_text_id = self
            .ids
            .iter()
            .rev()
            .find(|&&i| !self.processor.is_special(i));
        if last_text_id.is_some_and(|&i| self.processor.is_fallback_byte(i)) {
            return Ok(String::new());
        }
        let prefix = self.decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let window = self.decode(&self.ids[self.prefix_offset..])?;
        if window.ends_with(REPLACEMENT) || window.len() <= prefix.len() {
            if self.ids.len() - self.prefix_offset <= MAX_WINDOW {
                return Ok(String::new());
            }
            return self.catch_up();
        }
        let piece = match window.strip_prefix(prefix.as_str()) {
            Some(piece) => piece.to_string(),
            None => return self.catch_up(),
        };
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        self.raw_emitted.push_str(&piece);
        Ok(self.release(piece, false))
    }

    /// Fallback when the window is not a clean extension of its prefix: diff a full decode
    /// against the emitted text.
    fn catch_up(&mut self) -> Result<String> {
        let full = self.decode(&self.ids)?;
        if full.ends_with(REPLACEMENT) {
            return Ok(String::new());
        }
        match full.strip_prefix(self.raw_emitted.as_str()) {
            Some(piece) if !piece.is_empty() => {
                let piece = piece.to_string();
                self.prefix_offset = self.anchor();
                self.read_offset = self.ids.len();
                self.raw_emitted.push_str(&piece);
                Ok(self.release(piece, false))
            }
            _ => Ok(String::new()),
        }
    }

    /// Flushes the text still held back (an incomplete UTF-8 sequence comes out as U+FFFD, as in
    /// the full decode). Pushing after `finish` continues the same stream.
    pub fn finish(&mut self) -> Result<String> {
        let full = self.decode(&self.ids)?;
        let piece = match full.strip_prefix(self.raw_emitted.as_str()) {
            Some(rest) => rest.to_string(),
            None => {
                // The window technique disagreed with the full decode (should not happen with the
                // decoders `tokenizers` ships); emit what the window has left.
                let prefix = self.decode(&self.ids[self.prefix_offset..self.read_offset])?;
                let window = self.decode(&self.ids[self.prefix_offset..])?;
                window
                    .strip_prefix(prefix.as_str())
                    .unwrap_or_default()
                    .to_string()
            }
        };
        self.raw_emitted.push_str(&piece);
        self.prefix_offset = self.anchor();
        self.read_offset = self.ids.len();
        Ok(self.release(piece, true))
    }

    /// Passes produced text through the clean-up pass, holding back a tail a later token could
    /// still change.
    fn release(&mut self, piece: String, flush: bool) -> String {
        if !self.processor.clean_up_tokenization_spaces {
            return piece;
        }
        self.pending.push_str(&piece);
        let mut cut = self.pending.len();
        if !flush {
            'outer: loop {
                for suffix in HOLD_SUFFIXES {
                    if self.pending[..cut].ends_with(suffix) {
                        cut -= suffix.len();
                        continue 'outer;
                    }
                }
                break;
            }
        }
        let rest = self.pending.split_off(cut);
        let ready = std::mem::replace(&mut self.pending, rest);
        clean_up_tokenization(&ready)
    }
}
