//! The request translation: bodies, options and their errors.

use super::*;

fn defaults() -> Defaults {
    Defaults {
        max_tokens: 16,
        prune: None,
        decode: DecodeSpec::Autoregressive,
        strict: true,
    }
}

fn convert(body: Value) -> Result<(Request, Shape), ApiError> {
    let (mut r, s) = ChatRequest::parse(body.to_string().as_bytes())?.into_requests(
        "m",
        &ImageSources::DataOnly,
        4,
        &defaults(),
    )?;
    Ok((r.remove(0), s))
}

#[test]
fn sampling_extras_translate_and_unknown_fields_are_ignored_unless_strict() {
    let body = json!({
        "messages": [{"role": "user", "content": "hi"}],
        "top_k": -1, "min_p": 0, "repetition_penalty": 1.3, "presence_penalty": 0.5,
        "frequency_penalty": -0.5, "logit_bias": {"7": -100, "3": 2.5}, "ignore_eos": true,
        "min_tokens": 4, "logprobs": true, "top_logprobs": 3, "vendor_x": {"a": 1}
    });
    let lenient = Defaults {
        strict: false,
        ..defaults()
    };
    let (r, s) = ChatRequest::parse(body.to_string().as_bytes())
        .unwrap()
        .into_requests("m", &ImageSources::DataOnly, 4, &lenient)
        .unwrap();
    let r = &r[0];
    let p = &r.sampling;
    assert_eq!((p.top_k, p.min_p, p.min_tokens), (0, 0.0, 4));
    assert_eq!(
        (
            p.repetition_penalty,
            p.presence_penalty,
            p.frequency_penalty
        ),
        (1.3, 0.5, -0.5)
    );
    assert_eq!(p.logit_bias, [(7, -100.0), (3, 2.5)].into());
    assert!(r.ignore_eos && s.logprobs);
    assert_eq!(r.logprobs, Some(3));
    assert_eq!(s.ignored, vec!["vendor_x".to_string()]);
    let e = convert(body).unwrap_err();
    assert_eq!(e.param.as_deref(), Some("vendor_x"));
    assert!(e.message.contains("--strict"), "{}", e.message);
    // An assistant message last is continued; a user message last starts a new turn.
    let (r, _) = convert(json!({"messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "A"}]}))
    .unwrap();
    assert!(r.continue_final_message);
    let (r, _) = convert(json!({"messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "A"}],
        "add_generation_prompt": true}))
    .unwrap();
    assert!(!r.continue_final_message);
}

#[test]
fn requests_translate_with_defaults_and_options() {
    let (r, s) = convert(json!({
        "model": "m", "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0, "max_tokens": 5, "stop": "x", "seed": 3, "n": 1,
        "user": "u", "logprobs": false, "frequency_penalty": 0,
        "stream": true, "stream_options": {"include_usage": true},
        "glance": {"prune": {"policy": "pool", "keep": "50%"}, "decode": "ar"}
    }))
    .unwrap();
    assert!(s.stream && s.include_usage);
    assert_eq!(r.max_new_tokens, 5);
    assert_eq!(r.stop, vec!["x".to_string()]);
    assert_eq!(r.sampling.seed, 3);
    let p = r.prune.unwrap();
    assert_eq!((p.policy, p.budget), (Policy::Pool, Budget::Ratio(0.5)));
    let (r, _) = convert(json!({
        "messages": [{"role": "user", "content": "hi"}],
        "glance": {"decode": "diffusion-quadratic", "block": 16, "dynamic_block": true}
    }))
    .unwrap();
    assert_eq!(r.decode.name(), "diffusion-quadratic");
    let d = r.decode.diffusion_settings().unwrap();
    assert_eq!((d.block, d.dynamic), (16, true));
    let (r, _) = convert(json!({
        "messages": [{"role": "user", "content": "hi"}],
        "glance": {"decode": "vispec", "tree": {"depth": 3, "top_k": 1}}
    }))
    .unwrap();
    let t = r.decode.tree().unwrap();
    assert_eq!((t.depth, t.top_k, t.budget), (3, 1, 8));
    let (r, s) = convert(json!({"messages": [{"role": "user", "content": "hi"}]})).unwrap();
    assert_eq!(r.decode, DecodeSpec::Autoregressive);
    assert!(!s.stream);
    assert_eq!(r.max_new_tokens, 16);
    assert_eq!(r.sampling.temperature, 1.0);
}

#[test]
fn bad_requests_are_400_with_the_reason() {
    let m = json!([{"role": "user", "content": "hi"}]);
    let cases = [
        (json!({"messages": m, "bogus": 1}), 400, "unknown field"),
        (
            json!({"messages": m, "temperature": "hot"}),
            400,
            "invalid type",
        ),
        (
            json!({"messages": m, "max_tokens": -1}),
            400,
            "`max_tokens`: invalid value",
        ),
        (json!({"messages": []}), 400, "no message"),
        (json!({"messages": m, "n": 0}), 400, "n must be at least 1"),
        (json!({"messages": m, "n": 17}), 400, "at most 16"),
        (
            json!({"messages": m, "logprobs": true, "top_logprobs": 21}),
            400,
            "top_logprobs must be in 0..=20",
        ),
        (
            json!({"messages": m, "top_logprobs": 2}),
            400,
            "needs logprobs: true",
        ),
        (
            json!({"messages": m, "presence_penalty": 3}),
            400,
            "presence_penalty must be in [-2, 2]",
        ),
        (
            json!({"messages": m, "repetition_penalty": 0}),
            400,
            "repetition_penalty",
        ),
        (json!({"messages": m, "min_p": 2}), 400, "min_p"),
        (json!({"messages": m, "top_k": -2}), 400, "top_k must be"),
        (
            json!({"messages": m, "logit_bias": {"x": 1}}),
            400,
            "logit_bias keys are token ids",
        ),
        (
            json!({"messages": m, "logit_bias": {"5": 200}}),
            400,
            "logit_bias of token 5",
        ),
        (
            json!({"messages": m, "continue_final_message": true}),
            400,
            "ends with an assistant message",
        ),
        (
            json!({"messages": m, "logprobs": true, "glance": {"decode": "diffusion-threshold"}}),
            400,
            "logprobs are not available with diffusion-threshold",
        ),
        (
            json!({"messages": m, "temperature": -1}),
            400,
            "temperature",
        ),
        (json!({"messages": m, "top_p": 0}), 400, "top-p"),
        (json!({"messages": m, "max_tokens": 0}), 400, "max_tokens"),
        (
            json!({"messages": m, "model": "gpt-4"}),
            404,
            "does not exist",
        ),
        (
            json!({"messages": m, "glance": {"speed": 1}}),
            400,
            "unknown field",
        ),
        (
            json!({"messages": m, "glance": {"prune": {"policy": "x"}}}),
            400,
            "policy",
        ),
        (
            json!({"messages": m, "glance": {"decode": "magic"}}),
            400,
            "magic",
        ),
        (
            json!({"messages": m, "glance": {"decode": "ar", "block": 8}}),
            400,
            "block-diffusion strategies",
        ),
        (
            json!({"messages": m, "glance": {"decode": "ar", "tree": {"depth": 2}}}),
            400,
            "glance.tree: a draft tree applies only to the speculative strategies",
        ),
        (
            json!({"messages": m, "glance": {"decode": "eagle", "tree": {"depth": 0}}}),
            400,
            "draft tree depth must be in 1..=256",
        ),
        (
            json!({"messages": m, "glance": {"decode": "eagle", "tree": {"deep": 2}}}),
            400,
            "unknown field",
        ),
        (
            json!({"messages": m, "glance": {"decode": "diffusion-linear", "block": 0}}),
            400,
            "glance.block must be in 1..=64",
        ),
        (
            json!({"messages": m, "glance": {"decode": "diffusion-linear", "threshold": 0.5}}),
            400,
            "glance.threshold only applies to diffusion-threshold",
        ),
        (
            json!({"messages": m, "stream_options": {"include_usage": true}}),
            400,
            "stream",
        ),
    ];
    for (body, status, want) in cases {
        let e = convert(body.clone()).unwrap_err();
        assert_eq!(e.status.as_u16(), status, "{body}: {e}");
        assert!(e.message.contains(want), "{body}: {}", e.message);
    }
}
