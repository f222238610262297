#!/usr/bin/env python3
"""Golden fixtures for glance's LLaVA-NeXT (LLaVA-1.6) parity tests (run by hand, never in CI).

Writes everything under ``fixtures/llava_next/`` (wiped and rebuilt; the other fixtures are not
touched):

* ``images/``  test images for anyres tiling: the shared ones (landscape, portrait, an image smaller
               than one tile, a palette image), a wide strip (3 tiles side by side), a tall strip
               (3 tiles stacked), a square whose aspect equals its grid's (no unpadding) and an
               image whose unpadding leaves an odd margin.
* ``models/llava-next-mistral/`` a tiny random-weight ``LlavaNextForConditionalGeneration`` with a
               Mistral backbone in the layout of published checkpoints (llava-hf/llava-v1.6-*):
               weights ``language_model.model.*``, ``language_model.lm_head.weight``,
               ``vision_tower.vision_model.*``, ``multi_modal_projector.*``, ``image_newline``;
               image settings in ``preprocessor_config.json`` (``LlavaNextImageProcessor`` with
               ``image_grid_pinpoints``).
* ``models/llava-next-vicuna/``  the same with a Llama (Vicuna) backbone exactly as transformers 5
               saves it: image settings only inside ``processor_config.json``.
* ``pixels/``  per image: ``pixel_values`` (base image then tiles, ``(1 + tiles, 3, S, S)``) and
               ``image_sizes`` (both models' processors, each reading its own layout, give them
               bit for bit), with the image's token count.
* ``cases/``   per prompt (chat template, one or two images, multi-turn): input ids, image
               features (packed: base, unpadded tiles with newline rows), the full-sequence
               logits of the text rows (``logits_rows``), greedy tokens and the logits of each KV-cached generation step.
* ``manifest.json``.

The tokenizers and chat template are the LLaVA fixtures' (``fixtures/models/{mistral,llama-gqa}``,
made by ``scripts/make_fixtures.py``). Outputs are computed in float32 with
``attn_implementation="eager"`` on one CPU thread from the checkpoints as re-loaded from disk.
Images go through ``LlavaNextImageProcessorPil`` (``backend="pil"``: no torchvision).

Run from the repository root:  ``python3 scripts/make_llava_next_fixtures.py``.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import PIL
import safetensors
import safetensors.torch
import tokenizers
import torch
import transformers
from PIL import Image
from tokenizers import Tokenizer
from transformers import (
    AutoProcessor,
    AutoTokenizer,
    LlavaNextConfig,
    LlavaNextForConditionalGeneration,
    LlavaNextImageProcessorPil,
    LlavaNextProcessor,
)

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT / "fixtures"
OUT = ROOT / "fixtures" / "llava_next"
SEED = 2468
INIT_STD = 0.15
NORM_STD = 0.1
MAX_NEW_TOKENS = 10
SIZE_LIMIT_BYTES = 4 * 1024 * 1024
TILE = 28  # vision image_size: 7 x 7 patches of 4 pixels
PATCH = 4
# llava-hf/llava-v1.6-*'s pinpoints, scaled from 336 to TILE.
PINPOINTS = [[TILE, 2 * TILE], [2 * TILE, TILE], [2 * TILE, 2 * TILE], [3 * TILE, TILE], [TILE, 3 * TILE]]

VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              image_size=TILE, patch_size=PATCH, hidden_act="quick_gelu", projection_dim=16)

SPECS = {
    "llava-next-mistral": dict(
        tokenizer="mistral", layout="hub", seed=0,
        text=dict(model_type="mistral", hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
                  rms_norm_eps=1e-5, sliding_window=None, rope_parameters=dict(rope_type="default",
                                                                                rope_theta=10000.0)),
    ),
    "llava-next-vicuna": dict(
        tokenizer="llama-gqa", layout="transformers5", seed=1,
        text=dict(model_type="llama", hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=1024,
                  rms_norm_eps=1e-6, rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
    ),
}

IMAGES = {
    "astronaut.png": "shared RGB 300x200: 2x2 tiles (56x56), unpadded rows",
    "camera_gray.png": "shared grayscale 150x230 portrait: 2x1 tiles, unpadded columns",
    "cup_rgba.png": "shared RGBA 40x30: smaller than the 2x2 grid",
    "coffee_palette.png": "shared palette 120x80",
    "wide.png": "RGB 180x40: 1x3 tiles side by side",
    "tall.png": "RGB 20x150: 3x1 tiles stacked",
    "square.png": "RGB 56x56: aspect equal to its grid, nothing unpadded",
    "odd.png": "RGB 97x61: unpadding with an odd margin",
}

CASES = [
    ("mistral-astronaut", "llava-next-mistral", [
        {"role": "user", "content": [{"type": "image", "image": "astronaut.png"},
                                     {"type": "text", "text": "What is shown in this image?"}]}]),
    ("mistral-two-images", "llava-next-mistral", [
        {"role": "user", "content": [{"type": "image", "image": "wide.png"},
                                     {"type": "image", "image": "tall.png"},
                                     {"type": "text", "text": "Compare the two pictures."}]}]),
    ("mistral-chat", "llava-next-mistral", [
        {"role": "user", "content": [{"type": "image", "image": "camera_gray.png"},
                                     {"type": "text", "text": "What is the man holding?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A camera."}]},
        {"role": "user", "content": [{"type": "text", "text": "Is it day or night?"}]}]),
    ("vicuna-cup", "llava-next-vicuna", [
        {"role": "user", "content": [{"type": "image", "image": "cup_rgba.png"},
                                     {"type": "text", "text": "How many objects can you see?"}]}]),
    ("vicuna-two-images", "llava-next-vicuna", [
        {"role": "user", "content": [{"type": "image", "image": "square.png"},
                                     {"type": "image", "image": "odd.png"},
                                     {"type": "text", "text": "Describe the picture in detail."}]}]),
    ("vicuna-chat", "llava-next-vicuna", [
        {"role": "user", "content": [{"type": "image", "image": "coffee_palette.png"},
                                     {"type": "text", "text": "What animal is this?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "This is a cat."}]},
        {"role": "user", "content": [{"type": "text", "text": "Read the sign."}]}]),
]


def rel(p: Path) -> str:
    return p.relative_to(OUT).as_posix()


def save_tensors(path: Path, tensors: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    safetensors.torch.save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(path),
                                metadata={"format": "pt"})


def make_images() -> None:
    out = OUT / "images"
    out.mkdir(parents=True)
    for name in ("astronaut.png", "camera_gray.png", "cup_rgba.png", "coffee_palette.png"):
        shutil.copy(SHARED / "images" / name, out / name)
    astro = Image.open(SHARED / "images" / "astronaut.png").convert("RGB")
    astro.crop((60, 80, 240, 120)).save(out / "wide.png", optimize=True)
    astro.crop((100, 20, 156, 76)).save(out / "square.png", optimize=True)
    astro.crop((150, 100, 247, 161)).save(out / "odd.png", optimize=True)
    Image.open(SHARED / "images" / "chelsea.jpg").convert("RGB").crop((90, 0, 110, 150)).save(out / "tall.png")


def load_image(name: str) -> Image.Image:
    img = Image.open(OUT / "images" / name)
    img.load()
    return img


def init_weights(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            is_norm = any(k in name for k in ("norm", "layrnorm", "layernorm"))
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) * INIT_STD)
            elif is_norm and name.endswith("weight"):
                p.copy_(1.0 + torch.randn(p.shape, generator=gen) * NORM_STD)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * NORM_STD)


def build(name: str, spec: dict) -> Path:
    out = OUT / "models" / name
    tok = AutoTokenizer.from_pretrained(SHARED / "models" / spec["tokenizer"])
    template = (SHARED / "models" / spec["tokenizer"] / "chat_template.jinja").read_text()
    image_id = tok.convert_tokens_to_ids("<image>")
    text = dict(spec["text"], vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                pad_token_id=tok.convert_tokens_to_ids("<pad>"))
    config = LlavaNextConfig(text_config=text, vision_config=dict(VISION, model_type="clip_vision_model"),
                             image_token_index=image_id, image_grid_pinpoints=PINPOINTS,
                             vision_feature_layer=-2, vision_feature_select_strategy="default",
                             projector_hidden_act="gelu", image_seq_length=(TILE // PATCH) ** 2)
    torch.manual_seed(SEED + spec["seed"])
    model = LlavaNextForConditionalGeneration(config)
    init_weights(model, SEED + 100 + spec["seed"])
    model.eval()
    model.generation_config.do_sample = False
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(out, safe_serialization=True)
    image_processor = LlavaNextImageProcessorPil(size={"shortest_edge": TILE},
                                                 crop_size={"height": TILE, "width": TILE},
                                                 image_grid_pinpoints=PINPOINTS)
    processor = LlavaNextProcessor(image_processor=image_processor, tokenizer=tok, patch_size=PATCH,
                                   vision_feature_select_strategy="default", num_additional_image_tokens=1,
                                   chat_template=template)
    processor.save_pretrained(out)
    if spec["layout"] == "hub":
        to_hub_layout(out)
    return out


def to_hub_layout(out: Path) -> None:
    """Rewrites a transformers-5 save into the layout of llava-hf/llava-v1.6-* on the hub."""
    with safetensors.safe_open(str(out / "model.safetensors"), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    renamed = {}
    for k, v in tensors.items():
        if k.startswith("model.language_model."):
            k = "language_model.model." + k[len("model.language_model."):]
        elif k.startswith("model.vision_tower."):
            k = "vision_tower.vision_model." + k[len("model.vision_tower."):]
        elif k.startswith("vision_tower.") and not k.startswith("vision_tower.vision_model."):
            k = "vision_tower.vision_model." + k[len("vision_tower."):]
        elif k.startswith("model."):
            k = k[len("model."):]
        elif k == "lm_head.weight":
            k = "language_model.lm_head.weight"
        renamed[k] = v
    assert "image_newline" in renamed and "language_model.lm_head.weight" in renamed, sorted(renamed)[:8]
    assert any(k.startswith("vision_tower.vision_model.") for k in renamed)
    save_tensors(out / "model.safetensors", renamed)
    proc = json.loads((out / "processor_config.json").read_text())
    image = proc.pop("image_processor")
    image["image_processor_type"] = "LlavaNextImageProcessor"
    image["processor_class"] = "LlavaNextProcessor"
    (out / "preprocessor_config.json").write_text(json.dumps(image, indent=2) + "\n")
    (out / "processor_config.json").write_text(json.dumps(proc, indent=2) + "\n")


def load(model_dir: Path):
    model = LlavaNextForConditionalGeneration.from_pretrained(model_dir, attn_implementation="eager",
                                                              dtype=torch.float32)
    model.eval()
    processor = AutoProcessor.from_pretrained(model_dir, backend="pil")
    assert type(processor.image_processor) is LlavaNextImageProcessorPil, type(processor.image_processor)
    assert processor.image_processor.image_grid_pinpoints == PINPOINTS
    return model, processor


def n_tokens(processor, image) -> int:
    text = processor(text="<image>", images=image, return_tensors="pt")
    return int((text["input_ids"] == processor.image_token_id).sum())


def make_pixels(processors: dict) -> list:
    entries = []
    for image in IMAGES:
        got = {n: p.image_processor(images=load_image(image), return_tensors="pt") for n, p in processors.items()}
        first = next(iter(got.values()))
        for g in got.values():
            assert torch.equal(g["pixel_values"], first["pixel_values"])
            assert torch.equal(g["image_sizes"], first["image_sizes"])
        path = OUT / "pixels" / f"{Path(image).stem}.safetensors"
        save_tensors(path, {"pixel_values": first["pixel_values"][0].float(),
                            "image_sizes": first["image_sizes"][0].to(torch.int64)})
        tokens = {n: n_tokens(p, load_image(image)) for n, p in processors.items()}
        assert len(set(tokens.values())) == 1, tokens
        entries.append({"image": f"images/{image}", "tensors": rel(path),
                        "image_size": first["image_sizes"][0].tolist(),
                        "tiles": int(first["pixel_values"].shape[1]) - 1,
                        "n_image_tokens": next(iter(tokens.values()))})
    return entries


def run_case(case_name: str, name: str, messages: list, model, processor, model_dir: Path) -> dict:
    images = [load_image(p["image"]) for m in messages for p in m["content"] if p["type"] == "image"]
    plain = [{"role": m["role"], "content": [{"type": p["type"], **({"text": p["text"]} if "text" in p else {})}
                                            for p in m["content"]]} for m in messages]
    rendered = processor.apply_chat_template(plain, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=rendered, images=images, return_tensors="pt")
    input_ids = inputs["input_ids"]
    n_img = int((input_ids == model.config.image_token_index).sum())
    counts = [n_tokens(processor, i) for i in images]
    assert n_img == sum(counts), (n_img, counts)
    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    expanded = rendered
    for c in counts:
        expanded = expanded.replace("<image>", "<|placeholder|>" * c, 1)
    expanded = expanded.replace("<|placeholder|>", "<image>")
    assert raw.encode(expanded, add_special_tokens=True).ids == input_ids[0].tolist(), case_name
    with torch.no_grad():
        out = model(**inputs)
        logits = out.logits[0]
        feats = model.model.get_image_features(pixel_values=inputs["pixel_values"],
                                               image_sizes=inputs["image_sizes"]).pooler_output
        image_features = torch.cat(list(feats), dim=0)
        assert image_features.shape[0] == n_img
        gen = model.generate(**inputs, do_sample=False, max_new_tokens=MAX_NEW_TOKENS,
                             output_logits=True, return_dict_in_generate=True)
    seq = input_ids.shape[1]
    greedy = gen.sequences[0, seq:]
    step_logits = torch.stack([l[0] for l in gen.logits])
    torch.testing.assert_close(step_logits[0], logits[-1], rtol=0, atol=1e-4)
    top2 = step_logits.topk(2, dim=-1).values
    margin = (top2[:, 0] - top2[:, 1]).min().item()
    path = OUT / "cases" / f"{case_name}.safetensors"
    # Logits of the text rows only (the image rows' would make the fixtures several MB); every text
    # row after an image depends on all of its rows.
    text_rows = (input_ids[0] != model.config.image_token_index).nonzero()[:, 0]
    save_tensors(path, {
        "input_ids": input_ids[0].to(torch.int64),
        "image_sizes": inputs["image_sizes"].to(torch.int64),
        "image_features": image_features.float(),
        "logits_rows": text_rows.to(torch.int64),
        "logits": logits[text_rows].float(),
        "greedy_ids": greedy.to(torch.int64),
        "greedy_logits": step_logits.float(),
    })
    return {
        "name": case_name, "model": f"models/{name}",
        "messages": messages, "rendered": rendered, "add_generation_prompt": True,
        "images": [f"images/{p['image']}" for m in messages for p in m["content"] if p["type"] == "image"],
        "tensors": rel(path), "seq_len": seq, "n_image_tokens": n_img, "image_tokens": counts,
        "max_new_tokens": MAX_NEW_TOKENS, "greedy_min_logit_margin": round(margin, 5),
        "greedy_text": processor.tokenizer.decode(greedy, skip_special_tokens=False),
    }


def to_json(obj) -> str:
    text = json.dumps(obj, indent=2, ensure_ascii=False)
    return re.sub(r"\[\s+(-?[\d.e+-]+(?:,\s+-?[\d.e+-]+)*)\s+\]",
                  lambda m: "[" + ", ".join(v.strip() for v in m.group(1).split(",")) + "]", text)


def main() -> None:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    make_images()
    facts, processors, cases = {}, {}, []
    for name, spec in SPECS.items():
        model_dir = build(name, spec)
        model, processor = load(model_dir)
        with safetensors.safe_open(str(model_dir / "model.safetensors"), "pt") as f:
            keys = sorted(f.keys())
        facts[name] = {"dir": f"models/{name}", "layout": spec["layout"],
                       "architecture": "LlavaNextForConditionalGeneration", "backbone": spec["text"]["model_type"],
                       "weight_keys": len(keys),
                       "weight_prefixes": sorted({".".join(k.split(".")[:2]) for k in keys}),
                       "image_token_id": model.config.image_token_index}
        processors[name] = processor
        for case_name, model_name, messages in CASES:
            if model_name == name:
                cases.append(run_case(case_name, name, messages, model, processor, model_dir))
                print(f"{case_name}: seq {cases[-1]['seq_len']}, image tokens {cases[-1]['image_tokens']}, "
                      f"greedy {cases[-1]['greedy_text']!r}")
    pixels = make_pixels(processors)
    manifest = {
        "version": 1, "generator": "scripts/make_llava_next_fixtures.py",
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                     "tokenizers": tokenizers.__version__, "safetensors": safetensors.__version__,
                     "numpy": np.__version__, "pillow": PIL.__version__},
        "seed": SEED, "tile": TILE, "image_grid_pinpoints": PINPOINTS,
        "notes": {
            "dtype": "float32 tensors; ids int64",
            "attention": "eager, one CPU thread",
            "pixels": "LlavaNextImageProcessorPil: convert_rgb; select_best_resolution over the pinpoints; "
                      "PIL BICUBIC resize of uint8 keeping the aspect (get_patch_output_size), zero pad centred "
                      "(top = (H - h) // 2), tiles row-major; base = the image resized to TILE x TILE; "
                      "float32(u8*float64(1/255)), (x-mean)/std float32 (OpenAI CLIP)",
            "image_features": "pack_image_features: base tokens, then the unpadded tile grid row by row, each row "
                              "followed by image_newline",
            "logits": "full-sequence logits of the text rows (logits_rows) only",
            "greedy_logits": "logits of each generate() step (KV-cached decode), row k predicts greedy_ids[k]",
        },
        "models": facts, "images": {f"images/{k}": v for k, v in IMAGES.items()},
        "pixels": pixels, "cases": cases,
    }
    (OUT / "manifest.json").write_text(to_json(manifest) + "\n")
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"fixtures: {total / 1024:.0f} KiB")
    assert total < SIZE_LIMIT_BYTES


if __name__ == "__main__":
    main()
