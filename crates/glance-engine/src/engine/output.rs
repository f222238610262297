//! The one output processor every request goes through, whatever its strategy and however it
//! is scheduled: log-probabilities, incremental detokenising, stop strings (held back until they
//! cannot match, cut where they do), cancellation, the streamed events and the finish reason.

use crate::request::{Event, FinishReason, Flow};
use glance_core::Result;
use glance_decode::stop::StopStatus;
use glance_decode::{LogprobSink, StopStrings, TokenLogprob};
use glance_models::processing::tokenizer::StreamDecoder;
use std::time::Instant;

/// One request's text as its tokens arrive.
pub(crate) struct Output<'e> {
    on_event: Box<dyn FnMut(Event) -> Flow + Send + 'e>,
    /// Where the sampler records log-probabilities, and those of the tokens taken so far.
    logprobs: Option<(LogprobSink, Vec<TokenLogprob>)>,
    stream: StreamDecoder<'e>,
    stops: StopStrings,
    pub text: String,
    /// Where each token's text ends in `text`, in bytes.
    pub token_ends: Vec<usize>,
    /// Set when the output itself ended the answer (a stop string, a cancellation).
    ended: Option<FinishReason>,
    /// When the first token arrived.
    pub first_token: Option<Instant>,
}

impl<'e> Output<'e> {
    pub fn new(
        on_event: Box<dyn FnMut(Event) -> Flow + Send + 'e>,
        logprobs: Option<LogprobSink>,
        stream: StreamDecoder<'e>,
        stop: Vec<String>,
    ) -> Self {
        Self {
            on_event,
            logprobs: logprobs.map(|s| (s, Vec::new())),
            stream,
            stops: StopStrings::new(stop),
            text: String::new(),
            token_ends: Vec::new(),
            ended: None,
            first_token: None,
        }
    }

    fn emit(&mut self, piece: &str) -> Flow {
        if piece.is_empty() {
            return Flow::Continue;
        }
        self.text.push_str(piece);
        (self.on_event)(Event::Text(piece))
    }

    /// Takes the next token; `true` asks the strategy to stop after it (a stop string matched,
    /// or the receiver cancelled).
    pub fn push(&mut self, id: u32) -> Result<bool> {
        self.first_token.get_or_insert_with(Instant::now);
        if let Some((sink, out)) = &mut self.logprobs {
            let entry = super::take_logprob(sink, out.len(), id)?;
            let flow = (self.on_event)(Event::Logprob(&entry));
            out.push(entry);
            if flow == Flow::Cancel {
                self.ended = Some(FinishReason::Cancelled);
                return Ok(true);
            }
        }
        let piece = self.stream.push(id)?;
        let (released, stop) = match self.stops.push(&piece) {
            StopStatus::Continue(s) => (s, false),
            StopStatus::Stopped(s) => (s, true),
        };
        let flow = self.emit(&released);
        self.token_ends.push(self.text.len());
        if flow == Flow::Cancel {
            self.ended = Some(FinishReason::Cancelled);
            return Ok(true);
        }
        if stop {
            self.ended = Some(FinishReason::Stop);
        }
        Ok(stop)
    }

    /// The generation ended (`finish`, as the strategy says): releases what the detokeniser
    /// and the stop matcher still hold, and returns the answer's finish reason.
    pub fn finish(&mut self, finish: glance_decode::FinishReason) -> Result<FinishReason> {
        if let Some(reason) = self.ended {
            return Ok(reason);
        }
        let tail = self.stream.finish()?;
        let (released, stopped) = match self.stops.push(&tail) {
            StopStatus::Continue(s) => (s + &self.stops.finish(), false),
            StopStatus::Stopped(s) => (s, true),
        };
        let flow = self.emit(&released);
        if let Some(last) = self.token_ends.last_mut() {
            *last = self.text.len();
        }
        Ok(if flow == Flow::Cancel {
            FinishReason::Cancelled
        } else if stopped {
            FinishReason::Stop
        } else {
            match finish {
                glance_decode::FinishReason::Eos => FinishReason::Eos,
                glance_decode::FinishReason::Length => FinishReason::Length,
                glance_decode::FinishReason::Stop => FinishReason::Stop,
            }
        })
    }

    /// The recorded log-probabilities, if asked for.
    pub fn take_logprobs(&mut self) -> Option<Vec<TokenLogprob>> {
        self.logprobs.take().map(|(_, l)| l)
    }
}
