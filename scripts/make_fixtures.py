#!/usr/bin/env python3
"""Golden fixtures for glance's parity tests (run by hand, never in CI).

What it makes (everything under ``fixtures/``, wiped and rebuilt from scratch):

* ``images/``   five small test images cut from scikit-image's bundled samples (offline):
                an RGB PNG (downscaled), a grayscale mode-L PNG (non-square), a JPEG, a tiny RGBA
                PNG with a real alpha channel (upscaled by every preprocessor) and a palette (mode P) PNG.
* ``models/<name>/``  three tiny random-weight ``LlavaForConditionalGeneration`` checkpoints in
                Hugging Face layout (``config.json``, ``model.safetensors``, ``generation_config.json``,
                ``tokenizer.json``, ``tokenizer_config.json``, ``chat_template.jinja``,
                ``processor_config.json``, ``preprocessor_config.json``):
                ``llama-gqa`` (Llama text model, GQA, llama3 rope scaling),
                ``mistral`` (sliding window shorter than the fixture sequences) and
                ``qwen2`` (q/k/v biases, tied embeddings, positive ``vision_feature_layer``).
* ``pixels/``   expected ``pixel_values`` for every (preprocessor, image) pair.
* ``cases/``    per prompt: input ids, pixels, full-sequence logits, greedy tokens and the logits of
                each (KV-cached) generation step, image features, the vision hidden state at
                ``vision_feature_layer`` and the CLS attention row of the layer producing it.
* ``manifest.json``  index of all of the above (format version 1) plus versions and notes.

How it was made / quirks of the versions used (transformers 5.24.0, torch 2.15.0 CPU,
tokenizers 0.23.3, safetensors 0.8.0, numpy 2.4.6, Pillow 13.0.0, scikit-image 0.26.0):

* Tokenizer: a byte-fallback BPE trained with ``tokenizers`` on the small English corpus below
  (vocab = <unk>, <s>, </s>, 256 byte tokens <0x00>..<0xFF>, then characters and merges), wrapped
  by ``transformers.LlamaTokenizer`` (= ``LlamaTokenizerFast`` in v5) with ``add_bos_token=True`` so
  the saved post-processor is ``TemplateProcessing`` ``<s> $A``.  ``<image>`` and ``<pad>`` are
  added special tokens at the end of the vocab, as in llava-hf/llava-1.5.  In v5 ``LlamaTokenizer``
  rebuilds its normalizer / pre-tokenizer / decoder in ``__init__`` (it keeps only vocab, merges
  and the post-processor of a tokenizer.json), so we build the tokenizer through that class: what
  the file says is exactly what transformers does.  (``AutoTokenizer`` / ``AutoProcessor`` on these
  dirs give a plain ``TokenizersBackend`` that reads tokenizer.json verbatim.)  The script checks
  that the raw ``tokenizers.Tokenizer.from_file(tokenizer.json)``, ``LlamaTokenizer`` and the
  processor all give every fixture's input ids.  ``tokenizer_config.json`` has no
  ``add_bos_token`` key in v5: BOS comes from the post-processor alone.
* Chat template: llava-hf/llava-1.5's template (including its ``{% generation %}`` tags).
  transformers 5.24 writes it to ``chat_template.jinja`` (both the processor and the tokenizer
  save it there); it is NOT in ``tokenizer_config.json`` and there is no ``chat_template.json``.
* Image preprocessing: ``CLIPImageProcessorPil`` -- the PIL/NumPy backend.  In 5.24 the name
  ``CLIPImageProcessor`` is the torchvision backend; the PIL one is ``CLIPImageProcessorPil`` and
  saves itself as ``"image_processor_type": "CLIPImageProcessor"``.  Pipeline: convert_rgb
  (alpha, incl. palette transparency, is composited onto white; other modes ``.convert("RGB")``),
  PIL BICUBIC resize of the uint8 image so the short side = ``shortest_edge`` and the long side =
  ``int(shortest_edge * long / short)``, centre crop at ``((h - ch) // 2, (w - cw) // 2)``,
  rescale ``float32(uint8 * float64(1/255))``, normalise ``(x - mean) / std`` in float32 with the
  OpenAI CLIP mean/std (``reference_pixels`` restates this and must match bit for bit).
  (torchvision is not installed here, so even ``CLIPImageProcessor`` / ``AutoImageProcessor``
  would fall back to this PIL backend, with a warning; the script asks for ``backend="pil"``.)
  ``LlavaProcessor.save_pretrained`` in 5.24 writes only
  ``processor_config.json`` (image processor nested inside); we additionally save the image
  processor itself so the classic ``preprocessor_config.json`` exists.
* Weights: 5.24 keeps the new names in memory (``model.language_model.*``, ``model.vision_tower.*``,
  ``model.multi_modal_projector.*``, ``lm_head.weight``) but ``save_pretrained`` reverts them to
  the llava-hf hub names -- ``language_model.model.*``, ``language_model.lm_head.weight``,
  ``multi_modal_projector.*`` -- with one difference from real hub checkpoints: the vision tower
  is saved as ``vision_tower.embeddings.*`` / ``vision_tower.encoder.*`` / ``vision_tower.pre_layrnorm.*``
  / ``vision_tower.post_layernorm.*``, WITHOUT the ``vision_model.`` level that hub files have
  (``vision_tower.vision_model.*``).  5.24 loads all three spellings to the same model.  A tied
  ``lm_head`` (qwen2) is not saved.  ``config.json`` stores rope settings as ``rope_parameters``
  (v5 style, incl. ``rope_theta``), not the older ``rope_theta`` + ``rope_scaling`` keys.
* Outputs are computed in float32 with ``attn_implementation="eager"`` on one CPU thread from the
  checkpoints as re-loaded from disk.

Run from the repository root:  ``python3 scripts/make_fixtures.py``  (about 15 seconds on 2 cores).
"""

from __future__ import annotations

import copy
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import PIL
import safetensors
import safetensors.torch
import skimage
import skimage.data
import tokenizers
import torch
import transformers
from PIL import Image
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
from transformers import (
    AutoProcessor,
    CLIPImageProcessorPil,
    CLIPVisionConfig,
    LlamaConfig,
    LlamaTokenizer,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    MistralConfig,
    Qwen2Config,
)

# --------------------------------------------------------------------------------------------
# Constants
# --------------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
MANIFEST_VERSION = 1
SEED = 1234
INIT_STD = 0.15  # weights ~ N(0, INIT_STD): far from uniform logits, non-trivial greedy tokens
NORM_STD = 0.1  # norm weights ~ 1 + N(0, NORM_STD), biases ~ N(0, NORM_STD)
MAX_NEW_TOKENS = 12
SIZE_LIMIT_BYTES = 5 * 1024 * 1024

BPE_VOCAB_SIZE = 400  # <unk> <s> </s> + 256 byte tokens + characters + merges
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]
IMAGE_TOKEN = "<image>"
PAD_TOKEN = "<pad>"
PATCH_SIZE = 14

# llava-hf/llava-1.5-*-hf chat template (one line in the original).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] != 'system' %}{{ message['role'].upper() + ': '}}{% endif %}"
    "{# Render all images first #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}"
    "{{ '<image>\n' }}"
    "{% endfor %}"
    "{# Render all text next #}"
    "{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{{ content['text'] + ' '}}"
    "{% endfor %}"
    "{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ content['text'] + ' '}}{% endgeneration %}"
    "{% endfor %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)

# Training text for the BPE (ASCII only, so that non-ASCII prompt characters use byte fallback).
CORPUS = """\
USER: What is shown in this image? ASSISTANT: The image shows an astronaut in a white suit.
USER: What is the man holding? ASSISTANT: He is holding a camera on a tripod in a park.
USER: What animal is this? ASSISTANT: This is a cat. The cat is sitting on a table and looking at the camera.
USER: Describe the picture in detail. ASSISTANT: There is a person standing in front of a flag.
The sky is blue and the grass is green. A red car is parked next to two tall trees.
How many objects can you see in the picture? I can see three objects: a cup, a plate and a spoon.
Is there a dog in the image? No, there is no dog in the image. There is only a cat.
What colour is the square? The square is red. The circle is blue and the triangle is yellow.
Where is the circle? The circle is on the left of the square, near the top of the picture.
Read the sign. The sign says 42. The number on the sign is small and hard to read.
Look closely at the background. The background is plain and mostly white, with a light texture.
The astronaut wears a helmet and holds it under one arm. Behind the astronaut there is a flag.
The photographer stands on the grass and looks through the camera. The sky is clear.
A cup of coffee sits on a saucer. The coffee is dark brown and the cup is white.
The small icon has a transparent background. Its colour is mostly blue with some orange.
Count the shapes: one square, two circles and three triangles. That makes six shapes.
Answer the question with a single word. Answer yes or no. Give a short answer.
Describe the colours you see, then describe the shapes, then say where each object is.
Is it day or night? It is day. The light is bright and the shadows are short.
What is in the top left corner? There is a small green triangle in the top left corner.
Please explain what the person is doing. The person is taking a photo of the city.
Then count the objects and tell me which one is the largest. The largest object is the table.
The image is black and white. It shows a man with a camera, a tripod and some buildings.
The cat has soft fur with black, brown and white stripes. Its eyes are open and bright.
Now describe the man, the camera and the sky. The man wears a dark coat.
"""


@dataclass
class ModelSpec:
    name: str
    text_cls: type
    text_kwargs: dict
    vision_kwargs: dict
    llava_kwargs: dict
    vocab_pad: int = 0  # text vocab_size = len(tokenizer) + vocab_pad
    seed_offset: int = 0


MODEL_SPECS = [
    ModelSpec(
        name="llama-gqa",
        text_cls=LlamaConfig,
        text_kwargs=dict(
            hidden_size=72,
            num_attention_heads=6,
            num_key_value_heads=2,
            intermediate_size=100,
            num_hidden_layers=2,
            max_position_embeddings=512,
            rms_norm_eps=1e-5,
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=10000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=64,
            ),
        ),
        vision_kwargs=dict(
            image_size=56,
            hidden_size=48,
            num_attention_heads=4,
            num_hidden_layers=3,
            intermediate_size=80,
            hidden_act="quick_gelu",
        ),
        llava_kwargs=dict(vision_feature_select_strategy="default", vision_feature_layer=-2),
        vocab_pad=11,  # like llava-1.5 (32064 > 32002): logits cover ids the tokenizer lacks
        seed_offset=0,
    ),
    ModelSpec(
        name="mistral",
        text_cls=MistralConfig,
        text_kwargs=dict(
            hidden_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=96,
            num_hidden_layers=2,
            max_position_embeddings=512,
            rms_norm_eps=1e-5,
            sliding_window=24,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0),
        ),
        vision_kwargs=dict(
            image_size=42,
            hidden_size=40,
            num_attention_heads=4,
            num_hidden_layers=2,
            intermediate_size=72,
            hidden_act="gelu",
        ),
        llava_kwargs=dict(vision_feature_select_strategy="full", vision_feature_layer=-1),
        vocab_pad=0,
        seed_offset=1,
    ),
    ModelSpec(
        name="qwen2",
        text_cls=Qwen2Config,
        text_kwargs=dict(
            hidden_size=56,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=88,
            num_hidden_layers=2,
            max_position_embeddings=512,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
        ),
        vision_kwargs=dict(
            image_size=70,
            hidden_size=36,
            num_attention_heads=3,
            num_hidden_layers=3,
            intermediate_size=60,
            hidden_act="quick_gelu",
        ),
        llava_kwargs=dict(vision_feature_select_strategy="default", vision_feature_layer=1),
        vocab_pad=5,
        seed_offset=2,
    ),
]


@dataclass
class Case:
    name: str
    model: str
    image: str
    prompt: str


CASES = [
    Case("llama-gqa-astronaut", "llama-gqa", "astronaut.png",
         "USER: <image>\nWhat is the astronaut holding? ASSISTANT:"),
    Case("llama-gqa-camera", "llama-gqa", "camera_gray.png",
         "Look closely. <image> Now describe the man, the camera and the sky. "
         "Is it day or night? Answer briefly \u2014 in one sentence."),
    Case("llama-gqa-palette", "llama-gqa", "coffee_palette.png",
         "<image>\nWhat is in the cup?"),
    Case("mistral-chelsea", "mistral", "chelsea.jpg",
         "USER: <image>\nWhat animal is this? Describe its fur. ASSISTANT:"),
    Case("mistral-rgba", "mistral", "cup_rgba.png",
         "Here is a small icon: <image>. What colour is it? Is the background transparent? "
         "Give a short answer."),
    Case("qwen2-palette", "qwen2", "coffee_palette.png",
         "USER: Describe the colours you see.\n<image>\nThen count the objects. ASSISTANT:"),
    Case("qwen2-astronaut", "qwen2", "astronaut.png",
         "Please explain what the person is doing. Where is the flag? <image>"),
]

# One chat per model.  Image parts are {"type": "image"}; the manifest names the image file.
CHATS = [
    ("llama-gqa", "astronaut.png", [
        {"role": "user", "content": [
            {"type": "image"},
            {"type": "text", "text": "What is this?"},
        ]},
    ]),
    ("mistral", "chelsea.jpg", [
        {"role": "user", "content": [
            {"type": "image"},
            {"type": "text", "text": "What animal is this?"},
        ]},
        {"role": "assistant", "content": [{"type": "text", "text": "This is a cat."}]},
        {"role": "user", "content": [{"type": "text", "text": "What colour is its fur?"}]},
    ]),
    ("qwen2", "camera_gray.png", [
        {"role": "system", "content": [{"type": "text", "text": "Give a short answer."}]},
        {"role": "user", "content": [
            {"type": "text", "text": "Is it day or night?"},
            {"type": "image"},
        ]},
    ]),
]


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def rel(path: Path) -> str:
    return path.relative_to(FIXTURES).as_posix()


def save_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    safetensors.torch.save_file(
        {k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(path), metadata={"format": "pt"}
    )


def set_seed(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)


# --------------------------------------------------------------------------------------------
# Step 1: images
# --------------------------------------------------------------------------------------------


def make_images() -> dict[str, str]:
    """Writes the test images; returns {file name: description}."""
    out = FIXTURES / "images"
    out.mkdir(parents=True)
    described = {}

    # RGB PNG 300x200: astronaut cropped to 3:2, large-factor downscale in every preprocessor.
    astro = Image.fromarray(skimage.data.astronaut()).crop((0, 60, 512, 401))
    astro = astro.resize((300, 200), Image.Resampling.LANCZOS)
    astro.save(out / "astronaut.png", optimize=True)
    described["astronaut.png"] = "RGB PNG 300x200 (W x H), downscaled by every preprocessor"

    # Grayscale (mode L) PNG 150x230: portrait, odd crop offsets.
    cam = Image.fromarray(skimage.data.camera()).crop((100, 0, 433, 512))
    cam = cam.resize((150, 230), Image.Resampling.LANCZOS)
    assert cam.mode == "L"
    cam.save(out / "camera_gray.png", optimize=True)
    described["camera_gray.png"] = "grayscale mode-L PNG 150x230"

    # JPEG 200x150, quality 90 (decoder differences are part of what a JPEG case tests).
    cat = Image.fromarray(skimage.data.chelsea()).crop((25, 0, 425, 300))
    cat = cat.resize((200, 150), Image.Resampling.LANCZOS)
    cat.save(out / "chelsea.jpg", quality=90)
    described["chelsea.jpg"] = "RGB JPEG 200x150, quality 90, baseline 4:2:0"

    # RGBA PNG 40x30 with a real alpha channel (soft-edged ellipse; the colour under alpha 0 is kept,
    # so dropping alpha instead of compositing on white gives different pixels). Upscaled everywhere.
    rgb = Image.fromarray(skimage.data.coffee()).crop((150, 40, 510, 310)).resize((40, 30), Image.Resampling.LANCZOS)
    yy, xx = np.mgrid[0:30, 0:40]
    r = np.sqrt(((xx - 19.5) / 17.0) ** 2 + ((yy - 14.5) / 12.0) ** 2)
    alpha = np.clip((1.15 - r) / 0.3, 0.0, 1.0)
    alpha = np.round(alpha * 255).astype(np.uint8)
    rgba = np.dstack([np.asarray(rgb), alpha])
    icon = Image.fromarray(rgba, mode="RGBA")
    assert alpha.min() == 0 and alpha.max() == 255 and ((alpha > 0) & (alpha < 255)).any()
    icon.save(out / "cup_rgba.png", optimize=True)
    described["cup_rgba.png"] = "RGBA PNG 40x30, soft alpha ellipse, upscaled (composited on white)"

    # Palette (mode P) PNG 120x80, 16 colours, no transparency.
    coffee = Image.fromarray(skimage.data.coffee()).resize((120, 80), Image.Resampling.LANCZOS)
    pal = coffee.quantize(colors=16, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    assert pal.mode == "P"
    pal.save(out / "coffee_palette.png", optimize=True)
    described["coffee_palette.png"] = "palette mode-P PNG 120x80, 16 colours, no tRNS"

    return described


def load_image(name: str) -> Image.Image:
    img = Image.open(FIXTURES / "images" / name)
    img.load()
    return img


# --------------------------------------------------------------------------------------------
# Step 2: tokenizer
# --------------------------------------------------------------------------------------------


def build_tokenizer() -> LlamaTokenizer:
    byte_tokens = [f"<0x{i:02X}>" for i in range(256)]
    bpe = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    bpe.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=True)
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB_SIZE, special_tokens=SPECIAL_TOKENS + byte_tokens, show_progress=False
    )
    bpe.train_from_iterator([CORPUS], trainer)
    model = json.loads(bpe.to_str())["model"]
    vocab = model["vocab"]
    merges = [tuple(m) for m in model["merges"]]
    assert [vocab[t] for t in SPECIAL_TOKENS] == [0, 1, 2]
    assert vocab["<0x00>"] == 3 and vocab["<0xFF>"] == 258

    tok = LlamaTokenizer(vocab=vocab, merges=merges, add_bos_token=True, add_eos_token=False, legacy=False)
    tok.add_special_tokens({"additional_special_tokens": [IMAGE_TOKEN]})
    tok.add_special_tokens({"pad_token": PAD_TOKEN})
    tok.chat_template = CHAT_TEMPLATE
    assert tok.convert_tokens_to_ids(IMAGE_TOKEN) == len(vocab)
    assert tok.convert_tokens_to_ids(PAD_TOKEN) == len(vocab) + 1
    assert tok("hi")["input_ids"][0] == tok.bos_token_id
    return tok


# --------------------------------------------------------------------------------------------
# Step 3: models
# --------------------------------------------------------------------------------------------


def init_weights(model: torch.nn.Module, seed: int) -> None:
    """Large-std random init so that logits are far from uniform."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            is_norm = any(k in name for k in ("norm", "layrnorm", "layer_norm"))
            if p.ndim >= 2 or name.endswith("class_embedding"):
                p.copy_(torch.randn(p.shape, generator=gen) * INIT_STD)
            elif is_norm and name.endswith("weight"):
                p.copy_(1.0 + torch.randn(p.shape, generator=gen) * NORM_STD)
            else:  # biases
                p.copy_(torch.randn(p.shape, generator=gen) * NORM_STD)


def build_model(spec: ModelSpec, tok: LlamaTokenizer) -> LlavaForConditionalGeneration:
    vocab_size = len(tok) + spec.vocab_pad
    text = spec.text_cls(
        vocab_size=vocab_size,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **spec.text_kwargs,
    )
    vision = CLIPVisionConfig(patch_size=PATCH_SIZE, layer_norm_eps=1e-5, projection_dim=32, **spec.vision_kwargs)
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tok.convert_tokens_to_ids(IMAGE_TOKEN),
        projector_hidden_act="gelu",
        image_seq_length=n_image_tokens(spec),
        **spec.llava_kwargs,
    )
    set_seed(SEED + spec.seed_offset)
    model = LlavaForConditionalGeneration(config)
    init_weights(model, SEED + 100 + spec.seed_offset)
    model.eval()
    return model


def n_patches(spec: ModelSpec) -> int:
    return (spec.vision_kwargs["image_size"] // PATCH_SIZE) ** 2


def n_image_tokens(spec: ModelSpec) -> int:
    strategy = spec.llava_kwargs["vision_feature_select_strategy"]
    return n_patches(spec) + (1 if strategy == "full" else 0)


def build_processor(spec: ModelSpec, tok: LlamaTokenizer) -> LlavaProcessor:
    size = spec.vision_kwargs["image_size"]
    image_processor = CLIPImageProcessorPil(
        size={"shortest_edge": size}, crop_size={"height": size, "width": size}
    )
    return LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tok,
        patch_size=PATCH_SIZE,
        vision_feature_select_strategy=spec.llava_kwargs["vision_feature_select_strategy"],
        chat_template=CHAT_TEMPLATE,
        num_additional_image_tokens=1,  # the CLS token
    )


def save_checkpoint(spec: ModelSpec, tok: LlamaTokenizer) -> Path:
    out = FIXTURES / "models" / spec.name
    model = build_model(spec, tok)
    model.save_pretrained(out, safe_serialization=True)
    processor = build_processor(spec, tok)
    processor.save_pretrained(out)
    if not (out / "preprocessor_config.json").exists():
        processor.image_processor.save_pretrained(out)
    return out


def load_checkpoint(model_dir: Path) -> tuple[LlavaForConditionalGeneration, LlavaProcessor]:
    """Loads a checkpoint the way a user does (Auto classes), with the PIL image backend."""
    model = LlavaForConditionalGeneration.from_pretrained(model_dir, attn_implementation="eager", dtype=torch.float32)
    model.eval()
    processor = AutoProcessor.from_pretrained(model_dir, backend="pil")
    assert isinstance(processor, LlavaProcessor)
    assert type(processor.image_processor) is CLIPImageProcessorPil
    assert processor.num_additional_image_tokens == 1 and processor.patch_size == PATCH_SIZE
    assert processor.chat_template == CHAT_TEMPLATE
    return model, processor


def check_checkpoint_files(spec: ModelSpec, model_dir: Path) -> dict:
    """Checks the files 5.24 wrote and returns facts for the manifest."""
    with safetensors.safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        keys = sorted(f.keys())
    # 5.24 reverts its in-memory names (model.language_model.*, lm_head.weight) to the hub names on
    # save, except that CLIP's `vision_model.` prefix is dropped and not put back.
    prefixes = ("language_model.model.", "vision_tower.", "multi_modal_projector.")
    assert all(k.startswith(prefixes) or k == "language_model.lm_head.weight" for k in keys), keys
    assert not any(k.startswith(("model.", "lm_head.", "vision_tower.vision_model.")) for k in keys)
    tied = spec.text_kwargs.get("tie_word_embeddings", False)
    assert ("language_model.lm_head.weight" in keys) == (not tied)
    tok_cfg = json.loads((model_dir / "tokenizer_config.json").read_text())
    assert "chat_template" not in tok_cfg
    assert (model_dir / "chat_template.jinja").read_text() == CHAT_TEMPLATE
    assert not (model_dir / "chat_template.json").exists()
    pre = json.loads((model_dir / "preprocessor_config.json").read_text())
    assert pre["image_processor_type"] == "CLIPImageProcessor"
    return {"weight_keys": len(keys), "lm_head_saved": "language_model.lm_head.weight" in keys}


# --------------------------------------------------------------------------------------------
# Step 4: expected pixels
# --------------------------------------------------------------------------------------------


def reference_pixels(image: Image.Image, size: int) -> np.ndarray:
    """Independent re-statement of the CLIP PIL pipeline; must match the processor bit for bit."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        image = Image.alpha_composite(white, rgba).convert("RGB")
    else:
        image = image.convert("RGB")
    w, h = image.size
    if w <= h:
        new_w, new_h = size, int(size * h / w)
    else:
        new_w, new_h = int(size * w / h), size
    arr = np.asarray(image.resize((new_w, new_h), Image.Resampling.BICUBIC))  # (h, w, 3) uint8
    top, left = (new_h - size) // 2, (new_w - size) // 2
    arr = arr[top : top + size, left : left + size]
    x = (arr.astype(np.float64) * (1 / 255)).astype(np.float32)
    mean = np.array(OPENAI_CLIP_MEAN, dtype=np.float32)
    std = np.array(OPENAI_CLIP_STD, dtype=np.float32)
    return ((x - mean) / std).transpose(2, 0, 1)  # (3, size, size)


def make_pixels(model_dirs: dict[str, Path], image_names: list[str]) -> list[dict]:
    entries = []
    for model_name, model_dir in model_dirs.items():
        proc = CLIPImageProcessorPil.from_pretrained(model_dir)
        for image_name in image_names:
            pv = proc(load_image(image_name), return_tensors="pt")["pixel_values"][0]
            size = proc.crop_size["height"]
            assert pv.shape == (3, size, size) and pv.dtype == torch.float32
            assert np.array_equal(pv.numpy(), reference_pixels(load_image(image_name), size)), image_name
            stem = Path(image_name).stem
            path = FIXTURES / "pixels" / f"{model_name}-{stem}.safetensors"
            save_tensors(path, {"pixel_values": pv})
            if load_image(image_name).mode == "RGBA":  # the fixture tells compositing from dropping alpha
                dropped = proc(load_image(image_name).convert("RGB"), return_tensors="pt")["pixel_values"][0]
                assert (dropped - pv).abs().max() > 0.5
            entries.append({
                "preprocessor": rel(model_dir / "preprocessor_config.json"),
                "image": f"images/{image_name}",
                "tensor": rel(path),
            })
    return entries


# --------------------------------------------------------------------------------------------
# Step 5: cases (forward pass, greedy generation, vision internals)
# --------------------------------------------------------------------------------------------


def vision_internals(model: LlavaForConditionalGeneration, pixel_values: torch.Tensor) -> dict:
    """Hidden state at vision_feature_layer (incl. CLS) and the CLS attention row of the layer making it."""
    cfg = model.config
    tower = model.model.vision_tower
    n_layers = cfg.vision_config.num_hidden_layers
    out = tower(pixel_values, output_hidden_states=True, output_attentions=True, return_dict=True)
    hs, attn = out.hidden_states, out.attentions
    assert len(hs) == n_layers + 1 and len(attn) == n_layers
    hs_index = cfg.vision_feature_layer % (n_layers + 1)  # index into hidden_states
    assert hs_index >= 1, "hidden_states[0] (embeddings) has no producing layer"
    attn_layer = hs_index - 1  # hidden_states[i] is the output of encoder layer i-1
    # The layer we name really produces that hidden state.
    layer = tower.encoder.layers[attn_layer]
    redo = layer(hs[attn_layer], attention_mask=None)
    redo = redo[0] if isinstance(redo, tuple) else redo
    torch.testing.assert_close(redo, hs[hs_index], rtol=0, atol=1e-5)
    # hidden_states[0] is the encoder input (embeddings after pre_layrnorm) ...
    torch.testing.assert_close(hs[0], tower.pre_layrnorm(tower.embeddings(pixel_values)), rtol=0, atol=0)
    # ... and hidden_states[-1] the encoder output before post_layernorm.
    torch.testing.assert_close(hs[-1], out.last_hidden_state, rtol=0, atol=0)
    return {
        "vision_hidden": hs[hs_index][0],  # (n_patches + 1, vision_hidden)
        "vision_cls_attn": attn[attn_layer][0, :, 0, :],  # (heads, n_patches + 1)
        "hs_index": hs_index,
        "attn_layer": attn_layer,
    }


def check_sliding_window(model: LlavaForConditionalGeneration, inputs: dict, logits: torch.Tensor) -> None:
    """Rows before the window are unaffected by it, the rest differ: key j is seen from query i iff i-W < j <= i."""
    window = getattr(model.config.text_config, "sliding_window", None)
    if window is None:
        return
    seq = inputs["input_ids"].shape[1]
    assert seq > window + 4, f"sequence {seq} not longer than the sliding window {window}"
    full = copy.deepcopy(model)
    full.config.text_config.sliding_window = None
    full.model.language_model.config.sliding_window = None
    with torch.no_grad():
        ref = full(**inputs).logits[0]
    torch.testing.assert_close(ref[:window], logits[:window], rtol=0, atol=1e-5)
    assert (ref[window] - logits[window]).abs().max() > 1e-3, "sliding window had no effect at its edge"


def run_case(case: Case, model, processor, model_dir: Path) -> dict:
    image = load_image(case.image)
    assert case.prompt.count(IMAGE_TOKEN) == 1
    inputs = processor(text=case.prompt, images=image, return_tensors="pt")
    input_ids = inputs["input_ids"]
    cfg = model.config
    n_img = int((input_ids == cfg.image_token_index).sum())
    assert n_img == cfg.image_seq_length, (n_img, cfg.image_seq_length)
    assert input_ids[0, 0].item() == processor.tokenizer.bos_token_id
    assert (input_ids[0] == processor.tokenizer.bos_token_id).sum() == 1

    # The raw tokenizer.json (what the Rust side loads) gives the same ids.
    expanded = case.prompt.replace(IMAGE_TOKEN, IMAGE_TOKEN * n_img)
    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert raw.encode(expanded).ids == input_ids[0].tolist(), case.name
    # ... and so does the class named in tokenizer_config.json (v5 rebuilds its pipeline on load).
    assert LlamaTokenizer.from_pretrained(model_dir)(expanded)["input_ids"] == input_ids[0].tolist()

    pixel_values = inputs["pixel_values"]
    with torch.no_grad():
        out = model(**inputs)
        logits = out.logits[0]
        feats = model.model.get_image_features(pixel_values=pixel_values).pooler_output
        image_features = torch.cat(list(feats), dim=0)
        vis = vision_internals(model, pixel_values)

    # Projector output == what the model scattered into the image positions.
    sel = vis["vision_hidden"][1:] if cfg.vision_feature_select_strategy == "default" else vis["vision_hidden"]
    with torch.no_grad():
        proj = model.model.multi_modal_projector(sel)
    torch.testing.assert_close(proj, image_features, rtol=0, atol=1e-5)
    assert image_features.shape == (n_img, cfg.text_config.hidden_size)

    check_sliding_window(model, inputs, logits)

    # Greedy generation with the saved generation config.
    gen_cfg = model.generation_config
    with torch.no_grad():
        gen = model.generate(
            **inputs, do_sample=False, max_new_tokens=MAX_NEW_TOKENS,
            output_logits=True, return_dict_in_generate=True,
        )
    seq = input_ids.shape[1]
    greedy = gen.sequences[0, seq:]
    step_logits = torch.stack([l[0] for l in gen.logits])  # (n, vocab), KV-cached decode
    top2 = step_logits.topk(2, dim=-1).values
    greedy_margin = (top2[:, 0] - top2[:, 1]).min().item()
    eos = gen_cfg.eos_token_id
    eos_list = eos if isinstance(eos, list) else [eos]
    stopped = greedy[-1].item() in eos_list
    assert len(greedy) == MAX_NEW_TOKENS or stopped

    # Cached decode agrees with the uncached full forward over prompt + generated tokens.
    torch.testing.assert_close(step_logits[0], logits[-1], rtol=0, atol=1e-4)
    full_ids = gen.sequences
    with torch.no_grad():
        full_logits = model(
            input_ids=full_ids, pixel_values=pixel_values, attention_mask=torch.ones_like(full_ids)
        ).logits[0]
    torch.testing.assert_close(full_logits[seq - 1 : seq - 1 + len(greedy)], step_logits, rtol=0, atol=1e-4)
    assert torch.equal(full_logits[seq - 1 : seq - 1 + len(greedy)].argmax(-1), greedy)

    path = FIXTURES / "cases" / f"{case.name}.safetensors"
    save_tensors(path, {
        "input_ids": input_ids[0].to(torch.int64),
        "pixel_values": pixel_values[0].float(),
        "logits": logits.float(),
        "greedy_ids": greedy.to(torch.int64),
        "greedy_logits": step_logits.float(),
        "image_features": image_features.float(),
        "vision_hidden": vis["vision_hidden"].float(),
        "vision_cls_attn": vis["vision_cls_attn"].float(),
    })
    return {
        "name": case.name,
        "model": rel(model_dir),
        "image": f"images/{case.image}",
        "prompt": case.prompt,
        "max_new_tokens": MAX_NEW_TOKENS,
        "tensors": rel(path),
        "eos_token_id": eos,
        "stopped_on_eos": stopped,
        "seq_len": seq,
        "n_image_tokens": n_img,
        "vision_feature_layer": cfg.vision_feature_layer,
        "vision_hidden_states_index": vis["hs_index"],
        "vision_attn_layer": vis["attn_layer"],
        "greedy_min_logit_margin": round(greedy_margin, 5),
        "greedy_text": processor.tokenizer.decode(greedy, skip_special_tokens=False),
    }


# --------------------------------------------------------------------------------------------
# Step 6: chat templates
# --------------------------------------------------------------------------------------------


def run_chat(model_name: str, image_name: str, messages: list, processor, model_dir: Path) -> dict:
    rendered = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert rendered.count(IMAGE_TOKEN) == 1

    image = load_image(image_name)
    with_image = copy.deepcopy(messages)
    for msg in with_image:
        for part in msg["content"]:
            if part["type"] == "image":
                part["image"] = image
    tokenized = processor.apply_chat_template(
        with_image, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
    )
    input_ids = tokenized["input_ids"][0].tolist()
    # Which add_special_tokens setting reproduces it?
    tok = processor.tokenizer
    reproduce = {}
    for flag in (True, False):
        ids = processor(text=rendered, images=image, add_special_tokens=flag, return_tensors="pt")["input_ids"]
        reproduce[flag] = ids[0].tolist()
    matches = [flag for flag, ids in reproduce.items() if ids == input_ids]
    assert len(matches) == 1, matches
    n_bos = input_ids.count(tok.bos_token_id)
    assert n_bos == 1, f"apply_chat_template produced {n_bos} BOS tokens"
    text_ids = tok(rendered, add_special_tokens=matches[0])["input_ids"]
    return {
        "model": rel(model_dir),
        "messages": messages,
        "image": f"images/{image_name}",
        "add_generation_prompt": True,
        "rendered": rendered,
        "add_special_tokens": matches[0],
        "input_ids": input_ids,
        "text_input_ids": text_ids,
    }


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def check_greedy_diversity(cases: list[dict]) -> None:
    seqs = []
    for c in cases:
        with safetensors.safe_open(str(FIXTURES / c["tensors"]), "pt") as f:
            ids = f.get_tensor("greedy_ids").tolist()
        assert len(set(ids)) > 1, f"{c['name']}: greedy output is one repeated token {ids}"
        seqs.append(tuple(ids))
    assert len(set(seqs)) == len(seqs), "two cases share the same greedy output"


def to_json(obj) -> str:
    """Indented JSON with lists of numbers kept on one line."""
    text = json.dumps(obj, indent=2, ensure_ascii=False)
    return re.sub(
        r"\[\s+(-?[\d.e+-]+(?:,\s+-?[\d.e+-]+)*)\s+\]",
        lambda m: "[" + ", ".join(v.strip() for v in m.group(1).split(",")) + "]",
        text,
    )


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    set_seed(SEED)
    if FIXTURES.exists():
        shutil.rmtree(FIXTURES)
    FIXTURES.mkdir()

    images = make_images()
    tok = build_tokenizer()

    model_dirs, model_facts = {}, {}
    for spec in MODEL_SPECS:
        model_dir = save_checkpoint(spec, tok)
        model_dirs[spec.name] = model_dir
        n_vision_layers = spec.vision_kwargs["num_hidden_layers"]
        feature_layer = spec.llava_kwargs["vision_feature_layer"]
        model_facts[spec.name] = {
            "dir": rel(model_dir),
            "text_model_type": spec.text_cls.model_type,
            "tokenizer_len": len(tok),
            "text_vocab_size": len(tok) + spec.vocab_pad,
            "image_token_id": tok.convert_tokens_to_ids(IMAGE_TOKEN),
            "n_patches": n_patches(spec),
            "n_image_tokens": n_image_tokens(spec),
            "vision_feature_layer": feature_layer,
            "vision_feature_select_strategy": spec.llava_kwargs["vision_feature_select_strategy"],
            "vision_attn_layer": feature_layer % (n_vision_layers + 1) - 1,
            "sliding_window": spec.text_kwargs.get("sliding_window"),
            **check_checkpoint_files(spec, model_dir),
        }

    pixels = make_pixels(model_dirs, list(images))

    cases, chats = [], []
    for spec in MODEL_SPECS:
        model, processor = load_checkpoint(model_dirs[spec.name])
        for case in (c for c in CASES if c.model == spec.name):
            cases.append(run_case(case, model, processor, model_dirs[spec.name]))
            print(f"case {case.name}: seq {cases[-1]['seq_len']}, greedy {cases[-1]['greedy_text']!r}")
        for model_name, image_name, messages in CHATS:
            if model_name == spec.name:
                chats.append(run_chat(model_name, image_name, messages, processor, model_dirs[spec.name]))
    check_greedy_diversity(cases)

    manifest = {
        "version": MANIFEST_VERSION,
        "generator": "scripts/make_fixtures.py",
        "versions": {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "tokenizers": tokenizers.__version__,
            "safetensors": safetensors.__version__,
            "numpy": np.__version__,
            "pillow": PIL.__version__,
            "scikit-image": skimage.__version__,
        },
        "seed": SEED,
        "notes": {
            "dtype": "all float tensors are float32; ids are int64",
            "attention": "eager, one CPU thread",
            "image_processor": "CLIPImageProcessorPil (PIL backend): convert_rgb (alpha composited on white), "
                               "PIL BICUBIC resize of uint8 (short side = shortest_edge, long = int(s*long/short)), "
                               "center crop top=(h-ch)//2 left=(w-cw)//2, float32(u8*float64(1/255)), "
                               "(x-mean)/std in float32",
            "vision_hidden": "vision tower hidden_states[vision_hidden_states_index] incl. CLS, before feature "
                             "select; hidden_states[0] = embeddings after pre_layrnorm, hidden_states[i] = output "
                             "of encoder layer i-1 (no post_layernorm)",
            "vision_cls_attn": "softmax attention probabilities of the CLS query in encoder layer "
                               "vision_attn_layer (0-based), shape (heads, n_patches + 1)",
            "greedy_logits": "logits of each generate() step (KV-cached decode), row k predicts greedy_ids[k]",
            "sliding_window": "mistral: query i sees keys j with i - sliding_window < j <= i (window counts "
                              "the query itself); checked: logits rows < sliding_window equal the no-window model",
            "weights_layout": "as saved by transformers 5.24: language_model.model.*, language_model.lm_head.weight "
                              "(absent when tied), multi_modal_projector.*, vision_tower.{embeddings,pre_layrnorm,"
                              "encoder,post_layernorm}.* (hub checkpoints spell the last vision_tower.vision_model.*; "
                              "5.24 in memory: model.language_model.*, model.vision_tower.*, lm_head.weight)",
            "chat_template_file": "chat_template.jinja (not in tokenizer_config.json, no chat_template.json)",
        },
        "models": model_facts,
        "images": {f"images/{k}": v for k, v in images.items()},
        "pixels": pixels,
        "cases": cases,
        "chat": chats,
    }
    (FIXTURES / "manifest.json").write_text(to_json(manifest) + "\n")

    total = dir_size(FIXTURES)
    print(f"fixtures: {total / 1024:.0f} KiB")
    assert total < SIZE_LIMIT_BYTES, f"fixtures too large: {total} bytes"


if __name__ == "__main__":
    main()
