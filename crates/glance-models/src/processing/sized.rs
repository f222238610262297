//! Prompts of families whose images take a size-dependent number of tokens (Qwen2-VL, InternVL):
//! the chat template renders the conversation, then each image placeholder is expanded to that
//! image's count ([`crate::processing::chat::SizedImages`]). One implementation of the prompt
//! API for every such processor; each supplies its text side, token counts and expansion.

use crate::llava::{PreparedPrompt, PromptFormat};
use crate::processing::chat::{cut_after_final, ChatMessage};
use crate::processing::tokenizer::TextProcessor;
use glance_core::{Error, Result};

/// A processor whose images' token counts depend on their sizes.
pub trait SizedPrompts {
    /// The tokenizer and chat template.
    fn text(&self) -> &TextProcessor;
    /// The model family, for errors ("Qwen2-VL").
    fn family(&self) -> &'static str;
    /// Image tokens an image of `height × width` pixels takes in the prompt.
    fn tokens_for(&self, height: usize, width: usize) -> Result<usize>;
    /// Expands the `i`-th image placeholder of `text` to `tokens[i]` image tokens and tokenises.
    fn tokenize(
        &self,
        text: String,
        tokens: &[usize],
        format: PromptFormat,
    ) -> Result<PreparedPrompt>;

    /// `prompt` as one user turn (images first) in `Chat` format, or as given (a placeholder
    /// where each image goes) in `Raw`.
    fn prepare(
        &self,
        prompt: &str,
        tokens: &[usize],
        format: PromptFormat,
    ) -> Result<PreparedPrompt> {
        match format {
            PromptFormat::Raw => self.tokenize(prompt.to_string(), tokens, format),
            PromptFormat::Chat => {
                self.prepare_chat(&[ChatMessage::user(prompt, tokens.len())], tokens)
            }
        }
    }

    /// Renders a conversation with the chat template (generation prompt added) and tokenises it
    /// with `tokens[i]` image tokens for the `i`-th image.
    fn prepare_chat(&self, messages: &[ChatMessage], tokens: &[usize]) -> Result<PreparedPrompt> {
        self.prepare_chat_with(messages, tokens, None)
    }

    /// [`Self::prepare_chat`] with the template's `tools` variable.
    fn prepare_chat_with(
        &self,
        messages: &[ChatMessage],
        tokens: &[usize],
        tools: Option<&serde_json::Value>,
    ) -> Result<PreparedPrompt> {
        if self.text().chat_template().is_none() {
            return Err(Error::Template(format!(
                "this {} checkpoint has no chat template (tokenizer_config.json, \
                 chat_template.json or chat_template.jinja)",
                self.family()
            )));
        }
        let text = self
            .text()
            .apply_chat_template_with(messages, true, tools)?;
        self.tokenize(text, tokens, PromptFormat::Chat)
    }

    /// A conversation whose last message is continued rather than answered (as
    /// [`crate::llava::LlavaProcessor::prepare_continuation`]).
    fn prepare_continuation(
        &self,
        messages: &[ChatMessage],
        tokens: &[usize],
    ) -> Result<PreparedPrompt> {
        self.prepare_continuation_with(messages, tokens, None)
    }

    /// [`Self::prepare_continuation`] with the template's `tools` variable.
    fn prepare_continuation_with(
        &self,
        messages: &[ChatMessage],
        tokens: &[usize],
        tools: Option<&serde_json::Value>,
    ) -> Result<PreparedPrompt> {
        let full = self
            .text()
            .apply_chat_template_with(messages, false, tools)?;
        self.tokenize(
            cut_after_final(&full, messages)?,
            tokens,
            PromptFormat::Chat,
        )
    }
}
