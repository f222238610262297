//! Structured output and tool calls against a real `glance serve` on the llama-gqa fixture (a
//! byte-fallback vocabulary; random weights, so only the grammar makes the answers JSON):
//! `json_schema` answers validate on 20 prompts, streamed or not, chat or legacy; `json_object`
//! answers are objects; tools reach the chat template and forced calls come back as `tool_calls`;
//! glance-tiny refuses both clearly; the official `openai` client reads them.

mod common;
mod serve_common;

use common::*;
use serde_json::{json, Value};
use serve_common::*;
use std::process::Command;

/// Every string and list short and every number small: an answer ends within a few hundred
/// tokens whatever the weights.
fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "count": {"type": "integer", "minimum": 0, "maximum": 99},
            "ok": {"type": "boolean"},
            "color": {"enum": ["red", "green", "blue"]},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "maxItems": 2}
        },
        "required": ["name", "count", "ok", "color", "tags"],
        "additionalProperties": false
    })
}

/// `text` is JSON valid under [`schema`] (checked property by property).
fn assert_valid(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    let o = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {text}"));
    let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["color", "count", "name", "ok", "tags"], "{text}");
    let short = |v: &Value, n: usize| v.as_str().is_some_and(|s| s.chars().count() <= n);
    assert!(short(&o["name"], 6), "{text}");
    assert!(o["count"].as_u64().is_some_and(|c| c <= 99), "{text}");
    assert!(o["ok"].is_boolean(), "{text}");
    assert!(
        ["red", "green", "blue"].contains(&o["color"].as_str().unwrap_or("")),
        "{text}"
    );
    let tags = o["tags"].as_array().unwrap();
    assert!(
        tags.len() <= 2 && tags.iter().all(|t| short(t, 3)),
        "{text}"
    );
}

fn fixture_server() -> Server {
    Server::start(&["--model", &fixture_str("models/llama-gqa")])
}

fn chat(question: &str, extra: Value) -> Value {
    let mut b = json!({
        "model": "llama-gqa",
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 400,
    });
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

fn ok(server: &Server, b: &Value) -> Value {
    let (status, v) = server.chat(b);
    assert_eq!(status, 200, "{b}: {v}");
    v
}

fn format() -> Value {
    json!({"type": "json_schema", "json_schema": {"name": "thing", "schema": schema()}})
}

#[test]
fn json_schema_answers_validate_on_20_prompts_streamed_or_not() {
    let server = fixture_server();
    for i in 0..20 {
        // Greedy and seeded sampling, over different prompts.
        let sampling = if i % 2 == 0 {
            json!({"temperature": 0})
        } else {
            json!({"temperature": 1.0, "seed": i})
        };
        let mut extra = json!({"response_format": format()});
        extra
            .as_object_mut()
            .unwrap()
            .extend(sampling.as_object().unwrap().clone());
        let b = chat(&format!("Describe thing number {i} as JSON."), extra);
        let v = ok(&server, &b);
        let choice = &v["choices"][0];
        assert_eq!(choice["finish_reason"], "stop", "{v}");
        let text = choice["message"]["content"].as_str().unwrap();
        assert_valid(text);
        if i < 4 {
            // Streamed: the same answer, chunk by chunk.
            let mut sb = b.clone();
            sb["stream"] = json!(true);
            let (status, events) = server.chat_stream(&sb);
            assert_eq!(status, 200);
            assert_eq!(stream_text(&events), text, "prompt {i}");
        }
    }
    // json_object: an object whenever the answer ended on its own.
    let b = chat(
        "Anything as JSON.",
        json!({"temperature": 0, "response_format": {"type": "json_object"}}),
    );
    let v = ok(&server, &b);
    if v["choices"][0]["finish_reason"] == "stop" {
        let text = v["choices"][0]["message"]["content"].as_str().unwrap();
        assert!(
            serde_json::from_str::<Value>(text).unwrap().is_object(),
            "{text}"
        );
    }
    // Legacy completions take it too.
    let lb = json!({"model": "llama-gqa", "prompt": "A thing:", "max_tokens": 400,
                    "temperature": 0, "response_format": format()});
    let (status, body) = server.request("POST", "/v1/completions", Some(&lb.to_string()));
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_valid(v["choices"][0]["text"].as_str().unwrap());
    // Bad formats and schemas are 400s naming the field.
    for (rf, needle) in [
        (json!({"type": "yaml"}), "type must be"),
        (
            json!({"type": "json_schema", "json_schema": {"name": "x"}}),
            "schema is required",
        ),
        (
            json!({"type": "json_schema", "json_schema": {"schema": {"type": 7}}}),
            "not usable",
        ),
    ] {
        let (status, v) = server.chat(&chat("x", json!({"response_format": rf})));
        assert_eq!(status, 400, "{v}");
        assert_eq!(v["error"]["param"], "response_format");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(needle),
            "{v}"
        );
    }
    for (field, value) in [("ignore_eos", json!(true)), ("min_tokens", json!(5))] {
        let (status, v) = server.chat(&chat(
            "x",
            json!({"response_format": format(), field: value}),
        ));
        assert_eq!(status, 400, "{v}");
        assert_eq!(v["error"]["param"], field, "{v}");
    }
}

/// One small tool: the fixture's context is 512 tokens, and its byte-level vocabulary spells
/// JSON nearly a token a character.
fn weather_tools() -> Value {
    json!([{"type": "function", "function": {"name": "weather", "parameters": {"type": "object",
        "properties": {"city": {"enum": ["Paris", "Oslo"]}}, "required": ["city"],
        "additionalProperties": false}}}])
}

/// A call's arguments are valid under the tool's schema.
fn assert_call(call: &Value) {
    assert!(call["id"].as_str().unwrap().starts_with("call_"), "{call}");
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "weather");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(
        ["Paris", "Oslo"].contains(&args["city"].as_str().unwrap_or("")),
        "{args}"
    );
    assert_eq!(args.as_object().unwrap().len(), 1, "{args}");
}

#[test]
fn tools_reach_the_template_and_forced_calls_come_back_as_tool_calls() {
    let server = fixture_server();
    let q = "What is the weather in Paris?";
    let plain = ok(
        &server,
        &chat(q, json!({"temperature": 0, "max_tokens": 8})),
    );
    // `auto`: the tools are rendered into the prompt; the random model calls nothing.
    let auto = ok(
        &server,
        &chat(
            q,
            json!({"temperature": 0, "max_tokens": 8, "tools": weather_tools()}),
        ),
    );
    assert!(
        auto["usage"]["prompt_tokens"].as_u64().unwrap()
            > plain["usage"]["prompt_tokens"].as_u64().unwrap() + 50,
        "{auto} {plain}"
    );
    assert!(
        auto["choices"][0]["message"]["tool_calls"].is_null(),
        "{auto}"
    );
    // Streamed, `auto` content arrives as it comes (held back only where a call may start).
    let mut sb = chat(
        q,
        json!({"temperature": 0, "max_tokens": 8, "tools": weather_tools()}),
    );
    sb["stream"] = json!(true);
    let (status, events) = server.chat_stream(&sb);
    assert_eq!(status, 200);
    let text = auto["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(stream_text(&events), text);
    let pieces = events
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|t| !t.is_empty())
        })
        .count();
    assert!(pieces >= 2, "{events:?}");
    // A conversation that carries a call and its result back to the template.
    let mut b = chat(
        q,
        json!({"temperature": 0, "max_tokens": 8, "tools": weather_tools()}),
    );
    b["messages"] = json!([
        {"role": "user", "content": q},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"}]);
    let v = ok(&server, &b);
    assert!(
        v["usage"]["prompt_tokens"].as_u64().unwrap()
            > auto["usage"]["prompt_tokens"].as_u64().unwrap() + 30,
        "{v}"
    );
    b["messages"][1]["tool_calls"][0]["function"]["arguments"] = json!("{not json");
    let (status, v) = server.chat(&b);
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("not JSON"),
        "{v}"
    );
    // A named function: its arguments, decoded under its schema.
    let named = json!({"type": "function", "function": {"name": "weather"}});
    let b = chat(
        q,
        json!({"temperature": 0, "tools": weather_tools(), "tool_choice": named}),
    );
    let v = ok(&server, &b);
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    assert!(choice["message"]["content"].is_null(), "{v}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["function"]["name"], "weather");
    assert_call(&calls[0]);
    // Streamed: the same call in one delta with its index, then the finish reason.
    let mut sb = b.clone();
    sb["stream"] = json!(true);
    let (status, events) = server.chat_stream(&sb);
    assert_eq!(status, 200);
    let chunks: Vec<Value> = events
        .iter()
        .filter_map(|e| serde_json::from_str(e).ok())
        .collect();
    let deltas: Vec<&Value> = chunks
        .iter()
        .filter(|c| !c["choices"][0]["delta"]["tool_calls"].is_null())
        .collect();
    assert_eq!(deltas.len(), 1, "{events:?}");
    let streamed = &deltas[0]["choices"][0]["delta"]["tool_calls"][0];
    assert_eq!(streamed["index"], 0);
    assert_eq!(streamed["function"], calls[0]["function"]);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "tool_calls"
    );
    // `required`, one call: any of the tools, with valid arguments; seeded sampling too.
    for extra in [
        json!({"temperature": 0}),
        json!({"temperature": 1.0, "seed": 3}),
    ] {
        let mut e = json!({"tools": weather_tools(), "tool_choice": "required",
                           "parallel_tool_calls": false, "max_tokens": 100});
        e.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let v = ok(&server, &chat(q, e));
        let calls = v["choices"][0]["message"]["tool_calls"]
            .as_array()
            .unwrap()
            .clone();
        assert_eq!(calls.len(), 1, "{v}");
        assert_call(&calls[0]);
    }
    // Bad tool requests are 400s.
    for (extra, param) in [
        (json!({"tool_choice": "required"}), "tool_choice"),
        (
            json!({"tools": weather_tools(), "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice",
        ),
        (json!({"tools": [{"type": "function"}]}), "tools"),
        (
            json!({"tools": weather_tools(), "tool_choice": "required", "response_format": format()}),
            "response_format",
        ),
    ] {
        let (status, v) = server.chat(&chat(q, extra));
        assert_eq!(status, 400, "{v}");
        assert_eq!(v["error"]["param"], param, "{v}");
    }
}

/// glance-tiny: structured output is refused because its vocabulary cannot spell JSON, tools
/// because it has no template that renders them.
#[test]
fn glance_tiny_refuses_json_and_tools_saying_why() {
    let tiny = Server::start(&[]);
    let body = |field: &str, value: Value| json!({"model": "glance-tiny", "messages": [{"role": "user", "content": "hi"}], field: value});
    for rf in [json!({"type": "json_object"}), format()] {
        let (status, v) = tiny.chat(&body("response_format", rf));
        assert_eq!(status, 400, "{v}");
        assert_eq!(v["error"]["param"], "response_format");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("cannot spell JSON"),
            "{v}"
        );
    }
    let (status, v) = tiny.chat(&body("tools", weather_tools()));
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "tools");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("chat template"),
        "{v}"
    );
}

/// The official `openai` client: `response_format` with a schema, and a forced tool call read
/// back as `tool_calls` (skipped without the package, except in CI).
#[test]
fn the_openai_client_reads_structured_answers_and_tool_calls() {
    if Command::new("python3")
        .args(["-c", "import openai"])
        .status()
        .map_or(true, |s| !s.success())
    {
        assert!(
            std::env::var_os("CI").is_none(),
            "no openai package in CI (.ci/python-deps)"
        );
        eprintln!("skipped: no openai package");
        return;
    }
    let server = fixture_server();
    let script = format!(
        r#"
import json
from openai import OpenAI
client = OpenAI(base_url="http://{addr}/v1", api_key="unused")
schema = json.loads('''{schema}''')
tools = json.loads('''{tools}''')
r = client.chat.completions.create(
    model="llama-gqa", messages=[{{"role": "user", "content": "A thing as JSON."}}],
    max_tokens=400, temperature=0,
    response_format={{"type": "json_schema", "json_schema": {{"name": "thing", "schema": schema}}}})
print(r.choices[0].message.content)
r = client.chat.completions.create(
    model="llama-gqa", messages=[{{"role": "user", "content": "Weather?"}}],
    max_tokens=100, temperature=0, tools=tools,
    tool_choice={{"type": "function", "function": {{"name": "weather"}}}})
c = r.choices[0].message.tool_calls[0]
print(json.dumps({{"id": c.id, "type": c.type,
                  "function": {{"name": c.function.name, "arguments": c.function.arguments}}}}))
print(r.choices[0].finish_reason)
"#,
        addr = server.addr,
        schema = schema(),
        tools = weather_tools(),
    );
    let out = Command::new("python3")
        .args(["-c", &script])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    assert_valid(lines[0]);
    let call: Value = serde_json::from_str(lines[1]).unwrap();
    assert_eq!(call["function"]["name"], "weather");
    assert_call(&call);
    assert_eq!(lines[2], "tool_calls");
}
