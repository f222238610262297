#!/usr/bin/env python3
"""GGUF copies of the random LLaVA fixtures (fixtures/models/*), in llama.cpp's LLaVA layout:
a text-model GGUF plus a CLIP/projector "mmproj" GGUF.

    pip install gguf safetensors numpy
    python3 scripts/make_gguf_fixtures.py        # writes fixtures/gguf/<model>/*.gguf

llama.cpp's converters are not used: the conversion is written out here so that every choice is
visible. Per model directory it writes

    text-f16.gguf    2-D weights F16, 1-D F32 (what `convert_hf_to_gguf.py --outtype f16` writes)
    text-q8_0.gguf   linear weights Q8_0, text-q4_0.gguf: Q4_0 (see "placement" below)
    mmproj-f16.gguf  the vision tower and projector, linear weights F16 (the patch and position
                     embeddings F32, as glance holds them)
    mmproj-f32.gguf  the same in F32 (`convert_image_encoder_to_gguf.py --use-f32`)

**Placement in the quantized files.** glance's `--weights q8` / `q4` quantize the text decoder's
linear weights (attention, MLP, LM head) whose input size is a multiple of 32, hold the other
linear weights and the token embeddings in bf16 and the vision tower in bf16. The Q8_0 / Q4_0
files place their tensors the same way (Q8_0 / Q4_0 where glance quantizes, BF16 elsewhere, 1-D
tensors F32), so that loading the GGUF pair gives glance exactly the values the safetensors
directory gives it: the parity tests compare greedy tokens. (llama.cpp's own files also quantize
the token embeddings; glance reads those too, converted to its bf16 embeddings.)

**Tensor names** (HF name -> GGUF name; llama.cpp's `gguf-py/gguf/tensor_mapping.py` and, for the
mmproj, `convert_image_encoder_to_gguf.py`):

    language_model.model.embed_tokens.weight             token_embd.weight
    language_model.model.norm.weight                     output_norm.weight
    language_model.lm_head.weight                        output.weight (absent when tied)
    ...layers.N.input_layernorm.weight                   blk.N.attn_norm.weight
    ...layers.N.self_attn.{q,k,v,o}_proj.{weight,bias}   blk.N.attn_{q,k,v,output}.{weight,bias}
    ...layers.N.post_attention_layernorm.weight          blk.N.ffn_norm.weight
    ...layers.N.mlp.{gate,up,down}_proj.weight           blk.N.ffn_{gate,up,down}.weight
    vision_tower[.vision_model].embeddings.class_embedding            v.class_embd
    ...embeddings.patch_embedding.weight                 v.patch_embd.weight
    ...embeddings.position_embedding.weight              v.position_embd.weight
    ...pre_layrnorm.{weight,bias}                        v.pre_ln.{weight,bias}
    ...encoder.layers.N.self_attn.{q,k,v,out}_proj.*     v.blk.N.attn_{q,k,v,out}.*
    ...encoder.layers.N.layer_norm{1,2}.*                v.blk.N.ln{1,2}.*
    ...encoder.layers.N.mlp.fc1.*                        v.blk.N.ffn_down.*  (sic: the legacy
    ...encoder.layers.N.mlp.fc2.*                        v.blk.N.ffn_up.*     converter's names)
    ...post_layernorm.*                                  v.post_ln.*
    multi_modal_projector.linear_1.*                     mm.0.*
    multi_modal_projector.linear_2.*                     mm.2.*

**Q/K permutation.** For `llama` (Llama and Mistral) llama.cpp's converter reorders the rows of
attn_q / attn_k (weights and biases) from HF's "rotate half" RoPE layout to GGML's interleaved
pairs: per head, `w.reshape(n_head, 2, head_dim // 2, ...).swapaxes(1, 2)` (n_head_kv heads for
K). `permute` below does the same; glance undoes it at load. `qwen2` is stored unpermuted (GGML
uses its NEOX rope there), as llama.cpp does.

**Vision feature layer.** llama.cpp's LLaVA-1.5 mmproj drops the vision tower's last layer
(feature layer -2) and takes the output of the last stored layer. The llama-gqa fixture is
written that way (no feature-layer key). The others keep every layer and write
`clip.vision.feature_layer` (hidden-state indices, as llama.cpp's LLaVA-NeXT converter does) and,
for a model that keeps [CLS] (`vision_feature_select_strategy: full`), glance's own key
`glance.vision_feature_select_strategy` (llama.cpp has none).

**Tokenizer.** The fixtures' tokenizers are Llama-style BPE with byte fallback, written as
llama.cpp's `llama` (SentencePiece) vocabulary: tokens, scores and token types. A merged token's
score is minus the rank of its merge in tokenizer.json (SentencePiece BPE scores order merges the
same way), so the merges rebuilt from scores reproduce the original ones. RoPE scaling `llama3` is
written as llama.cpp does: a `rope_freqs.weight` tensor of per-frequency divisors.
"""

import json
import math
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFWriter, TokenType, quants
from safetensors.numpy import load_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
MODELS = ["llama-gqa", "mistral", "qwen2"]
TEXT_VARIANTS = {"f16": None, "q8_0": Q.Q8_0, "q4_0": Q.Q4_0}


def permute(w, n_head, n_head_kv):
    """llama.cpp's `LlamaModel.permute` (convert_hf_to_gguf.py)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def glance_blocks(w, qtype):
    """Q8_0 / Q4_0 blocks with glance's rounding (crates/glance-nn/src/quant/q8.rs, q4.rs): the
    scale rounded to f16 first, values scaled by its inverse and rounded half to even. (gguf-py's
    `quants.quantize`, like llama.cpp's reference, scales by the unrounded inverse and rounds half
    away from zero: ~0.6% of values land one step apart. Either is valid Q8_0 / Q4_0; this one
    makes the GGUF hold exactly what glance's own `--weights q8` / `q4` computes.)"""
    rows, cols = w.shape
    b = w.reshape(-1, 32).astype(np.float32)
    if qtype == Q.Q8_0:
        d = (np.abs(b).max(axis=1) / np.float32(127)).astype(np.float16)
        dv = d.astype(np.float32)
        inv = np.where(dv > 0, np.float32(1) / np.where(dv > 0, dv, 1), 0).astype(np.float32)
        q = np.round(np.clip(b * inv[:, None], -127, 127)).astype(np.int8)
        out = np.concatenate([d.reshape(-1, 1).view(np.uint8), q.view(np.uint8)], axis=1)
    else:
        idx = np.abs(b).argmax(axis=1)  # the first of equal magnitudes, as glance's fold
        extreme = b[np.arange(len(b)), idx]
        d = (extreme / np.float32(-8)).astype(np.float16)
        dv = d.astype(np.float32)
        inv = np.where(dv != 0, np.float32(1) / np.where(dv != 0, dv, 1), 0).astype(np.float32)
        q = (np.round(np.clip(b * inv[:, None], -8, 7)) + 8).astype(np.uint8)
        packed = q[:, :16] | (q[:, 16:] << 4)
        out = np.concatenate([d.reshape(-1, 1).view(np.uint8), packed], axis=1)
    return out.reshape(rows, -1)


def add(writer, name, w, qtype):
    """Writes `w` (f32, HF shape) as `qtype` (None: F32)."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    if qtype is None:
        writer.add_tensor(name, w)
    elif qtype == Q.F16:
        writer.add_tensor(name, w.astype(np.float16))
    elif qtype in (Q.Q8_0, Q.Q4_0):
        data = glance_blocks(w, qtype)
        writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
    else:
        data = quants.quantize(w, qtype)
        writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)


def text_prefix(st):
    return "model.language_model" if any(k.startswith("model.language_model.") for k in st) else "language_model.model"


def vision_prefix(st):
    for p in ["vision_tower.vision_model", "vision_tower", "model.vision_tower.vision_model", "model.vision_tower"]:
        if f"{p}.embeddings.class_embedding" in st:
            return p
    raise SystemExit("no vision tower")


def tokenizer_fields(src):
    tok = json.load(open(os.path.join(src, "tokenizer.json")))
    tcfg = json.load(open(os.path.join(src, "tokenizer_config.json")))
    model = tok["model"]
    assert model["type"] == "BPE" and model.get("byte_fallback"), "Llama-style BPE expected"
    vocab = dict(model["vocab"])
    added = {t["content"]: t for t in tok["added_tokens"]}
    for t in added.values():
        vocab[t["content"]] = t["id"]
    n = max(vocab.values()) + 1
    tokens = [None] * n
    for t, i in vocab.items():
        tokens[i] = t
    assert all(t is not None for t in tokens), "vocabulary ids with gaps"
    merges = [m.split(" ") if isinstance(m, str) else m for m in model["merges"]]
    rank = {}
    for r, (a, b) in enumerate(merges):
        rank.setdefault(a + b, r)
    scores, types = [], []
    for t in tokens:
        if t in added:
            special = added[t]["special"]
            kind = TokenType.UNKNOWN if t == tcfg.get("unk_token") else (TokenType.CONTROL if special else TokenType.USER_DEFINED)
        elif len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
            kind = TokenType.BYTE
        else:
            kind = TokenType.NORMAL
        types.append(kind)
        scores.append(-float(rank[t]) if t in rank else 0.0)
    return tokens, scores, types, tcfg


def write_text(src, dst, qtype):
    cfg = json.load(open(os.path.join(src, "config.json")))
    tc = cfg["text_config"]
    st = load_file(os.path.join(src, "model.safetensors"))
    mt = tc.get("model_type", "llama")
    arch = "qwen2" if mt == "qwen2" else "llama"  # llama.cpp converts Mistral as `llama`
    heads, kv = tc["num_attention_heads"], tc.get("num_key_value_heads", tc["num_attention_heads"])
    hidden = tc["hidden_size"]
    head_dim = tc.get("head_dim") or hidden // heads
    w = GGUFWriter(dst, arch)
    w.add_name(os.path.basename(src))
    w.add_context_length(tc["max_position_embeddings"])
    w.add_embedding_length(hidden)
    w.add_block_count(tc["num_hidden_layers"])
    w.add_feed_forward_length(tc["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(tc["rms_norm_eps"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    rope = tc.get("rope_parameters") or {}
    w.add_rope_freq_base(rope.get("rope_theta", tc.get("rope_theta", 10000.0)))
    if mt == "mistral" and tc.get("sliding_window"):
        w.add_sliding_window(tc["sliding_window"])
    w.add_vocab_size(tc["vocab_size"])
    w.add_file_type({None: 1, Q.Q8_0: 7, Q.Q4_0: 2}[qtype])

    tokens, scores, types, tcfg = tokenizer_fields(src)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    ids = {t: i for i, t in enumerate(tokens)}
    w.add_bos_token_id(ids[tcfg["bos_token"]])
    w.add_eos_token_id(ids[tcfg["eos_token"]])
    w.add_unk_token_id(ids[tcfg["unk_token"]])
    w.add_pad_token_id(ids[tcfg["pad_token"]])
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(True)
    w.add_chat_template(open(os.path.join(src, "chat_template.jinja")).read())

    if rope.get("rope_type") == "llama3":
        # llama.cpp's LlamaModel.generate_extra_tensors: per-frequency divisors.
        base, factor = rope["rope_theta"], rope["factor"]
        lo, hi, old = rope["low_freq_factor"], rope["high_freq_factor"], rope["original_max_position_embeddings"]
        freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
        factors = []
        for f in freqs:
            wavelen = 2 * math.pi / f
            if wavelen < old / hi:
                factors.append(1)
            elif wavelen > old / lo:
                factors.append(factor)
            else:
                smooth = (old / wavelen - lo) / (hi - lo)
                factors.append(1 / ((1 - smooth) / factor + smooth))
        add(w, "rope_freqs.weight", np.array(factors, dtype=np.float32), None)

    tp = text_prefix(st)
    head = "lm_head.weight" if "lm_head.weight" in st else tp.replace(".model", "") + ".lm_head.weight"

    def fmt(t, linear):
        if t.ndim == 1:
            return None
        if qtype is None:
            return Q.F16
        if linear and t.shape[1] % 32 == 0:
            return qtype
        return Q.BF16

    add(w, "token_embd.weight", st[f"{tp}.embed_tokens.weight"], fmt(st[f"{tp}.embed_tokens.weight"], False))
    add(w, "output_norm.weight", st[f"{tp}.norm.weight"], None)
    if head in st and not tc.get("tie_word_embeddings", False):
        add(w, "output.weight", st[head], fmt(st[head], True))
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down"}
    for i in range(tc["num_hidden_layers"]):
        lp = f"{tp}.layers.{i}"
        add(w, f"blk.{i}.attn_norm.weight", st[f"{lp}.input_layernorm.weight"], None)
        add(w, f"blk.{i}.ffn_norm.weight", st[f"{lp}.post_attention_layernorm.weight"], None)
        for hf, gg in names.items():
            for leaf in ["weight", "bias"]:
                t = st.get(f"{lp}.{hf}.{leaf}")
                if t is None:
                    continue
                if arch == "llama" and gg == "attn_q":
                    t = permute(t, heads, heads)
                if arch == "llama" and gg == "attn_k":
                    t = permute(t, heads, kv)
                add(w, f"blk.{i}.{gg}.{leaf}", t, fmt(t, True))
    finish(w)


def write_mmproj(src, dst, qtype):
    cfg = json.load(open(os.path.join(src, "config.json")))
    vc = cfg["vision_config"]
    pre = json.load(open(os.path.join(src, "preprocessor_config.json")))
    st = load_file(os.path.join(src, "model.safetensors"))
    vp = vision_prefix(st)
    layers = vc["num_hidden_layers"]
    feature = cfg.get("vision_feature_layer", -2)
    legacy = feature == -2  # llama.cpp's LLaVA-1.5 layout: the last layer dropped
    stored = layers - 1 if legacy else layers
    w = GGUFWriter(dst, "clip")
    w.add_name(os.path.basename(src) + "-mmproj")
    w.add_bool("clip.has_text_encoder", False)
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.has_llava_projector", True)
    w.add_string("clip.projector_type", "mlp")
    w.add_uint32("clip.vision.image_size", vc["image_size"])
    w.add_uint32("clip.vision.patch_size", vc["patch_size"])
    w.add_uint32("clip.vision.embedding_length", vc["hidden_size"])
    w.add_uint32("clip.vision.feed_forward_length", vc["intermediate_size"])
    w.add_uint32("clip.vision.projection_dim", cfg["text_config"]["hidden_size"])
    w.add_uint32("clip.vision.attention.head_count", vc["num_attention_heads"])
    w.add_float32("clip.vision.attention.layer_norm_epsilon", vc.get("layer_norm_eps", 1e-5))
    w.add_uint32("clip.vision.block_count", stored)
    w.add_array("clip.vision.image_mean", pre["image_mean"])
    w.add_array("clip.vision.image_std", pre["image_std"])
    w.add_bool("clip.use_gelu", vc.get("hidden_act") == "gelu")
    if not legacy:
        f = feature if isinstance(feature, list) else [feature]
        w.add_array("clip.vision.feature_layer", [x if x >= 0 else x + layers + 1 for x in f])
    if cfg.get("vision_feature_select_strategy", "default") != "default":
        w.add_string("glance.vision_feature_select_strategy", cfg["vision_feature_select_strategy"])
    w.add_file_type(0 if qtype is None else 1)

    def put(name, t, linear=True):
        add(w, name, t, Q.F16 if (qtype == Q.F16 and t.ndim == 2 and linear) else None)

    e = f"{vp}.embeddings"
    put("v.class_embd", st[f"{e}.class_embedding"])
    # glance keeps these two in f32 beside 16-bit linear weights; llama.cpp's converter writes
    # them in F16 (glance reads either).
    put("v.patch_embd.weight", st[f"{e}.patch_embedding.weight"], linear=False)
    put("v.position_embd.weight", st[f"{e}.position_embedding.weight"], linear=False)
    for leaf in ["weight", "bias"]:
        if f"{vp}.pre_layrnorm.{leaf}" in st:
            put(f"v.pre_ln.{leaf}", st[f"{vp}.pre_layrnorm.{leaf}"])
        if not legacy and f"{vp}.post_layernorm.{leaf}" in st:
            put(f"v.post_ln.{leaf}", st[f"{vp}.post_layernorm.{leaf}"])
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.out_proj": "attn_out", "layer_norm1": "ln1", "layer_norm2": "ln2",
             "mlp.fc1": "ffn_down", "mlp.fc2": "ffn_up"}
    for i in range(stored):
        for hf, gg in names.items():
            for leaf in ["weight", "bias"]:
                put(f"v.blk.{i}.{gg}.{leaf}", st[f"{vp}.encoder.layers.{i}.{hf}.{leaf}"])
    mp = "model.multi_modal_projector" if "model.multi_modal_projector.linear_1.weight" in st else "multi_modal_projector"
    for hf, gg in [("linear_1", "mm.0"), ("linear_2", "mm.2")]:
        for leaf in ["weight", "bias"]:
            if f"{mp}.{hf}.{leaf}" in st:
                put(f"{gg}.{leaf}", st[f"{mp}.{hf}.{leaf}"])
    finish(w)


def finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    out_root = os.path.join(ROOT, "fixtures", "gguf")
    for m in sys.argv[1:] or MODELS:
        src = os.path.join(ROOT, "fixtures", "models", m)
        out = os.path.join(out_root, m)
        os.makedirs(out, exist_ok=True)
        for name, q in TEXT_VARIANTS.items():
            write_text(src, os.path.join(out, f"text-{name}.gguf"), q)
        write_mmproj(src, os.path.join(out, "mmproj-f16.gguf"), Q.F16)
        write_mmproj(src, os.path.join(out, "mmproj-f32.gguf"), None)
        print(out, sorted(os.listdir(out)))


if __name__ == "__main__":
    main()
