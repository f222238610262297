#!/usr/bin/env python3
"""Golden fixtures for glance's InternVL parity tests (run by hand, never in CI).

Writes everything under ``fixtures/internvl/`` (wiped and rebuilt; other fixtures untouched):

* ``images/``  small test images: the shared ones (aspect 3:2, a portrait, a tiny RGBA, a
               palette image), a 10:1 strip, a narrow one, and two squares on either side of
               ``get_optimal_tiled_canvas``'s tie-break (60x60 keeps one tile; 112x112 becomes 2x2
               tiles plus the thumbnail).
* ``models/internvl-qwen2/``  a tiny random-weight ``InternVLForConditionalGeneration`` with a
               Qwen2 decoder, a LayerNorm InternViT (InternVL-2.5 / 3 1B-8B style), in the
               layout of published ``-hf`` checkpoints (OpenGVLab/InternVL3-*-hf): weights
               ``language_model.model.*``, ``vision_tower.*``, ``multi_modal_projector.*``;
               ``preprocessor_config.json`` (``GotOcr2ImageProcessor``, ``crop_to_patches`` false
               as published: the processor tiles anyway); chat template in
               ``tokenizer_config.json`` and ``chat_template.json``.
* ``models/internvl-llama/``  the same with a Llama decoder and an RMSNorm InternViT with QK-norm
               and a final LayerNorm (``use_mean_pooling`` false; InternViT-6B style), as
               transformers 5 saves it (``processor_config.json`` holding the image settings, no
               ``preprocessor_config.json``, ``chat_template.jinja``), its weights renamed to the
               in-memory names transformers 4.52-4.57 saved (``model.language_model.*``,
               ``model.vision_tower.*``, ``model.multi_modal_projector.*``, ``lm_head``).
* ``pixels/``  ``pixel_values`` (tiles then thumbnail) and ``num_patches`` per image.
* ``cases/``   per prompt: input ids, image features, full-sequence logits, greedy tokens and the
               logits of each KV-cached generation step.
* ``manifest.json``.

Outputs are computed in float32 with ``attn_implementation="eager"`` on one CPU thread from the
checkpoints as re-loaded from disk. Images go through ``GotOcr2ImageProcessorPil``
(``backend="pil"``: no torchvision); no video processor.

Run from the repository root:  ``python3 scripts/make_internvl_fixtures.py``.
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
    GotOcr2ImageProcessorPil,
    InternVLConfig,
    InternVLForConditionalGeneration,
    InternVLProcessor,
    Qwen2Tokenizer,
)

# Without torchvision there is no video processor class; images only here (as
# scripts/make_qwen_fixtures.py).
_check_class = transformers.ProcessorMixin.check_argument_for_proper_class


def _check_class_no_video(self, name, arg):
    if name == "video_processor" and arg is None:
        return None
    return _check_class(self, name, arg)


transformers.ProcessorMixin.check_argument_for_proper_class = _check_class_no_video
_attributes = transformers.ProcessorMixin.get_attributes.__func__
InternVLProcessor.get_attributes = classmethod(lambda cls: [a for a in _attributes(cls) if a != "video_processor"])

ROOT = Path(__file__).resolve().parents[1]
SHARED_IMAGES = ROOT / "fixtures" / "images"
OUT = ROOT / "fixtures" / "internvl"
SEED = 2468
INIT_STD = 0.15
NORM_STD = 0.1
MAX_NEW_TOKENS = 10
SIZE_LIMIT_BYTES = 4 * 1024 * 1024
TILE = 56
MIN_PATCHES = 1
MAX_PATCHES = 6
# (56 / 14)^2 patches per tile, pixel-shuffled by 0.5.
IMAGE_SEQ_LENGTH = 4

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
IMAGE_SPECIALS = {"start_image_token": "<img>", "end_image_token": "</img>",
                  "context_image_token": "<IMG_CONTEXT>", "video_token": "<video>"}

# OpenGVLab/InternVL3-1B-hf's chat template.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'}}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for content in message['content'] %}{% if content['type'] == 'image' %}{{ '<IMG_CONTEXT>\n' }}"
    "{% elif content['type'] == 'video' %}{{ '<video>\n' }}{% elif content['type'] == 'text' %}"
    "{{ content['text'] }}{% endif %}{% endfor %}{% endif %}{{'<|im_end|>\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{'<|im_start|>assistant\n' }}{% endif %}"
)

CORPUS = """\
You are a helpful assistant. What is shown in this image? The image shows an astronaut in a white suit.
What is the man holding? He is holding a camera on a tripod in a park.
What animal is this? This is a cat. The cat is sitting on a table and looking at the camera.
Describe the picture in detail. There is a person standing in front of a flag.
Compare the two pictures. The first one is bright, the second one is dark and grey.
How many objects can you see? I can see three objects: a cup, a plate and a spoon.
What colour is the strip? The strip is brown and white. Is it day or night? It is day.
"""


def text_cfg(model_type, hidden, heads, kv, inter):
    return dict(model_type=model_type, hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv,
                intermediate_size=inter, num_hidden_layers=2, max_position_embeddings=512, rms_norm_eps=1e-6,
                rope_parameters=dict(rope_type="default", rope_theta=10000.0))


SPECS = {
    "internvl-qwen2": dict(
        text=text_cfg("qwen2", 64, 4, 2, 96),
        vision=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                    image_size=TILE, patch_size=14, norm_type="layer_norm", use_qk_norm=False,
                    use_mean_pooling=True, attention_bias=True),
        layout="hub", seed=0, tie=False,
    ),
    "internvl-llama": dict(
        text=text_cfg("llama", 48, 4, 2, 80),
        vision=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                    image_size=TILE, patch_size=14, norm_type="rms_norm", use_qk_norm=True,
                    use_mean_pooling=False, attention_bias=False),
        layout="transformers4.52", seed=1, tie=True,
    ),
}

IMAGES = {
    "astronaut.png": "shared RGB 300x200: 3x2 tiles + thumbnail",
    "camera_gray.png": "shared grayscale 150x230 portrait",
    "cup_rgba.png": "shared RGBA 40x30",
    "coffee_palette.png": "shared palette 120x80",
    "strip.png": "RGB 280x28: aspect 10:1, 6x1 tiles",
    "tall.png": "RGB 20x150: narrow, 1x6 tiles",
    "square_small.png": "RGB 60x60: tie-break keeps 1 tile, no thumbnail",
    "square_big.png": "RGB 112x112: tie-break picks 2x2 tiles + thumbnail",
}

CASES = [
    ("internvl-qwen2-astronaut", "internvl-qwen2", [
        {"role": "user", "content": [{"type": "image", "image": "astronaut.png"},
                                     {"type": "text", "text": "What is shown in this image?"}]}]),
    ("internvl-qwen2-two-images", "internvl-qwen2", [
        {"role": "user", "content": [{"type": "text", "text": "Compare the two pictures."},
                                     {"type": "image", "image": "strip.png"},
                                     {"type": "image", "image": "square_small.png"}]}]),
    ("internvl-qwen2-chat", "internvl-qwen2", [
        {"role": "system", "content": [{"type": "text", "text": "Give a short answer."}]},
        {"role": "user", "content": [{"type": "image", "image": "camera_gray.png"},
                                     {"type": "text", "text": "What is the man holding?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A camera."}]},
        {"role": "user", "content": [{"type": "text", "text": "Is it day or night?"}]}]),
    ("internvl-llama-square", "internvl-llama", [
        {"role": "user", "content": [{"type": "image", "image": "square_big.png"},
                                     {"type": "text", "text": "Describe the picture in detail."}]}]),
    ("internvl-llama-two-images", "internvl-llama", [
        {"role": "user", "content": [{"type": "image", "image": "tall.png"},
                                     {"type": "text", "text": "and"},
                                     {"type": "image", "image": "cup_rgba.png"},
                                     {"type": "text", "text": "What colour is the strip?"}]}]),
    ("internvl-llama-chat", "internvl-llama", [
        {"role": "user", "content": [{"type": "image", "image": "coffee_palette.png"},
                                     {"type": "text", "text": "How many objects can you see?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Three objects."}]},
        {"role": "user", "content": [{"type": "text", "text": "Is it day or night?"}]}]),
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
    astro.crop((100, 40, 160, 100)).save(out / "square_small.png", optimize=True)
    astro.crop((150, 60, 262, 172)).save(out / "square_big.png", optimize=True)
    Image.open(SHARED_IMAGES / "chelsea.jpg").convert("RGB").crop((90, 0, 110, 150)).save(out / "tall.png")


def load_image(name: str) -> Image.Image:
    img = Image.open(OUT / "images" / name)
    img.load()
    return img


def build_tokenizer() -> Qwen2Tokenizer:
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    bpe.train_from_iterator([CORPUS], trainer)
    model = json.loads(bpe.to_str())["model"]
    vocab = model["vocab"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tok = Qwen2Tokenizer(vocab=vocab, merges=merges, unk_token=None, bos_token=None,
                         eos_token="<|im_end|>", pad_token="<|endoftext|>", errors="replace",
                         extra_special_tokens=IMAGE_SPECIALS)
    tok.add_special_tokens({"additional_special_tokens": SPECIALS}, replace_extra_special_tokens=False)
    tok.chat_template = CHAT_TEMPLATE
    ids = [tok.convert_tokens_to_ids(s) for s in SPECIALS + list(IMAGE_SPECIALS.values())]
    assert len(set(ids)) == len(ids) and min(ids) >= len(vocab), ids
    assert tok.context_image_token == "<IMG_CONTEXT>"
    return tok


def init_weights(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            is_norm = "norm" in name
            if p.ndim >= 2 or "cls_token" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * INIT_STD)
            elif is_norm and name.endswith("weight"):
                p.copy_(1.0 + torch.randn(p.shape, generator=gen) * NORM_STD)
            elif "lambda" in name:
                p.copy_(0.5 + torch.randn(p.shape, generator=gen) * NORM_STD)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * NORM_STD)


def build(name: str, spec: dict, tok) -> Path:
    out = OUT / "models" / name
    text = dict(spec["text"], vocab_size=len(tok), bos_token_id=None,
                eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
                pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"), tie_word_embeddings=spec["tie"])
    config = InternVLConfig(text_config=text, vision_config=spec["vision"], image_token_id=tok.context_image_token_id,
                            image_seq_length=IMAGE_SEQ_LENGTH, downsample_ratio=0.5, tie_word_embeddings=spec["tie"])
    torch.manual_seed(SEED + spec["seed"])
    model = InternVLForConditionalGeneration(config)
    init_weights(model, SEED + 100 + spec["seed"])
    model.eval()
    model.generation_config.do_sample = False
    model.generation_config.eos_token_id = tok.convert_tokens_to_ids("<|im_end|>")
    model.save_pretrained(out, safe_serialization=True)
    image_processor = GotOcr2ImageProcessorPil(size={"height": TILE, "width": TILE}, crop_to_patches=True,
                                               min_patches=MIN_PATCHES, max_patches=MAX_PATCHES)
    processor = InternVLProcessor(image_processor=image_processor, tokenizer=tok, image_seq_length=IMAGE_SEQ_LENGTH,
                                  chat_template=CHAT_TEMPLATE)
    processor.save_pretrained(out)
    if spec["layout"] == "hub":
        to_hub_layout(out)
    else:
        to_model_prefix(out)
    return out


def rewrite_weights(out: Path, rename) -> None:
    with safetensors.safe_open(str(out / "model.safetensors"), "pt") as f:
        tensors = {rename(k): f.get_tensor(k) for k in f.keys()}
    save_tensors(out / "model.safetensors", tensors)


def to_model_prefix(out: Path) -> None:
    """transformers 5 saves the published names; older ones saved the in-memory names."""
    def rename(k: str) -> str:
        if k.startswith("language_model.lm_head"):
            return "lm_head" + k[len("language_model.lm_head"):]
        if k.startswith("language_model.model."):
            return "model.language_model." + k[len("language_model.model."):]
        return "model." + k
    rewrite_weights(out, rename)


def to_hub_layout(out: Path) -> None:
    """Rewrites a transformers-5 save into the layout of OpenGVLab/InternVL3-*-hf."""
    with safetensors.safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert any(k.startswith("language_model.model.") for k in keys) and any(k.startswith("vision_tower.") for k in keys)
    proc = json.loads((out / "processor_config.json").read_text())
    image = proc.pop("image_processor")
    image["image_processor_type"] = "GotOcr2ImageProcessor"
    image["processor_class"] = "InternVLProcessor"
    image["crop_to_patches"] = False
    (out / "preprocessor_config.json").write_text(json.dumps(image, indent=2) + "\n")
    (out / "processor_config.json").write_text(json.dumps(proc, indent=2) + "\n")
    tok_cfg = json.loads((out / "tokenizer_config.json").read_text())
    tok_cfg["chat_template"] = (out / "chat_template.jinja").read_text()
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2) + "\n")
    (out / "chat_template.json").write_text(json.dumps({"chat_template": tok_cfg["chat_template"]}, indent=2) + "\n")
    (out / "chat_template.jinja").unlink()


def load(model_dir: Path):
    model = InternVLForConditionalGeneration.from_pretrained(model_dir, attn_implementation="eager",
                                                             dtype=torch.float32)
    model.eval()
    processor = AutoProcessor.from_pretrained(model_dir, backend="pil")
    assert type(processor.image_processor) is GotOcr2ImageProcessorPil, type(processor.image_processor)
    assert processor.image_seq_length == IMAGE_SEQ_LENGTH
    return model, processor


def make_pixels(processors: dict) -> list:
    """Expected pixels once per image, through each model's processor (as the processor calls it:
    ``crop_to_patches`` on)."""
    entries = []
    for image in IMAGES:
        got = {name: p.image_processor(images=load_image(image), crop_to_patches=True, return_tensors="pt")
               for name, p in processors.items()}
        first = next(iter(got.values()))
        for g in got.values():
            assert torch.equal(g["pixel_values"], first["pixel_values"])
        n = int(first["num_patches"][0])
        img = load_image(image)
        path = OUT / "pixels" / f"{Path(image).stem}.safetensors"
        save_tensors(path, {"pixel_values": first["pixel_values"].float()})
        entries.append({"image": f"images/{image}", "tensors": rel(path), "size": [img.height, img.width],
                        "num_patches": n, "n_image_tokens": n * IMAGE_SEQ_LENGTH})
    return entries


def run_case(case_name: str, name: str, messages: list, model, processor, model_dir: Path) -> dict:
    images = [load_image(p["image"]) for m in messages for p in m["content"] if p["type"] == "image"]
    plain = [{"role": m["role"], "content": [{"type": p["type"], **({"text": p["text"]} if "text" in p else {})}
                                            for p in m["content"]]} for m in messages]
    rendered = processor.apply_chat_template(plain, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=rendered, images=images, return_tensors="pt")
    input_ids = inputs["input_ids"]
    cfg = model.config
    n_img = int((input_ids == cfg.image_token_id).sum())
    per_image = [processor.image_processor(images=i, crop_to_patches=True, return_tensors="pt") for i in images]
    num_patches = [int(p["num_patches"][0]) for p in per_image]
    assert n_img == IMAGE_SEQ_LENGTH * sum(num_patches), (n_img, num_patches)
    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    expanded = rendered
    for n in num_patches:
        expanded = expanded.replace("<IMG_CONTEXT>", "<img>" + "<|placeholder|>" * (n * IMAGE_SEQ_LENGTH) + "</img>", 1)
    expanded = expanded.replace("<|placeholder|>", "<IMG_CONTEXT>")
    assert raw.encode(expanded, add_special_tokens=True).ids == input_ids[0].tolist(), case_name
    expected = torch.cat([p["pixel_values"] for p in per_image])
    assert torch.equal(inputs["pixel_values"], expected)
    with torch.no_grad():
        out = model(**inputs)
        logits = out.logits[0]
        feats = model.model.get_image_features(pixel_values=inputs["pixel_values"]).pooler_output
        image_features = feats.reshape(-1, feats.shape[-1])
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
        "image_features": image_features.float(),
        "logits": logits.float(),
        "greedy_ids": greedy.to(torch.int64),
        "greedy_logits": step_logits.float(),
    })
    return {
        "name": case_name, "model": f"models/{name}",
        "messages": messages, "rendered": rendered, "add_generation_prompt": True,
        "images": [f"images/{p['image']}" for m in messages for p in m["content"] if p["type"] == "image"],
        "tensors": rel(path), "seq_len": seq, "n_image_tokens": n_img, "num_patches": num_patches,
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
        model, processor = load(model_dir)
        with safetensors.safe_open(str(model_dir / "model.safetensors"), "pt") as f:
            keys = sorted(f.keys())
        facts[name] = {"dir": f"models/{name}", "layout": spec["layout"], "text_model_type": spec["text"]["model_type"],
                       "weight_keys": len(keys),
                       "weight_prefixes": sorted({".".join(k.split(".")[:2]) for k in keys}),
                       "image_token_id": model.config.image_token_id, "tokenizer_len": len(tok)}
        processors[name] = processor
        for case_name, model_name, messages in CASES:
            if model_name == name:
                cases.append(run_case(case_name, name, messages, model, processor, model_dir))
                print(f"{case_name}: seq {cases[-1]['seq_len']}, image tokens {cases[-1]['n_image_tokens']}, "
                      f"greedy {cases[-1]['greedy_text']!r}")
    pixels = make_pixels(processors)
    manifest = {
        "version": 1, "generator": "scripts/make_internvl_fixtures.py",
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                     "tokenizers": tokenizers.__version__, "safetensors": safetensors.__version__,
                     "numpy": np.__version__, "pillow": PIL.__version__},
        "seed": SEED, "tile": TILE, "min_patches": MIN_PATCHES, "max_patches": MAX_PATCHES,
        "image_seq_length": IMAGE_SEQ_LENGTH,
        "notes": {
            "dtype": "float32 tensors; ids int64",
            "attention": "eager, one CPU thread",
            "pixels": "GotOcr2ImageProcessorPil, crop_to_patches (the processor's default): convert_rgb, "
                      "get_optimal_tiled_canvas, PIL BICUBIC resize of uint8 to (rows*tile, cols*tile), tiles "
                      "row-major, then a tile-size thumbnail when more than one tile; float32(u8/255), "
                      "(x-mean)/std (OpenAI CLIP)",
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
