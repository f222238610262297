"""Check the world tokenizer files with Hugging Face `tokenizers` and `transformers`.

Usage: python3 check_tokenizer.py TOKENIZER_DIR SAMPLE_DIR
  TOKENIZER_DIR holds tokenizer.json + tokenizer_config.json (glance_world::tokenizer::write_tokenizer_files);
  SAMPLE_DIR holds questions.jsonl (glance_world::write_sample).
Checks: no <unk> in any question / answer, decode round trip (lower-cased), the chat template renders
the LLaVA-1.5 format, and transformers' AutoTokenizer agrees with tokenizers on ids.
"""
import json
import sys

from tokenizers import Tokenizer
from transformers import AutoTokenizer

tok_dir, sample_dir = sys.argv[1], sys.argv[2]
tok = Tokenizer.from_file(f"{tok_dir}/tokenizer.json")
hf = AutoTokenizer.from_pretrained(tok_dir)
unk = tok.token_to_id("<unk>")
rows = [json.loads(l) for l in open(f"{sample_dir}/questions.jsonl")]
for r in rows:
    for text in (r["question"], r["answer"]):
        enc = tok.encode(text)
        assert unk not in enc.ids, (text, enc.tokens)
        assert enc.ids[0] == tok.token_to_id("<s>")
        assert tok.decode(enc.ids) == text.lower(), (text, tok.decode(enc.ids))
        assert hf(text).input_ids == enc.ids, text
        assert hf.decode(enc.ids, skip_special_tokens=True) == text.lower()

msgs = [
    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": rows[0]["question"]}]},
    {"role": "assistant", "content": rows[0]["answer"]},
    {"role": "user", "content": rows[1]["question"]},
]
prompt = hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
expected = f"USER: <image>\n{rows[0]['question']} ASSISTANT: {rows[0]['answer']}</s>USER: {rows[1]['question']} ASSISTANT:"
assert prompt == expected, (prompt, expected)
ids = hf(prompt).input_ids
assert unk not in ids and ids.count(tok.token_to_id("<image>")) == 1
assert hf.bos_token == "<s>" and hf.eos_token == "</s>" and hf.pad_token == "<pad>" and hf.mask_token == "[MASK]"
print(f"ok: {len(rows)} questions, vocab {tok.get_vocab_size()}, prompt ids {len(ids)}")
