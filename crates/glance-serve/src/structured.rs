//! Structured output: `response_format` (`json_object`, `json_schema`) as the engine's
//! [`OutputFormat`], decoded under a grammar mask (`glance_decode::grammar`), and the refusal on
//! a model whose vocabulary cannot spell JSON.

use crate::error::ApiError;
use glance_engine::{Engine, OutputFormat};
use serde_json::Value;

/// The format `response_format` asks for (`None`: free text).
pub fn output_format(response_format: Option<&Value>) -> Result<Option<OutputFormat>, ApiError> {
    let Some(f) = response_format.filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    let bad = |msg: String| Err(ApiError::bad_param("response_format", msg));
    match f.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(OutputFormat::JsonObject)),
        Some("json_schema") => {
            let Some(spec) = f.get("json_schema").filter(|s| s.is_object()) else {
                return bad(
                    "response_format: json_schema needs a `json_schema` object with the schema \
                     under `schema`"
                        .into(),
                );
            };
            match spec.get("schema") {
                Some(s @ (Value::Object(_) | Value::Bool(true))) => {
                    Ok(Some(OutputFormat::JsonSchema(s.clone())))
                }
                None => bad("response_format: json_schema.schema is required".into()),
                Some(other) => bad(format!(
                    "response_format: json_schema.schema must be a JSON schema object, got {other}"
                )),
            }
        }
        other => bad(format!(
            "response_format: type must be `text`, `json_object` or `json_schema`, got {}",
            other.map_or("nothing".into(), |t| format!("`{t}`"))
        )),
    }
}

/// Whether the tokenizer spells JSON: a small document encodes and decodes back (modulo blanks).
/// glance-tiny's word-level vocabulary has no braces or quotes.
pub fn spells_json(engine: &Engine) -> bool {
    let t = &engine.processor().text;
    let probe = "{\"a\": [1]}";
    t.encode_plain(probe)
        .and_then(|ids| t.decode(&ids, false))
        .is_ok_and(|s| s.replace(' ', "") == probe.replace(' ', ""))
}

/// Checks that the model can decode `format` (`param` names the field that asked for it): a 400
/// on a vocabulary that cannot spell JSON, or a schema the grammar compiler refuses.
pub fn check(engine: &Engine, format: &OutputFormat, param: &str) -> Result<(), ApiError> {
    if !spells_json(engine) {
        return Err(ApiError::bad_param(
            param,
            format!(
                "{param}: this model's vocabulary ({} tokens) cannot spell JSON (it has no braces \
                 or quotes, as glance-tiny's word-level vocabulary), so it cannot produce \
                 structured output or tool calls",
                engine.processor().text.vocab_size()
            ),
        ));
    }
    engine
        .grammar(format)
        .map(drop)
        .map_err(|e| ApiError::from(e).with_param(param))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn response_formats_map_to_output_formats() {
        let schema = json!({"type": "object"});
        assert_eq!(output_format(None).unwrap(), None);
        assert_eq!(output_format(Some(&json!({"type": "text"}))).unwrap(), None);
        assert_eq!(
            output_format(Some(&json!({"type": "json_object"}))).unwrap(),
            Some(OutputFormat::JsonObject)
        );
        let f = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}});
        assert_eq!(
            output_format(Some(&f)).unwrap(),
            Some(OutputFormat::JsonSchema(schema))
        );
        for bad in [
            json!({"type": "yaml"}),
            json!({"type": "json_schema"}),
            json!({"type": "json_schema", "json_schema": {"name": "x"}}),
            json!({"type": "json_schema", "json_schema": {"schema": 3}}),
        ] {
            let e = output_format(Some(&bad)).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("response_format"), "{bad}");
        }
    }
}
