#!/usr/bin/env python3
"""PyTorch reference for glance's candle training step (throughput and loss parity).

Loads what `cargo run --release -p glance-train --example bench_batch -- <preset> <stage> <images>
<turns> <steps> <dir>` wrote — `<dir>/model` (an HF LLaVA checkpoint with the initial weights),
`<dir>/batch.safetensors` (one batch) and `<dir>/rust.json` (candle's per-step losses and times) —
builds the *same* model with transformers' `LlavaForConditionalGeneration`, and trains the same
number of steps on the same batch with the same optimiser (AdamW 0.9/0.95, eps 1e-8, wd 0.05 on
matrices other than embeddings/norms, global-norm clip 1.0, constant lr 1e-3).

Differences are deliberate and favour PyTorch: it runs the batch as one padded tensor
(`(B, T)` with a `(B, 1, T, T)` additive mask) and the vision tower on `(B, 3, 224, 224)`;
glance's models run batch 1 and loop over images.

Prints the two loss trajectories (they must agree: same weights, same data, same maths) and
the step-time ratio. Usage:

    python3 scripts/train_torch_reference.py <dir> [--threads 2] [--attn sdpa|eager]
"""

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import LlavaForConditionalGeneration

# Column layout of glance's fused per-patch head (crates/glance-train/src/heads.rs).
KIND, COLOUR, SHAPE, SIZE, DIGIT = 4, 7, 6, 3, 11


def is_norm(name: str) -> bool:
    parts = name.split(".")
    leaf = parts[-2] if len(parts) >= 2 else ""
    return "norm" in leaf or "layrnorm" in leaf


def decays(name: str, p: torch.Tensor) -> bool:
    return p.ndim >= 2 and "embed_tokens" not in name and "position_embedding" not in name and not is_norm(name)


def trains(stage: str, name: str) -> bool:
    vision = ".vision_tower." in f".{name}"
    post_ln = ".post_layernorm." in name
    lm = "multi_modal_projector." in name or "language_model." in name or name.startswith("lm_head.")
    heads = name.startswith("train_heads.")
    if stage == "vision":
        return vision or heads
    if stage == "llava":
        return lm
    return (vision and not post_ln) or lm


class Heads(torch.nn.Module):
    """glance's training-only vision heads, weights from the batch file."""

    def __init__(self, t: dict):
        super().__init__()
        h = t["train_heads.patch_norm.weight"].shape[0]
        self.patch_norm = torch.nn.LayerNorm(h, eps=1e-5)
        self.patch = torch.nn.Linear(h, t["train_heads.patch.weight"].shape[0])
        self.cls = torch.nn.Linear(h, t["train_heads.cls.weight"].shape[0])
        with torch.no_grad():
            for mod, name in [(self.patch_norm, "patch_norm"), (self.patch, "patch"), (self.cls, "cls")]:
                mod.weight.copy_(t[f"train_heads.{name}.weight"])
                mod.bias.copy_(t[f"train_heads.{name}.bias"])


def vision_loss(model, heads, batch):
    vt = model.model.vision_tower
    hidden = vt(batch["pixels"], output_hidden_states=True).hidden_states[-1]  # (B, 1+P, h)
    patches = hidden[:, 1:, :].reshape(-1, hidden.shape[-1])
    logits = heads.patch(heads.patch_norm(patches))  # (B·P, 31)
    y = batch["patch_targets"].reshape(-1, 5)
    kind = y[:, 0]
    loss = F.cross_entropy(logits[:, :KIND], kind)
    obj = kind == 1
    dig = kind == 3
    o = KIND
    for col, width, rows in [(1, COLOUR, obj), (2, SHAPE, obj), (3, SIZE, obj), (4, DIGIT, dig)]:
        if rows.any():
            loss = loss + F.cross_entropy(logits[rows, o:o + width], y[rows, col])
        o += width
    cls = getattr(vt, "vision_model", vt).post_layernorm(hidden[:, 0, :])
    loss = loss + F.binary_cross_entropy_with_logits(heads.cls(cls), batch["set_targets"])
    return loss


def qa_loss(model, stage, batch, image_token_id):
    inner = model.model
    if stage == "llava":
        with torch.no_grad():
            feats = inner.vision_tower(batch["pixels"], output_hidden_states=True).hidden_states[-1][:, 1:, :]
    else:
        feats = inner.vision_tower(batch["pixels"], output_hidden_states=True).hidden_states[-1][:, 1:, :]
    img = inner.multi_modal_projector(feats)  # (B, N, d)
    ids = batch["input_ids"]
    emb = inner.language_model.embed_tokens(ids)
    where = (ids == image_token_id).unsqueeze(-1).expand_as(emb)
    emb = emb.masked_scatter(where, img.to(emb.dtype))
    mask = batch["mask"].clone()
    mask[torch.isinf(mask)] = torch.finfo(torch.float32).min
    hidden = inner.language_model(inputs_embeds=emb, attention_mask=mask, position_ids=batch["position_ids"]).last_hidden_state
    rows, tgt = batch["target_rows"], batch["targets"]
    valid = rows >= 0
    b_idx = torch.arange(rows.shape[0]).unsqueeze(1).expand_as(rows)[valid]
    logits = model.lm_head(hidden[b_idx, rows[valid]])
    return F.cross_entropy(logits, tgt[valid])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", type=Path)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--attn", default="sdpa", choices=["sdpa", "eager"])
    ap.add_argument("--steps", type=int, default=None, help="default: as many as the candle run")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    rust = json.loads((a.dir / "rust.json").read_text())
    stage = {"end_to_end": "e2e"}.get(rust["stage"], rust["stage"])
    steps = a.steps or len(rust["losses"])
    model = LlavaForConditionalGeneration.from_pretrained(a.dir / "model", dtype=torch.float32, attn_implementation=a.attn)
    model.train()
    batch = load_file(a.dir / "batch.safetensors")
    named = list(model.named_parameters())
    heads = None
    if stage == "vision":
        heads = Heads(batch)
        named += [(f"train_heads.{n}", p) for n, p in heads.named_parameters()]
    train = [(n, p) for n, p in named if trains(stage, n)]
    for n, p in named:
        p.requires_grad_(trains(stage, n))
    groups = [
        {"params": [p for n, p in train if decays(n, p)], "weight_decay": 0.05},
        {"params": [p for n, p in train if not decays(n, p)], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.95), eps=1e-8)
    n_params = sum(p.numel() for _, p in train)
    losses, times = [], []
    for s in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if stage == "vision":
            loss = vision_loss(model, heads, batch)
        else:
            loss = qa_loss(model, stage, batch, model.config.image_token_id)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for _, p in train], 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        print(f"step {s}: torch loss {losses[-1]:.6f}  candle {rust['losses'][s]:.6f}  ({times[-1]:.3f} s)")
    tail = sorted(times[2:] or times)  # median after two warm-up steps: robust to load spikes
    mean = tail[len(tail) // 2]
    diff = max(abs(x - y) for x, y in zip(losses, rust["losses"]))
    images = rust["images"]
    print(f"{rust['preset']} {stage}: {n_params} trainable params, {images} images, {rust.get('rows')} decoder rows")
    print(f"torch  ({a.threads} threads, {a.attn}): {mean:.3f} s/step (median), {images / mean:.2f} images/s")
    print(f"candle: {rust['mean_step_seconds']:.3f} s/step (median), {images / rust['mean_step_seconds']:.2f} images/s")
    print(f"candle / torch step time: {rust['mean_step_seconds'] / mean:.2f}x;  max |loss diff| over {steps} steps: {diff:.2e}")


if __name__ == "__main__":
    main()
