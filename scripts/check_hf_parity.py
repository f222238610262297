#!/usr/bin/env python3
"""Check that a glance-exported (or any) LLaVA checkpoint gives the same greedy answers in Hugging
Face transformers as in glance, on world test images.

Run by hand (needs torch + transformers; never run in CI):

    cargo build --release
    python3 scripts/check_hf_parity.py --model models/glance-tiny [--n 4] [--glance target/release/glance]

It renders N test images with `glance world sample`, asks each image's independent questions
(`questions.jsonl`, follow-up turns skipped) through `glance run --json` and through
transformers' LlavaProcessor.apply_chat_template + generate(do_sample=False), and compares the
generated token ids. Exit code 0 when every answer is identical.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from PIL import Image
from transformers import AutoProcessor, LlavaForConditionalGeneration


def glance_answer(glance: str, model: str, image: Path, question: str, max_new: int) -> list[int]:
    out = subprocess.run(
        [glance, "run", "--model", model, "--image", str(image), "--prompt", question,
         "--max-new-tokens", str(max_new), "--json", "--threads", "1"],
        check=True, capture_output=True, text=True,
    )
    return json.loads(out.stdout)["token_ids"]


def hf_answer(model, processor, image: Path, question: str, max_new: int) -> list[int]:
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    inputs = processor(images=Image.open(image), text=prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=max_new)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--n", type=int, default=4, help="test images")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--glance", default="target/release/glance")
    args = ap.parse_args()
    torch.set_num_threads(1)

    model = LlavaForConditionalGeneration.from_pretrained(args.model, attn_implementation="eager").eval()
    processor = AutoProcessor.from_pretrained(args.model)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([args.glance, "world", "sample", "--split", "test", "--n", str(args.n), "--out", tmp],
                       check=True, capture_output=True)
        rows = [json.loads(l) for l in Path(tmp, "questions.jsonl").read_text().splitlines()]
        rows = [r for r in rows if r["dialogue"] is None]
        same = 0
        for r in rows:
            image = Path(tmp, r["image"])
            g = glance_answer(args.glance, args.model, image, r["question"], args.max_new_tokens)
            h = hf_answer(model, processor, image, r["question"], args.max_new_tokens)
            ok = g == h
            same += ok
            answer = processor.tokenizer.decode(h, skip_special_tokens=True)
            print(f"{'same' if ok else 'DIFF'}  {r['image']}  {r['question']!r} -> {answer!r}")
            if not ok:
                print(f"      glance {g}\n      hf     {h}")
    print(f"{same}/{len(rows)} answers identical")
    return 0 if same == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
