//! The chat page at `GET /` (described in docs/serve.md#the-page) and the two small routes only it
//! needs: `GET /glance/info` (the served model, the strategies it can run, the image limits) and
//! `GET /glance/world/sample` (a world test image with its questions, as `glance world sample`
//! writes them).
//!
//! The page is three static files built into the binary (`static/`; the style sheet is served
//! inline in the HTML, the script at `GET /page.js`): no CDN, no network at run time. It talks to the API exactly as any client does: `POST /v1/chat/completions` with
//! `stream: true` and glance's options under `"glance"`.

use crate::error::ApiError;
use crate::App;
use axum::extract::{RawQuery, State};
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;
use base64::Engine as _;
use glance_engine::DecodeSpec;
use glance_world::Split;
use serde_json::{json, Value};
use std::sync::Arc;

const INDEX_HTML: &str = include_str!("../static/index.html");
const PAGE_JS: &str = include_str!("../static/page.js");
const PAGE_CSS: &str = include_str!("../static/page.css");
/// Where the page's style sheet is linked.
const CSS_LINK: &str = r#"<link rel="stylesheet" href="page.css">"#;

/// The page with its style sheet inline: the first paint waits for no second request (on
/// loopback, on a loaded 2-vCPU machine: a median of 84 ms after the navigation starts over 11
/// runs inline, 104 ms over 3 runs linked; tests/browser.rs prints it).
static INDEX: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    INDEX_HTML.replace(CSS_LINK, &format!("<style>\n{PAGE_CSS}</style>"))
});

/// `GET /`: the page.
pub async fn index() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        INDEX.as_str(),
    )
}

/// `GET /page.js`.
pub async fn script() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        PAGE_JS,
    )
}

/// `GET /glance/info`: what the page offers: the model's name, the decoding strategies this
/// server can run (a draft head or a converted model loads on the first ask), its defaults and
/// limits.
pub async fn info(State(app): State<Arc<App>>) -> Result<Json<Value>, ApiError> {
    let engine = app.engine.clone();
    let strategies = tokio::task::spawn_blocking(move || {
        DecodeSpec::ALL
            .into_iter()
            .filter(|d| engine.check_decode(d).is_ok())
            .map(|d| d.name())
            .collect::<Vec<_>>()
    })
    .await
    .map_err(|e| ApiError::internal(format!("checking the strategies failed: {e}")))?;
    let options = app.engine.options();
    let d = &app.config.defaults;
    Ok(Json(json!({
        "model": app.config.model_name,
        "strategies": strategies,
        "default_decode": d.decode.name(),
        "default_prune": d.prune.as_ref().map(|p| p.policy.to_string()),
        "default_max_tokens": d.max_tokens,
        "max_images": options.max_images,
        "max_image_pixels": options.max_image_pixels,
        "max_body_bytes": app.config.max_body_bytes,
    })))
}

/// The most world images the sample route renders at one index (`index` is below it).
pub const MAX_SAMPLE_INDEX: u64 = 1 << 20;

/// `GET /glance/world/sample?split=test&index=N`: example `N` of a split of the glance world
/// (glance_world::sample, as `glance world sample` writes it): the image as a PNG data URL, its
/// independent questions and its dialogue, each with the ground-truth answer.
pub async fn world_sample(RawQuery(query): RawQuery) -> Result<Json<Value>, ApiError> {
    let (mut split, mut index) = (Split::Test, 0u64);
    for (key, value) in query
        .as_deref()
        .unwrap_or("")
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| kv.split_once('=').unwrap_or((kv, "")))
    {
        match key {
            "split" => {
                split = value.parse().map_err(|e: glance_world::WorldError| {
                    ApiError::bad_param("split", e.to_string())
                })?
            }
            "index" => {
                index = value
                    .parse()
                    .ok()
                    .filter(|&i| i < MAX_SAMPLE_INDEX)
                    .ok_or_else(|| {
                        ApiError::bad_param(
                            "index",
                            format!(
                                "index must be an integer in 0..{MAX_SAMPLE_INDEX}, got `{value}`"
                            ),
                        )
                    })?
            }
            other => {
                return Err(ApiError::bad_param(
                    other,
                    format!("unknown parameter `{other}` (split, index)"),
                ))
            }
        }
    }
    let body = tokio::task::spawn_blocking(move || sample_json(split, index))
        .await
        .map_err(|e| ApiError::internal(format!("rendering the sample failed: {e}")))??;
    Ok(Json(body))
}

fn sample_json(split: Split, index: u64) -> Result<Value, ApiError> {
    let ex = glance_world::sample(split, index)
        .map_err(|e| ApiError::bad_param("index", e.to_string()))?;
    let mut png = Vec::new();
    ex.image
        .write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
        .map_err(|e| ApiError::internal(format!("encoding the sample image: {e}")))?;
    let qa = |q: &glance_world::Qa| json!({"family": q.family, "question": q.question, "answer": q.answer, "follow_up": q.follow_up});
    Ok(json!({
        "split": split,
        "index": index,
        "seed": ex.seed,
        "image": format!(
            "data:image/png;base64,{}",
            base64::engine::general_purpose::STANDARD.encode(&png)
        ),
        "questions": ex.questions.iter().map(qa).collect::<Vec<_>>(),
        "dialogue": ex.dialogue.turns.iter().map(qa).collect::<Vec<_>>(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_is_the_world_example_as_a_png() {
        let v = sample_json(Split::Test, 3).unwrap();
        let ex = glance_world::sample(Split::Test, 3).unwrap();
        assert_eq!(v["seed"], json!(ex.seed));
        assert_eq!(v["questions"].as_array().unwrap().len(), ex.questions.len());
        assert_eq!(v["questions"][0]["answer"], json!(ex.questions[0].answer));
        let url = v["image"].as_str().unwrap();
        let b64 = url.strip_prefix("data:image/png;base64,").unwrap();
        let png = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap();
        let back = image::load_from_memory(&png).unwrap().to_rgb8();
        assert_eq!(back, ex.image);
    }

    #[test]
    fn the_page_is_built_in_and_names_its_assets() {
        assert!(INDEX_HTML.contains("page.js") && INDEX_HTML.contains(CSS_LINK));
        assert!(INDEX.contains(PAGE_CSS) && !INDEX.contains(CSS_LINK));
        // Nothing is fetched from elsewhere: every URL the page uses is the server's own.
        for text in [INDEX_HTML, PAGE_JS, PAGE_CSS] {
            assert!(!text.contains("http://") && !text.contains("https://"));
        }
    }
}
