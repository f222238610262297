//! The closed vocabulary: every word the questions, answers and chat template can contain.
//!
//! Token ids are the position in [`tokens`]: the six special tokens first, then punctuation,
//! digits, digit continuations (`##0`–`##9`, so "42" is the two tokens `4 ##2` and a number is
//! read digit by digit), then words. Text is lower-cased by the tokenizer's normaliser.
//! **Append only**: changing the order changes the ids of a trained checkpoint.

/// Unknown word.
pub const UNK: &str = "<unk>";
/// Padding.
pub const PAD: &str = "<pad>";
/// Beginning of sequence (added by the post-processor, like Llama).
pub const BOS: &str = "<s>";
/// End of sequence; terminates every assistant answer.
pub const EOS: &str = "</s>";
/// Placeholder of the image in the prompt (expanded to the visual tokens by the model).
pub const IMAGE: &str = "<image>";
/// Mask token for block-diffusion training and decoding.
pub const MASK: &str = "[MASK]";

/// Special tokens in id order (ids 0..6).
pub const SPECIAL: [&str; 6] = [UNK, PAD, BOS, EOS, IMAGE, MASK];

/// Prefix of a word-piece that continues the previous one (only used for digits).
pub const CONTINUATION: &str = "##";

/// Punctuation tokens.
pub const PUNCTUATION: &[&str] = &[".", ",", "?", ":"];

/// Words, grouped by role. Every one is produced by the generators (a test checks it).
pub const WORDS: &[&str] = &[
    // chat roles
    "user",
    "assistant",
    // colours, shapes, sizes
    "red",
    "orange",
    "yellow",
    "green",
    "blue",
    "purple",
    "circle",
    "square",
    "triangle",
    "star",
    "cross",
    "circles",
    "squares",
    "triangles",
    "stars",
    "crosses",
    "small",
    "large",
    // positions and relations
    "top",
    "middle",
    "bottom",
    "left",
    "center",
    "right",
    "above",
    "below",
    "to",
    "of",
    // answers and number words
    "yes",
    "no",
    "nothing",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    // function words and question words
    "a",
    "an",
    "the",
    "is",
    "are",
    "there",
    "in",
    "at",
    "on",
    "it",
    "its",
    "i",
    "you",
    "me",
    "what",
    "which",
    "where",
    "how",
    "many",
    "big",
    "do",
    "does",
    "can",
    "any",
    "another",
    "other",
    "same",
    "or",
    "and",
    "also",
    "that",
    "with",
    "their",
    "each",
    "every",
    "all",
    "object",
    "objects",
    "shape",
    "shapes",
    "colour",
    "color",
    "size",
    "position",
    "positions",
    "part",
    "image",
    "sign",
    "number",
    // verbs
    "see",
    "find",
    "count",
    "describe",
    "list",
    "give",
    "tell",
    "read",
    "reads",
    "say",
    "show",
    "shows",
    "has",
    "have",
    "sits",
    "contain",
    "contains",
    "located",
    "written",
    "share",
    "description",
    "detail",
    "detailed",
];

/// All tokens in id order.
pub fn tokens() -> Vec<String> {
    let mut v: Vec<String> = SPECIAL.iter().map(|s| s.to_string()).collect();
    v.extend(PUNCTUATION.iter().map(|s| s.to_string()));
    v.extend((0..10).map(|d| d.to_string()));
    v.extend((0..10).map(|d| format!("{CONTINUATION}{d}")));
    v.extend(WORDS.iter().map(|s| s.to_string()));
    v
}

/// Vocabulary size.
pub fn vocab_size() -> usize {
    SPECIAL.len() + PUNCTUATION.len() + 20 + WORDS.len()
}

/// Id of a token, if it is in the vocabulary.
pub fn token_id(token: &str) -> Option<u32> {
    tokens().iter().position(|t| t == token).map(|i| i as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_unique_and_sized() {
        let t = tokens();
        assert_eq!(t.len(), vocab_size());
        let mut s = t.clone();
        s.sort();
        s.dedup();
        assert_eq!(s.len(), t.len(), "duplicate token");
        assert_eq!(token_id(BOS), Some(2));
        assert_eq!(token_id(MASK), Some(5));
    }
}
