#!/usr/bin/env python3
"""Write a random-weight checkpoint at a seed model's real shape, for timing glance end to end.

    python3 scripts/make_real_shape_checkpoint.py qwen2.5-vl-3b /tmp/qwen2.5-vl-3b

The directory is what a user brings: ``config.json``, sharded bf16 ``*.safetensors`` with their
index, tokenizer, chat template and image-processor settings, in the layout of the committed
fixture of the same family (``fixtures/qwen2_vl``, ``fixtures/llava_next``, ``fixtures/internvl``).
The shapes are the published checkpoints' (the same numbers as ``glance bench decode --random``'s
presets in ``crates/glance-models/src/presets.rs``); the image settings are the published
processors' (tile size, ``image_grid_pinpoints``, ``min_pixels`` / ``max_pixels``, ``max_patches``).
The tokenizer is the fixture's small one: prompts tokenize as they do on the fixture, and the real
vocabulary's extra embedding rows exist but are never looked up.

Weights are N(0, 0.02) in bf16 (norm weights 1, biases 0), written straight from the shapes of a
model built on the meta device, so a 7B checkpoint needs no more memory than one shard. The
answers are noise; what the directory is for is ``glance run --json``'s load time, vision time,
time to first token and decode speed, with and without ``--prune`` (docs/models.md, "Speed at the
real shapes").

Needs torch, transformers (5.x) and safetensors; nothing downloads.
"""

import argparse
import json
import shutil
from pathlib import Path

import torch
import transformers
from safetensors import safe_open
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parent.parent
PINPOINTS = [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]]
CLIP_L_336 = {
    "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
    "num_attention_heads": 16, "image_size": 336, "patch_size": 14, "projection_dim": 768,
}
MISTRAL_7B = {
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 32064,
    "max_position_embeddings": 32768, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
}
QWEN25_VISION = {
    "depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
    "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31],
}
QWEN25_3B = {
    "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
    "num_attention_heads": 16, "num_key_value_heads": 2, "vocab_size": 151936,
    "max_position_embeddings": 128000, "tie_word_embeddings": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]},
}
QWEN25_7B = {
    "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
    "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
    "max_position_embeddings": 128000, "tie_word_embeddings": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]},
}
QWEN25_3B_TEXT = {  # InternVL-2.5-4B's decoder: Qwen2.5-3B, 1-D RoPE
    **{k: v for k, v in QWEN25_3B.items() if k != "rope_parameters"},
    "vocab_size": 151674, "max_position_embeddings": 32768,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
}
INTERNVIT_300M = {
    "hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
    "num_attention_heads": 16, "image_size": [448, 448], "patch_size": [14, 14],
}


def layers(text: dict) -> dict:
    """`layer_types` sized to the layer count (transformers 5 checks it)."""
    return {"layer_types": ["full_attention"] * text["num_hidden_layers"]}


def qwen(text: dict) -> dict:
    def config(c):
        c["text_config"].update(text, **layers(text))
        c["vision_config"].update(QWEN25_VISION, out_hidden_size=text["hidden_size"])
        c["tie_word_embeddings"] = text["tie_word_embeddings"]

    def processor(p):
        # The published Qwen2.5-VL processor: min_pixels 56², max_pixels 28² · 16384.
        p["image_processor"]["size"] = {"shortest_edge": 3136, "longest_edge": 12845056}

    return {"fixture": "fixtures/qwen2_vl/models/qwen2_5-vl", "config": config,
            "files": {"processor_config.json": processor}}


def llava_next(c):
    c["text_config"].update(MISTRAL_7B)
    c["vision_config"].update(CLIP_L_336)
    c["image_grid_pinpoints"] = PINPOINTS
    c["image_seq_length"] = 576


def llava_next_processor(p):
    p.update(crop_size={"height": 336, "width": 336}, size={"shortest_edge": 336},
             image_grid_pinpoints=PINPOINTS)


def internvl(c):
    c["text_config"].update(QWEN25_3B_TEXT, **layers(QWEN25_3B_TEXT))
    c["vision_config"].update(INTERNVIT_300M)
    c["image_seq_length"] = 256
    c["tie_word_embeddings"] = True


def internvl_processor(p):
    p.update(size={"height": 448, "width": 448}, min_patches=1, max_patches=12, crop_to_patches=True)


def internvl_counts(p):
    p["image_seq_length"] = 256


SHAPES = {
    "qwen2.5-vl-3b": qwen(QWEN25_3B),
    "qwen2.5-vl-7b": qwen(QWEN25_7B),
    "llava-next-7b": {"fixture": "fixtures/llava_next/models/llava-next-mistral", "config": llava_next,
                      "files": {"preprocessor_config.json": llava_next_processor,
                                "processor_config.json": lambda p: p.update(patch_size=14)}},
    "internvl2.5-4b": {"fixture": "fixtures/internvl/models/internvl-qwen2", "config": internvl,
                       "files": {"preprocessor_config.json": internvl_processor,
                                 "processor_config.json": internvl_counts}},
}


def edit_json(path: Path, edit) -> None:
    value = json.loads(path.read_text())
    edit(value)
    path.write_text(json.dumps(value, indent=2) + "\n")


def renames(fixture: Path) -> list:
    """(module prefix, file prefix) pairs: how the fixture's file names differ from transformers'
    module names (the fixture is in the published layout)."""
    cfg = transformers.AutoConfig.from_pretrained(fixture)
    with torch.device("meta"):
        model = transformers.AutoModelForImageTextToText.from_config(cfg)
    names = [n for n, _ in model.named_parameters()]
    keys = list(safe_open(str(fixture / "model.safetensors"), "pt").keys())
    pairs = set()
    for n in names:
        # The file key with the longest common suffix of whole dotted parts.
        best = max(keys, key=lambda k: common_suffix(n, k))
        s = common_suffix(n, best)
        pairs.add((n[: len(n) - s], best[: len(best) - s]))
    return sorted(pairs, key=lambda p: -len(p[0]))


def common_suffix(a: str, b: str) -> int:
    pa, pb = a.split("."), b.split(".")
    n = 0
    while n < min(len(pa), len(pb)) and pa[-1 - n] == pb[-1 - n]:
        n += 1
    return len(".".join(pa[len(pa) - n:])) if n else 0


def file_name(name: str, pairs: list) -> str:
    for module, file in pairs:
        if name.startswith(module):
            return file + name[len(module):]
    return name


def random_tensor(name: str, shape, gen: torch.Generator) -> torch.Tensor:
    last = name.rsplit(".", 1)[-1]
    if last == "bias":
        return torch.zeros(shape, dtype=torch.bfloat16)
    if "norm" in name or "ln_" in name or "layernorm" in name or last.startswith("lambda"):
        return torch.ones(shape, dtype=torch.bfloat16)
    return (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("out", type=Path)
    ap.add_argument("--shard-gb", type=float, default=2.0)
    args = ap.parse_args()
    spec = SHAPES[args.shape]
    fixture = ROOT / spec["fixture"]
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    for f in fixture.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, out / f.name)
    edit_json(out / "config.json", spec["config"])
    for name, edit in spec["files"].items():
        edit_json(out / name, edit)

    pairs = renames(fixture)
    cfg = transformers.AutoConfig.from_pretrained(out)
    with torch.device("meta"):
        model = transformers.AutoModelForImageTextToText.from_config(cfg)
    params = [(file_name(n, pairs), tuple(p.shape)) for n, p in model.named_parameters()]
    total = sum(torch.Size(s).numel() for _, s in params)
    print(f"{args.shape}: {len(params)} tensors, {total / 1e9:.2f}B parameters → {out}")

    gen = torch.Generator().manual_seed(0)
    limit = int(args.shard_gb * 2**30)
    shards, shard, size = [], {}, 0
    for name, shape in params:
        shard[name] = random_tensor(name, shape, gen)
        size += shard[name].numel() * 2
        if size >= limit:
            shards.append(shard)
            shard, size = {}, 0
            write(out, shards, len(shards) - 1)
    if shard:
        shards.append(shard)
        write(out, shards, len(shards) - 1)
    count = len(shards)
    weight_map = {}
    for i, s in enumerate(shards):
        src = out / f"shard-{i}.safetensors"
        dst = out / f"model-{i + 1:05d}-of-{count:05d}.safetensors"
        src.rename(dst)
        weight_map.update({k: dst.name for k in s})
    index = {"metadata": {"total_size": total * 2}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    print(f"wrote {count} shards")


def write(out: Path, shards: list, i: int) -> None:
    save_file(shards[i], str(out / f"shard-{i}.safetensors"), metadata={"format": "pt"})
    shards[i] = {k: None for k in shards[i]}  # free the tensors, keep the names


if __name__ == "__main__":
    main()
