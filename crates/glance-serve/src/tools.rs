//! Tool calls: `tools` and `tool_choice` through the model's chat template, and the answer
//! parsed back into OpenAI's `tool_calls`.
//!
//! The tools reach the template as its `tools` variable (as transformers'
//! `apply_chat_template(messages, tools=…)` passes them); a template that never reads `tools`
//! cannot show them to the model, so the request is refused. How the answer is read depends on
//! `tool_choice`, as vLLM does it (`vllm/entrypoints/openai/serving_chat.py`):
//!
//! * `auto` (the default with tools): the model decides; every `<tool_call>{"name": …,
//!   "arguments": …}</tool_call>` block of the answer (the Hermes / Qwen format) is a call, the
//!   rest is the message's content;
//! * a named function: the answer is decoded under that function's `parameters` schema and is
//!   the call's `arguments`;
//! * `required`: the answer is decoded as a JSON array of `{"name", "parameters"}` (one item
//!   without `parallel_tool_calls`), each a call;
//! * `none`: the tools are shown, the answer is text.

use crate::error::ApiError;
use crate::openai::{Ids, Shape};
use glance_engine::{Engine, FinishReason, OutputFormat, Response};
use serde_json::{json, Value};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// How a request uses its tools.
#[derive(Debug, Clone, PartialEq)]
pub enum Choice {
    None,
    Auto,
    Required,
    Named(String),
}

/// The tools of a request and how the answer is read.
#[derive(Debug, Clone, PartialEq)]
pub struct Tools {
    /// As the request gives them (`{"type": "function", "function": {…}}`), for the template.
    pub list: Vec<Value>,
    pub choice: Choice,
    pub parallel: bool,
}

/// One call parsed from an answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub name: String,
    /// The arguments as a JSON text (OpenAI's form).
    pub arguments: String,
}

impl Tools {
    /// The tools of a request; `None` without tools (a `tool_choice` other than `none` / `auto`
    /// then is a 400).
    pub fn parse(
        tools: Option<&[Value]>,
        choice: Option<&Value>,
        parallel: Option<bool>,
    ) -> Result<Option<Self>, ApiError> {
        let list = tools.unwrap_or_default();
        let choice = match choice {
            None | Some(Value::Null) => Choice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "auto" => Choice::Auto,
                "none" => Choice::None,
                "required" => Choice::Required,
                other => {
                    return Err(ApiError::bad_param(
                        "tool_choice",
                        format!(
                            "tool_choice must be `none`, `auto`, `required` or a function, got \
                             `{other}`"
                        ),
                    ))
                }
            },
            Some(v) => match v.pointer("/function/name").and_then(Value::as_str) {
                Some(name) if v.get("type").and_then(Value::as_str) == Some("function") => {
                    Choice::Named(name.to_string())
                }
                _ => {
                    return Err(ApiError::bad_param(
                        "tool_choice",
                        format!(
                            "tool_choice must be {{\"type\": \"function\", \"function\": \
                             {{\"name\": …}}}}, got {v}"
                        ),
                    ))
                }
            },
        };
        if list.is_empty() {
            return match choice {
                Choice::None | Choice::Auto => Ok(None),
                _ => Err(ApiError::bad_param(
                    "tool_choice",
                    "tool_choice names a tool, but the request has no tools",
                )),
            };
        }
        for (i, t) in list.iter().enumerate() {
            let ok = t.get("type").and_then(Value::as_str) == Some("function")
                && t.pointer("/function/name").is_some_and(Value::is_string)
                && t.pointer("/function/parameters")
                    .is_none_or(|p| p.is_object() || p.is_null());
            if !ok {
                return Err(ApiError::bad_param(
                    "tools",
                    format!(
                        "tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": …, \
                         \"parameters\": {{…}}}}}}"
                    ),
                ));
            }
        }
        let tools = Self {
            list: list.to_vec(),
            choice,
            parallel: parallel.unwrap_or(true),
        };
        if let Choice::Named(n) = &tools.choice {
            if tools.parameters(n).is_none() {
                return Err(ApiError::bad_param(
                    "tool_choice",
                    format!("tool_choice names `{n}`, which is not among the tools"),
                ));
            }
        }
        Ok(Some(tools))
    }

    /// The JSON schema of function `name`'s parameters (any object when it gives none).
    fn parameters(&self, name: &str) -> Option<Value> {
        self.list
            .iter()
            .find(|t| t.pointer("/function/name").and_then(Value::as_str) == Some(name))
            .map(|t| match t.pointer("/function/parameters") {
                Some(p) if p.is_object() => p.clone(),
                _ => json!({"type": "object"}),
            })
    }

    /// The grammar the answer follows: a forced call's JSON (`None` for `auto` and `none`).
    pub fn format(&self) -> Option<OutputFormat> {
        match &self.choice {
            Choice::None | Choice::Auto => None,
            Choice::Named(n) => self.parameters(n).map(OutputFormat::JsonSchema),
            Choice::Required => {
                let items: Vec<Value> = self
                    .list
                    .iter()
                    .filter_map(|t| t.pointer("/function/name").and_then(Value::as_str))
                    .map(|n| {
                        json!({"type": "object",
                               "properties": {"name": {"const": n},
                                              "parameters": self.parameters(n)},
                               "required": ["name", "parameters"],
                               "additionalProperties": false})
                    })
                    .collect();
                let mut schema = json!({"type": "array", "minItems": 1, "items": {"anyOf": items}});
                if !self.parallel {
                    schema["maxItems"] = json!(1);
                }
                Some(OutputFormat::JsonSchema(schema))
            }
        }
    }

    /// Refuses tools on a model whose chat template never reads `tools` (glance-tiny has no
    /// template at all), and a forced call on a vocabulary that cannot spell JSON.
    pub fn check(&self, engine: &Engine) -> Result<(), ApiError> {
        let template = engine.processor().text.chat_template();
        if !template.is_some_and(|t| t.source().contains("tools")) {
            return Err(ApiError::bad_param(
                "tools",
                "tools: this model's chat template does not render tools (it never reads the \
                 `tools` variable), so the model cannot be shown them",
            ));
        }
        match self.format() {
            Some(f) => crate::structured::check(engine, &f, "tool_choice"),
            None => Ok(()),
        }
    }

    /// The content and calls of an answer `text`.
    pub fn read(&self, text: &str) -> (Option<String>, Vec<Call>) {
        let content = |s: &str| Some(s.to_string()).filter(|s| !s.trim().is_empty());
        match &self.choice {
            Choice::None => (content(text), Vec::new()),
            Choice::Named(name) => (
                None,
                vec![Call {
                    name: name.clone(),
                    arguments: text.trim().to_string(),
                }],
            ),
            Choice::Required => match serde_json::from_str::<Vec<Value>>(text.trim()) {
                Ok(items) => (None, items.iter().filter_map(call_of).collect()),
                // Cut short (max_tokens): no call can be read.
                Err(_) => (content(text), Vec::new()),
            },
            Choice::Auto => {
                let mut rest = String::new();
                let mut calls = Vec::new();
                let mut at = text;
                while let Some(start) = at.find(OPEN) {
                    let after = &at[start + OPEN.len()..];
                    let Some(end) = after.find(CLOSE) else { break };
                    let block_end = start + OPEN.len() + end + CLOSE.len();
                    let call = serde_json::from_str::<Value>(after[..end].trim())
                        .ok()
                        .as_ref()
                        .and_then(call_of);
                    match call {
                        Some(c) => {
                            rest.push_str(&at[..start]);
                            calls.push(c);
                        }
                        None => rest.push_str(&at[..block_end]),
                    }
                    at = &at[block_end..];
                }
                rest.push_str(at);
                (content(rest.trim()), calls)
            }
        }
    }
}

/// The content and the tool calls of an answer's `text` (or of its part not yet streamed), ended
/// for `finish`: with tools, the calls `text` makes (none when it was cut short); the whole text
/// is the content when it makes none.
pub fn answer_parts(
    shape: &Shape,
    text: &str,
    finish: FinishReason,
) -> (Option<String>, Vec<Call>) {
    match shape.calls() {
        Some(tools) if finish != FinishReason::Length => match tools.read(text) {
            (_, calls) if calls.is_empty() => (Some(text.to_string()), calls),
            read => read,
        },
        _ => (Some(text.to_string()), Vec::new()),
    }
}

/// Choice `r`'s message (`content`, and `tool_calls` read from the answer when the request has
/// tools) and finish reason (`tool_calls` when it made calls).
pub fn message(
    ids: &Ids,
    index: usize,
    r: &Response,
    shape: &Shape,
) -> (Value, Option<&'static str>) {
    let (content, calls) = answer_parts(shape, &r.text, r.finish_reason);
    if calls.is_empty() {
        return (
            json!({"role": "assistant", "content": content}),
            crate::openai::finish_reason(r.finish_reason),
        );
    }
    let calls = calls_json(&calls, &ids.id, index);
    (
        json!({"role": "assistant", "content": content, "tool_calls": calls}),
        Some("tool_calls"),
    )
}

/// How much of an answer with tools offered (`auto`) can be streamed as content: everything
/// before its first `<tool_call>`, less a tail that may be the start of one.
pub fn sendable(text: &str) -> usize {
    if let Some(at) = text.find(OPEN) {
        return at;
    }
    let tail = (1..OPEN.len())
        .rev()
        .find(|&k| text.ends_with(&OPEN[..k]))
        .unwrap_or(0);
    text.len() - tail
}

/// A call from `{"name": …, "arguments" | "parameters": {…} or a JSON text}`.
fn call_of(v: &Value) -> Option<Call> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = v.get("arguments").or_else(|| v.get("parameters"));
    let arguments = match args {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    };
    Some(Call { name, arguments })
}

/// OpenAI's `tool_calls` of a message; ids are unique per completion
/// (`call_<completion id>_<choice>_<k>`).
pub fn calls_json(calls: &[Call], id: &str, choice: usize) -> Value {
    Value::Array(
        calls
            .iter()
            .enumerate()
            .map(|(k, c)| {
                json!({
                    "id": format!("call_{}_{choice}_{k}", id.trim_start_matches("chatcmpl-")),
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools(choice: Value) -> Tools {
        let list = vec![
            json!({"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}),
        ];
        Tools::parse(Some(&list), Some(&choice), None)
            .unwrap()
            .unwrap()
    }

    #[test]
    fn tool_choices_parse_and_bad_ones_are_400s() {
        assert_eq!(tools(json!("auto")).choice, Choice::Auto);
        assert_eq!(tools(Value::Null).choice, Choice::Auto);
        assert_eq!(tools(json!("required")).choice, Choice::Required);
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        assert_eq!(tools(named).choice, Choice::Named("get_weather".into()));
        assert_eq!(
            Tools::parse(None, Some(&json!("auto")), None).unwrap(),
            None
        );
        let list = vec![json!({"type": "function", "function": {"name": "f"}})];
        for (list, choice, param) in [
            (vec![], json!("required"), "tool_choice"),
            (list.clone(), json!("sometimes"), "tool_choice"),
            (
                list.clone(),
                json!({"type": "function", "function": {"name": "g"}}),
                "tool_choice",
            ),
            (vec![json!({"type": "function"})], json!("auto"), "tools"),
        ] {
            let e = Tools::parse(Some(&list), Some(&choice), None).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{choice}");
        }
    }

    #[test]
    fn answers_are_read_into_calls() {
        let auto = tools(json!("auto"));
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \
                    {\"city\": \"Paris\"}}\n</tool_call>";
        let (content, calls) = auto.read(text);
        assert_eq!(content.as_deref(), Some("Let me check."));
        assert_eq!(
            calls,
            vec![Call {
                name: "get_weather".into(),
                arguments: "{\"city\":\"Paris\"}".into()
            }]
        );
        // No call, or a broken one: all content.
        assert_eq!(auto.read("Sunny."), (Some("Sunny.".into()), vec![]));
        let broken = "<tool_call>{\"name\": </tool_call> x";
        assert_eq!(auto.read(broken), (Some(broken.into()), vec![]));
        let (content, calls) = tools(json!("required"))
            .read("[{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}]");
        assert_eq!((content, calls.len()), (None, 1));
        assert_eq!(calls[0].arguments, "{\"city\":\"Oslo\"}");
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        let (_, calls) = tools(named).read("{\"city\": \"Rome\"}");
        assert_eq!(calls[0].name, "get_weather");
        let j = calls_json(&calls, "chatcmpl-ab", 0);
        assert_eq!(j[0]["id"], "call_ab_0_0");
        assert_eq!(j[0]["function"]["arguments"], "{\"city\": \"Rome\"}");
    }

    #[test]
    fn content_streams_up_to_what_may_start_a_call() {
        assert_eq!(sendable("Sunny today."), 12);
        assert_eq!(sendable("Let me see <tool"), 11);
        assert_eq!(sendable("a <"), 2);
        assert_eq!(sendable("a <b"), 4);
        assert_eq!(sendable("x<tool_call>{\"name\""), 1);
        assert_eq!(sendable("é<tool_call"), "é".len());
    }

    #[test]
    fn forced_calls_have_a_grammar() {
        assert_eq!(tools(json!("auto")).format(), None);
        let Some(OutputFormat::JsonSchema(s)) = tools(json!("required")).format() else {
            panic!("no schema")
        };
        assert_eq!(s["minItems"], 1);
        assert_eq!(
            s["items"]["anyOf"][0]["properties"]["name"]["const"],
            "get_weather"
        );
    }
}
