//! Pre- and post-processing: images, text (tokenizer, streaming detokeniser) and chat templates.

pub mod chat;
pub mod image;
pub mod sized;
pub mod tokenizer;
