#!/usr/bin/env python3
"""Golden fixtures for glance's Qwen2-VL / Qwen2.5-VL parity tests (run by hand, never in CI).

Writes everything under ``fixtures/qwen2_vl/`` (wiped and rebuilt; the LLaVA fixtures of
``scripts/make_fixtures.py`` are not touched):

* ``images/``  small test images cut from the LLaVA fixtures' images: a wide strip (aspect 10:1),
               an image whose sides are already multiples of 28 (smart_resize keeps it) and the
               shared ones (downscaled by ``max_pixels``, upscaled by ``min_pixels``).
* ``models/qwen2-vl/``   a tiny random-weight ``Qwen2VLForConditionalGeneration`` in the layout of
               published checkpoints (Qwen/Qwen2-VL-*): flat ``config.json`` with ``rope_scaling``
               ``{"type": "mrope", "mrope_section": ...}`` and ``rope_theta``, weights ``model.*``,
               ``visual.*``, ``lm_head.weight``; ``preprocessor_config.json`` with ``min_pixels`` /
               ``max_pixels``; chat template in ``tokenizer_config.json`` and
               ``chat_template.json``.
* ``models/qwen2_5-vl/`` a tiny random-weight ``Qwen2_5_VLForConditionalGeneration`` exactly as
               transformers 5 saves it: nested ``text_config`` with ``rope_parameters``, weights as
               saved, image settings only inside ``processor_config.json`` (``size`` with
               ``shortest_edge`` / ``longest_edge``), ``chat_template.jinja``.
* ``pixels/``  ``pixel_values`` (patch rows) and ``image_grid_thw`` per image (both models'
               processors, each reading its own layout of settings, give them bit for bit).
* ``cases/``   per prompt (rendered by the chat template, one or two images, multi-turn):
               input ids, ``mm_token_type_ids``, 3-D position ids, grids, image features (the pixels
               are the per-image ones of ``pixels/``, concatenated in prompt order),
               full-sequence logits, greedy tokens and the logits of each KV-cached generation step.
* ``manifest.json``.

Outputs are computed in float32 with ``attn_implementation="eager"`` on one CPU thread from the
checkpoints as re-loaded from disk; the published-layout copy is checked to load in transformers
to the same logits. Images go through ``Qwen2VLImageProcessorPil`` (``backend="pil"``: no
torchvision); no video processor.

Run from the repository root:  ``python3 scripts/make_qwen_fixtures.py``.
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
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoProcessor,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLProcessor,
    Qwen2Tokenizer,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessorPil,
    Qwen2VLProcessor,
)

# Without torchvision transformers has no video processor class at all, and `ProcessorMixin` then
# fails checking the (absent) video processor's class; images only here, so the check is skipped
# for a `None` video processor.
_check_class = transformers.ProcessorMixin.check_argument_for_proper_class


def _check_class_no_video(self, name, arg):
    if name == "video_processor" and arg is None:
        return None
    return _check_class(self, name, arg)


transformers.ProcessorMixin.check_argument_for_proper_class = _check_class_no_video
_attributes = transformers.ProcessorMixin.get_attributes.__func__


def _attributes_no_video(cls):
    return [a for a in _attributes(cls) if a != "video_processor"]


for _cls in (transformers.Qwen2VLProcessor, transformers.Qwen2_5_VLProcessor):
    _cls.get_attributes = classmethod(_attributes_no_video)

ROOT = Path(__file__).resolve().parents[1]
SHARED_IMAGES = ROOT / "fixtures" / "images"
OUT = ROOT / "fixtures" / "qwen2_vl"
SEED = 4321
INIT_STD = 0.15
NORM_STD = 0.1
MAX_NEW_TOKENS = 10
SIZE_LIMIT_BYTES = 4 * 1024 * 1024
MIN_PIXELS = 28 * 28 * 4
MAX_PIXELS = 28 * 28 * 20

SPECIALS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|image_pad|>", "<|video_pad|>",
]

# Qwen/Qwen2-VL-7B-Instruct's chat template (one line there).
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

CORPUS = """\
You are a helpful assistant. What is shown in this image? The image shows an astronaut in a white suit.
What is the man holding? He is holding a camera on a tripod in a park.
What animal is this? This is a cat. The cat is sitting on a table and looking at the camera.
Describe the picture in detail. There is a person standing in front of a flag.
Compare the two pictures. The first one is bright, the second one is dark and grey.
How many objects can you see? I can see three objects: a cup, a plate and a spoon.
What colour is the strip? The strip is brown and white. Is it day or night? It is day.
Read the sign. The sign says 42. Look closely at the background, it is plain.
Now describe the colours, then the shapes, then say where each object is.
"""


def text_cfg(hidden, heads, kv, inter, section, theta=1000000.0):
    return dict(
        hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv, intermediate_size=inter,
        num_hidden_layers=2, max_position_embeddings=512, rms_norm_eps=1e-6,
        rope_parameters=dict(rope_type="default", rope_theta=theta, mrope_section=section),
    )


SPECS = {
    # Published layout (rewritten below): the older flat config, hub weight names.
    "qwen2-vl": dict(
        cls=Qwen2VLForConditionalGeneration, config=Qwen2VLConfig, processor=Qwen2VLProcessor,
        text=text_cfg(64, 4, 2, 96, [2, 3, 3]),
        vision=dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, hidden_act="quick_gelu",
                    patch_size=14, spatial_merge_size=2, temporal_patch_size=2),
        layout="hub", seed=0,
    ),
    # What transformers 5 saves.
    "qwen2_5-vl": dict(
        cls=Qwen2_5_VLForConditionalGeneration, config=Qwen2_5_VLConfig, processor=Qwen2_5_VLProcessor,
        text=text_cfg(48, 4, 2, 80, [2, 2, 2]),
        vision=dict(depth=3, hidden_size=32, out_hidden_size=48, intermediate_size=40, num_heads=2,
                    hidden_act="silu", patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
                    window_size=56, fullatt_block_indexes=[1], tokens_per_second=2),
        layout="transformers5", seed=1,
    ),
}

IMAGES = {
    "astronaut.png": "shared RGB 300x200: downscaled by max_pixels",
    "camera_gray.png": "shared grayscale 150x230 portrait",
    "cup_rgba.png": "shared RGBA 40x30: upscaled by min_pixels",
    "coffee_palette.png": "shared palette 120x80",
    "strip.png": "RGB 280x28: aspect 10:1",
    "exact.png": "RGB 112x84: sides multiples of 28, size kept",
    "tall.png": "RGB 20x150: narrow, below min_pixels",
}

# (name, model, messages with image file names in image parts)
CASES = [
    ("qwen2-vl-astronaut", "qwen2-vl", [
        {"role": "user", "content": [{"type": "image", "image": "astronaut.png"},
                                     {"type": "text", "text": "What is shown in this image?"}]}]),
    ("qwen2-vl-two-images", "qwen2-vl", [
        {"role": "user", "content": [{"type": "text", "text": "Compare the two pictures."},
                                     {"type": "image", "image": "strip.png"},
                                     {"type": "image", "image": "cup_rgba.png"}]}]),
    ("qwen2-vl-chat", "qwen2-vl", [
        {"role": "system", "content": [{"type": "text", "text": "Give a short answer."}]},
        {"role": "user", "content": [{"type": "image", "image": "camera_gray.png"},
                                     {"type": "text", "text": "What is the man holding?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A camera."}]},
        {"role": "user", "content": [{"type": "text", "text": "Is it day or night?"}]}]),
    ("qwen2_5-vl-astronaut", "qwen2_5-vl", [
        {"role": "user", "content": [{"type": "image", "image": "astronaut.png"},
                                     {"type": "text", "text": "Describe the picture in detail."}]}]),
    ("qwen2_5-vl-two-images", "qwen2_5-vl", [
        {"role": "user", "content": [{"type": "image", "image": "exact.png"},
                                     {"type": "text", "text": "and"},
                                     {"type": "image", "image": "tall.png"},
                                     {"type": "text", "text": "What colour is the strip?"}]}]),
    ("qwen2_5-vl-chat", "qwen2_5-vl", [
        {"role": "user", "content": [{"type": "image", "image": "coffee_palette.png"},
                                     {"type": "text", "text": "How many objects can you see?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Three objects."}]},
        {"role": "user", "content": [{"type": "text", "text": "Now describe the colours."}]}]),
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
        shutil.copy(SHARED_IMAGES / name, out / name)
    astro = Image.open(SHARED_IMAGES / "astronaut.png").convert("RGB")
    astro.crop((0, 90, 280, 118)).save(out / "strip.png", optimize=True)
    astro.crop((100, 40, 212, 124)).save(out / "exact.png", optimize=True)
    Image.open(SHARED_IMAGES / "chelsea.jpg").convert("RGB").crop((90, 0, 110, 150)).save(out / "tall.png")


def load_image(name: str) -> Image.Image:
    img = Image.open(OUT / "images" / name)
    img.load()
    return img


def build_tokenizer() -> Qwen2Tokenizer:
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=420, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    bpe.train_from_iterator([CORPUS], trainer)
    model = json.loads(bpe.to_str())["model"]
    vocab = model["vocab"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tok = Qwen2Tokenizer(vocab=vocab, merges=merges, unk_token=None, bos_token=None,
                         eos_token="<|im_end|>", pad_token="<|endoftext|>", errors="replace")
    tok.add_special_tokens({"additional_special_tokens": SPECIALS})
    tok.chat_template = CHAT_TEMPLATE
    special_ids = [tok.convert_tokens_to_ids(s) for s in SPECIALS]
    assert len(set(special_ids)) == len(SPECIALS) and min(special_ids) >= len(vocab), special_ids
    return tok


def init_weights(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            is_norm = any(k in name for k in ("norm", "ln_q"))
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=gen) * INIT_STD)
            elif is_norm and name.endswith("weight"):
                p.copy_(1.0 + torch.randn(p.shape, generator=gen) * NORM_STD)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * NORM_STD)


def ids_of(tok, names):
    return {n: tok.convert_tokens_to_ids(t) for n, t in names.items()}


def build(name: str, spec: dict, tok) -> Path:
    out = OUT / "models" / name
    special = ids_of(tok, dict(image_token_id="<|image_pad|>", video_token_id="<|video_pad|>",
                               vision_start_token_id="<|vision_start|>", vision_end_token_id="<|vision_end|>"))
    text = dict(spec["text"], vocab_size=len(tok), bos_token_id=None,
                eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
                pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"))
    config = spec["config"](text_config=text, vision_config=spec["vision"], **special)
    torch.manual_seed(SEED + spec["seed"])
    model = spec["cls"](config)
    init_weights(model, SEED + 100 + spec["seed"])
    model.eval()
    model.generation_config.do_sample = False
    model.generation_config.eos_token_id = tok.convert_tokens_to_ids("<|im_end|>")
    model.save_pretrained(out, safe_serialization=True)
    image_processor = Qwen2VLImageProcessorPil(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS)
    processor = spec["processor"](image_processor=image_processor, tokenizer=tok,
                                  chat_template=CHAT_TEMPLATE)
    processor.save_pretrained(out)
    if spec["layout"] == "hub":
        to_hub_layout(out)
    return out


def to_hub_layout(out: Path) -> None:
    """Rewrites a transformers-5 save into the layout of Qwen/Qwen2-VL-* on the hub."""
    cfg = json.loads((out / "config.json").read_text())
    text = cfg.pop("text_config")
    rope = text.pop("rope_parameters")
    flat = {k: v for k, v in text.items() if k not in ("model_type", "dtype", "architectures")}
    flat["rope_theta"] = rope["rope_theta"]
    flat["rope_scaling"] = {"type": "mrope", "mrope_section": rope["mrope_section"]}
    vision = cfg["vision_config"]
    vision.pop("rope_parameters", None)
    hub = dict(cfg)
    hub.update(flat)
    hub["model_type"] = "qwen2_vl"
    vision["model_type"] = "qwen2_vl"
    (out / "config.json").write_text(json.dumps(hub, indent=2) + "\n")
    # Weights: model.language_model.* -> model.*, model.visual.* -> visual.*
    with safetensors.safe_open(str(out / "model.safetensors"), "pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    renamed = {}
    for k, v in tensors.items():
        if k.startswith("model.language_model."):
            k = "model." + k[len("model.language_model."):]
        elif k.startswith("model.visual."):
            k = k[len("model."):]
        renamed[k] = v
    assert any(k.startswith("visual.") for k in renamed) and any(k.startswith("model.layers.") for k in renamed)
    save_tensors(out / "model.safetensors", renamed)
    # Processor: preprocessor_config.json with min/max_pixels, template in tokenizer_config.json.
    proc = json.loads((out / "processor_config.json").read_text())
    image = proc.pop("image_processor")
    image["min_pixels"] = MIN_PIXELS
    image["max_pixels"] = MAX_PIXELS
    image["size"] = {"min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS}
    image["image_processor_type"] = "Qwen2VLImageProcessor"
    image["processor_class"] = "Qwen2VLProcessor"
    (out / "preprocessor_config.json").write_text(json.dumps(image, indent=2) + "\n")
    (out / "processor_config.json").unlink()
    tok_cfg = json.loads((out / "tokenizer_config.json").read_text())
    tok_cfg["chat_template"] = (out / "chat_template.jinja").read_text()
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    (out / "chat_template.json").write_text(json.dumps({"chat_template": tok_cfg["chat_template"]}, indent=2) + "\n")
    (out / "chat_template.jinja").unlink()


def load(name: str, spec: dict, model_dir: Path):
    model = spec["cls"].from_pretrained(model_dir, attn_implementation="eager", dtype=torch.float32)
    model.eval()
    processor = AutoProcessor.from_pretrained(model_dir, backend="pil")
    assert type(processor.image_processor) is Qwen2VLImageProcessorPil, type(processor.image_processor)
    assert processor.image_processor.size["shortest_edge"] == MIN_PIXELS
    assert processor.image_processor.size["longest_edge"] == MAX_PIXELS
    return model, processor


def make_pixels(processors: dict) -> list:
    """Expected pixels once per image; every model's processor (each read from its own layout of
    settings) must give them bit for bit."""
    entries = []
    for image in IMAGES:
        got = {name: p.image_processor(images=load_image(image), return_tensors="pt") for name, p in processors.items()}
        first = next(iter(got.values()))
        for g in got.values():
            assert torch.equal(g["pixel_values"], first["pixel_values"])
            assert torch.equal(g["image_grid_thw"], first["image_grid_thw"])
        path = OUT / "pixels" / f"{Path(image).stem}.safetensors"
        grid = first["image_grid_thw"][0]
        save_tensors(path, {"pixel_values": first["pixel_values"].float(), "image_grid_thw": grid.to(torch.int64)})
        entries.append({"image": f"images/{image}", "tensors": rel(path), "image_grid_thw": grid.tolist(),
                        "n_image_tokens": int(grid.prod()) // 4})
    return entries


def run_case(case_name: str, name: str, messages: list, model, processor, model_dir: Path) -> dict:
    images = [load_image(p["image"]) for m in messages for p in m["content"] if p["type"] == "image"]
    plain = [{"role": m["role"], "content": [{"type": p["type"], **({"text": p["text"]} if "text" in p else {})}
                                            for p in m["content"]]} for m in messages]
    rendered = processor.apply_chat_template(plain, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=rendered, images=images, return_tensors="pt")
    input_ids = inputs["input_ids"]
    grids = inputs["image_grid_thw"]
    cfg = model.config
    n_img = int((input_ids == cfg.image_token_id).sum())
    assert n_img == int(grids.prod(-1).sum()) // 4
    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    expanded = rendered
    for g in grids:
        expanded = expanded.replace("<|image_pad|>", "<|placeholder|>" * (int(g.prod()) // 4), 1)
    expanded = expanded.replace("<|placeholder|>", "<|image_pad|>")
    assert raw.encode(expanded, add_special_tokens=True).ids == input_ids[0].tolist(), case_name

    # The case's pixels are the per-image fixtures, concatenated (so they are stored once).
    expected = torch.cat([processor.image_processor(images=i, return_tensors="pt")["pixel_values"] for i in images])
    assert torch.equal(inputs["pixel_values"], expected)
    with torch.no_grad():
        position_ids, deltas = model.model.get_rope_index(
            input_ids, inputs["mm_token_type_ids"], image_grid_thw=grids)
        out = model(**inputs)
        logits = out.logits[0]
        feats = model.model.get_image_features(pixel_values=inputs["pixel_values"], image_grid_thw=grids).pooler_output
        image_features = torch.cat(list(feats), dim=0)
        gen = model.generate(**inputs, do_sample=False, max_new_tokens=MAX_NEW_TOKENS,
                             output_logits=True, return_dict_in_generate=True)
    seq = input_ids.shape[1]
    greedy = gen.sequences[0, seq:]
    step_logits = torch.stack([l[0] for l in gen.logits])
    torch.testing.assert_close(step_logits[0], logits[-1], rtol=0, atol=1e-4)
    top2 = step_logits.topk(2, dim=-1).values
    margin = (top2[:, 0] - top2[:, 1]).min().item()
    path = OUT / "cases" / f"{case_name}.safetensors"
    save_tensors(path, {
        "input_ids": input_ids[0].to(torch.int64),
        "mm_token_type_ids": inputs["mm_token_type_ids"][0].to(torch.int64),
        "position_ids": position_ids[:, 0].to(torch.int64),  # (3, seq)
        "image_grid_thw": grids.to(torch.int64),
        "image_features": image_features.float(),
        "logits": logits.float(),
        "greedy_ids": greedy.to(torch.int64),
        "greedy_logits": step_logits.float(),
    })
    return {
        "name": case_name, "model": f"models/{name}",
        "messages": messages, "rendered": rendered, "add_generation_prompt": True,
        "images": [f"images/{p['image']}" for m in messages for p in m["content"] if p["type"] == "image"],
        "tensors": rel(path), "seq_len": seq, "n_image_tokens": n_img,
        "image_grid_thw": grids.tolist(), "rope_delta": int(deltas[0, 0]),
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
    tok = build_tokenizer()
    facts, processors, cases = {}, {}, []
    for name, spec in SPECS.items():
        model_dir = build(name, spec, tok)
        model, processor = load(name, spec, model_dir)
        with safetensors.safe_open(str(model_dir / "model.safetensors"), "pt") as f:
            keys = sorted(f.keys())
        facts[name] = {"dir": f"models/{name}", "layout": spec["layout"], "architecture": spec["cls"].__name__,
                       "weight_keys": len(keys), "weight_prefixes": sorted({k.split(".")[0] + "." + k.split(".")[1]
                                                                            for k in keys}),
                       "image_token_id": model.config.image_token_id, "tokenizer_len": len(tok)}
        processors[name] = processor
        for case_name, model_name, messages in CASES:
            if model_name == name:
                cases.append(run_case(case_name, name, messages, model, processor, model_dir))
                print(f"{case_name}: seq {cases[-1]['seq_len']}, image tokens {cases[-1]['n_image_tokens']}, "
                      f"greedy {cases[-1]['greedy_text']!r}")
    pixels = make_pixels(processors)
    manifest = {
        "version": 1, "generator": "scripts/make_qwen_fixtures.py",
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                     "tokenizers": tokenizers.__version__, "safetensors": safetensors.__version__,
                     "numpy": np.__version__, "pillow": PIL.__version__},
        "seed": SEED, "min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS,
        "notes": {
            "dtype": "float32 tensors; ids int64",
            "attention": "eager, one CPU thread",
            "pixels": "Qwen2VLImageProcessorPil: convert_rgb, smart_resize(factor 28, min/max_pixels), PIL BICUBIC "
                      "resize of uint8, float32(u8*float64(1/255)), (x-mean)/std float32 (OpenAI CLIP), patch rows "
                      "(gh/2, gw/2, 2, 2) block order, each (C, T=2, 14, 14)",
            "position_ids": "get_rope_index (3, seq): text rows equal, image rows (start, start+h, start+w); "
                            "text after an image continues at start + max(h, w)",
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
