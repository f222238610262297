use super::pyfns::{py_float_repr, strftime};
use super::*;

/// llava-hf/llava-1.5-7b-hf `chat_template.json`, verbatim.
pub(crate) const LLAVA_15_TEMPLATE: &str = "{% for message in messages %}{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}{% endif %}{# Render all images first #}{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\\n' }}{% endfor %}{# Render all text next #}{% if message['role'] != 'assistant' %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' '}}{% endfor %}{% else %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{% generation %}{{ content['text'] + ' '}}{% endgeneration %}{% endfor %}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}";

fn render(source: &str, messages: &[ChatMessage], agp: bool) -> String {
    ChatTemplate::new(source.to_string())
        .unwrap()
        .render(messages, agp, Some("<s>"), Some("</s>"))
        .unwrap()
}

#[test]
fn llava_15_single_turn() {
    let out = render(
        LLAVA_15_TEMPLATE,
        &[ChatMessage::user("What is this?", 1)],
        true,
    );
    assert_eq!(out, "USER: <image>\nWhat is this? ASSISTANT:");
    let out = render(
        LLAVA_15_TEMPLATE,
        &[ChatMessage::user("What is this?", 1)],
        false,
    );
    assert_eq!(out, "USER: <image>\nWhat is this? ");
}

#[test]
fn llava_15_multi_turn_with_generation_block() {
    let messages = [
        ChatMessage::user("What is this?", 2),
        ChatMessage::assistant("A cat."),
        ChatMessage::user("And its colour?", 0),
    ];
    let out = render(LLAVA_15_TEMPLATE, &messages, true);
    assert_eq!(
        out,
        "USER: <image>\n<image>\nWhat is this? ASSISTANT: A cat. USER: And its colour? ASSISTANT:"
    );
}

#[test]
fn generation_tags_keep_whitespace_control() {
    let src = "{% for m in messages %}[{%- generation -%}\n  {{ m.role }}  \n{%- endgeneration %}]{% endfor %}";
    assert!(rewrite_generation_tags(src).contains("{%- if true -%}"));
    assert!(rewrite_generation_tags(src).contains("{%- endif %}"));
    let out = render(src, &[ChatMessage::user("x", 0)], false);
    assert_eq!(out, "[user]");
    // Other tags and a tag-like text are left alone.
    assert_eq!(
        rewrite_generation_tags("{% generations %}{%"),
        "{% generations %}{%"
    );
}

#[test]
fn hf_environment_whitespace_rules() {
    // trim_blocks removes the newline after a block tag, lstrip_blocks the indentation before it.
    let src = "{% for m in messages %}\n    {% if m.role == 'user' %}\n{{ m.role }}\n    {% endif %}\n{% endfor %}\n";
    let out = render(
        src,
        &[ChatMessage::user("a", 0), ChatMessage::assistant("b")],
        false,
    );
    assert_eq!(out, "user\n");
}

#[test]
fn special_tokens_and_undefined() {
    let src = "{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}";
    let t = ChatTemplate::new(src.to_string()).unwrap();
    assert_eq!(
        t.render(&[], true, Some("<s>"), Some("</s>")).unwrap(),
        "<s>|</s>|True"
    );
    // Python booleans print as True / False, as in Jinja2. Undefined tokens render empty (Jinja2's default Undefined), as when transformers has none.
    assert_eq!(t.render(&[], false, None, None).unwrap(), "||False");
    let t = ChatTemplate::new("{% if bos_token is defined %}x{% endif %}".to_string()).unwrap();
    assert_eq!(t.render(&[], false, None, None).unwrap(), "");
}

#[test]
fn python_methods() {
    let src = "{% for m in messages %}{{ m['role'].upper() }}:{{ m.content[0].text.strip() }}|{% for k, v in m.content[0].items() %}{{ k }}={{ v }};{% endfor %}{{ m.role.startswith('us') }}{% endfor %}";
    let out = render(src, &[ChatMessage::user("  hi  ", 0)], false);
    assert_eq!(out, "USER:hi|type=text;text=  hi  ;True");
}

#[test]
fn loop_controls_and_namespace() {
    let src = "{% set ns = namespace(n=0) %}{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}";
    let msgs = vec![ChatMessage::user("a", 0); 5];
    assert_eq!(render(src, &msgs, false), "2");
}

#[test]
fn raise_exception_is_a_template_error() {
    let src = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}ok";
    let t = ChatTemplate::new(src.to_string()).unwrap();
    let err = t
        .render(&[ChatMessage::system("s")], false, None, None)
        .unwrap_err();
    match err {
        Error::Template(msg) => assert!(msg.contains("System role not supported"), "{msg}"),
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(
        t.render(&[ChatMessage::user("u", 0)], false, None, None)
            .unwrap(),
        "ok"
    );
}

#[test]
fn broken_templates_are_errors() {
    for src in [
        "{% for m in messages %}",
        "{{ messages[0 }}",
        "{% frobnicate %}",
        "{% endif %}",
    ] {
        match ChatTemplate::new(src.to_string()) {
            Err(Error::Template(_)) => {}
            other => panic!("{src}: expected a template error, got {other:?}"),
        }
    }
    // A runtime error (attribute of undefined) is an error, not a panic.
    let t = ChatTemplate::new("{{ messages[3].role.upper() }}".to_string()).unwrap();
    assert!(matches!(
        t.render(&[], false, None, None),
        Err(Error::Template(_))
    ));
}

#[test]
fn tojson_is_python_json_dumps() {
    let msgs = [ChatMessage::user("hi <b> & \"q\" é", 1)];
    assert_eq!(
        render("{{ messages[0] | tojson }}", &msgs, false),
        r#"{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi <b> & \"q\" é"}]}"#
    );
    assert_eq!(
        render(
            "{{ {'b': [1, 2.5, none, true], 'a': 'x\ny'} | tojson(indent=2) }}",
            &[],
            false
        ),
        "{\n  \"a\": \"x\\ny\",\n  \"b\": [\n    1,\n    2.5,\n    null,\n    true\n  ]\n}"
    );
    assert_eq!(
        render("{{ 'é' | tojson(ensure_ascii=true) }}", &[], false),
        "\"\\u00e9\""
    );
    assert_eq!(
        render("{{ [] | tojson }}{{ {} | tojson }}", &[], false),
        "[]{}"
    );
    assert_eq!(
        render("{{ [1,2] | tojson(separators=[',', ':']) }}", &[], false),
        "[1,2]"
    );
}

#[test]
fn python_float_repr() {
    for (f, s) in [
        (1.0, "1.0"),
        (2.5, "2.5"),
        (-0.001, "-0.001"),
        (1e-5, "1e-05"),
        (1.5e16, "1.5e+16"),
        (1e15, "1000000000000000.0"),
        (0.1, "0.1"),
        (123.456, "123.456"),
        (0.0, "0.0"),
        (f64::INFINITY, "Infinity"),
    ] {
        assert_eq!(py_float_repr(f), s, "{f}");
    }
}

#[test]
fn strftime_known_dates() {
    // 2024-02-29 13:05:09 UTC, a Thursday.
    let t = 1_709_211_909;
    assert_eq!(strftime("%d %b %Y", t), "29 Feb 2024");
    assert_eq!(
        strftime("%A %B %-d, %H:%M:%S %p %I %j %y %%", t),
        "Thursday February 29, 13:05:09 PM 01 060 24 %"
    );
    assert_eq!(strftime("%Y-%m-%d %a", 0), "1970-01-01 Thu");
    let _ = render("{{ strftime_now('%d %B %Y') }}", &[], false);
}

#[test]
fn messages_deserialize_from_hf_json() {
    let json = r#"[
        {"role": "user", "content": [{"type": "image", "url": "cat.png"}, {"type": "text", "text": "Hi"}]},
        {"role": "assistant", "content": "Hello"}
    ]"#;
    let msgs: Vec<ChatMessage> = serde_json::from_str(json).unwrap();
    assert_eq!(msgs[0], ChatMessage::user("Hi", 1));
    assert_eq!(msgs[1], ChatMessage::assistant("Hello"));
    assert_eq!(msgs[0].num_images(), 1);
    assert_eq!(msgs[1].text(), "Hello");
    let back = serde_json::to_string(&msgs[0]).unwrap();
    assert_eq!(
        back,
        r#"{"role":"user","content":[{"type":"image"},{"type":"text","text":"Hi"}]}"#
    );
    assert!(serde_json::from_str::<ChatMessage>(
        r#"{"role": "user", "content": [{"type": "audio"}]}"#
    )
    .is_err());
}

#[test]
fn user_message_images_first() {
    let m = ChatMessage::user("q", 2);
    assert_eq!(
        m.content,
        vec![
            ContentPart::Image {},
            ContentPart::Image {},
            ContentPart::Text { text: "q".into() }
        ]
    );
    assert_eq!(
        ChatMessage::user("", 1).content,
        vec![ContentPart::Image {}]
    );
}

#[test]
fn expand_image_tokens_like_llava_processor() {
    assert_eq!(
        expand_image_tokens("a<image>b<image>", "<image>", 3),
        "a<image><image><image>b<image><image><image>"
    );
    assert_eq!(expand_image_tokens("a<image>b", "<image>", 0), "ab");
    assert_eq!(expand_image_tokens("ab", "<image>", 5), "ab");
    assert_eq!(expand_image_tokens("ab", "", 5), "ab");
    assert_eq!(
        expand_image_tokens("<image>", "<image>", 576)
            .matches("<image>")
            .count(),
        576
    );
}

/// Renders `source` and returns the [`Error::Template`] message, timing the render.
fn render_err(source: &str) -> (String, std::time::Duration) {
    let t = ChatTemplate::new(source.to_string()).unwrap();
    let start = std::time::Instant::now();
    let r = t.render(&[ChatMessage::user("hi", 1)], true, Some("<s>"), None);
    let took = start.elapsed();
    match r {
        Err(Error::Template(msg)) => (msg, took),
        other => panic!("expected a template error, got {other:?}"),
    }
}

#[test]
fn endless_loops_run_out_of_fuel() {
    // 10^10 iterations unbounded; the fuel stops it within a second or two on a slow machine.
    let (msg, took) = render_err(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}x",
    );
    assert!(msg.contains("fuel"), "{msg}");
    assert!(took.as_secs_f64() < 10.0, "took {took:?}");
    // A string doubled in a loop: the bytes it creates are charged too (bounded memory).
    let (msg, _) = render_err(
        "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
    );
    assert!(msg.contains("fuel"), "{msg}");
}

#[test]
fn rendered_prompt_size_is_capped() {
    // 100,000 × 1 MB would be 100 GB of prompt.
    let (msg, took) =
        render_err("{% set mb = 'x' * 1000000 %}{% for i in range(100000) %}{{ mb }}{% endfor %}");
    assert!(msg.contains("limit") && msg.contains("MiB"), "{msg}");
    assert!(took.as_secs_f64() < 10.0, "took {took:?}");
    // Just under the cap is fine.
    let n = MAX_RENDERED_BYTES / 1_000_000;
    let src = format!(
        "{{% set mb = 'x' * 1000000 %}}{{% for i in range({n}) %}}{{{{ mb }}}}{{% endfor %}}"
    );
    let out = ChatTemplate::new(src)
        .unwrap()
        .render(&[], false, None, None)
        .unwrap();
    assert_eq!(out.len(), n * 1_000_000);
}

#[test]
fn tool_calls_and_results_reach_the_template() {
    let t = ChatTemplate::new(
        "{% for m in messages %}{{ m.role }}:{% for c in m.tool_calls or [] %}\
         {{ c.function.name }}({{ c.function.arguments.city }}){% endfor %}\
         {{ m.tool_call_id or '' }}|{% endfor %}"
            .into(),
    )
    .unwrap();
    let mut call = ChatMessage::new("assistant", vec![]);
    call.extra.push((
        "tool_calls".into(),
        serde_json::json!([{"id": "c1", "type": "function",
            "function": {"name": "weather", "arguments": {"city": "Oslo"}}}]),
    ));
    let mut result = ChatMessage::new("tool", vec![]);
    result
        .extra
        .push(("tool_call_id".into(), serde_json::json!("c1")));
    assert_eq!(
        t.render(&[call, result], false, None, None).unwrap(),
        "assistant:weather(Oslo)|tool:c1|"
    );
}

#[test]
fn tools_reach_the_template_in_their_key_order() {
    let t = ChatTemplate::new(
        "{% if tools %}{% for t in tools %}{{ t | tojson }};{{ t.function.name }}{% endfor %}\
         {% else %}none{% endif %}"
            .into(),
    )
    .unwrap();
    let tools = serde_json::json!([{"type": "function", "function": {"name": "f",
        "parameters": {"z": 1, "a": [true, null, 1.5, "s"]}}}]);
    assert_eq!(
        t.render_with(&[], false, None, None, Some(&tools)).unwrap(),
        r#"{"type": "function", "function": {"name": "f", "parameters": {"z": 1, "a": [true, null, 1.5, "s"]}}};f"#
    );
    // Without tools the variable is undefined, as in transformers.
    assert_eq!(t.render(&[], false, None, None).unwrap(), "none");
}
