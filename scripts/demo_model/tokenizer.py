"""Stage 'tokenizer': byte-level BPE (8192 tokens) with ChatML special tokens, and the
pre-tokenized training stream (uint16 .npy) + eval prompts.

Special tokens: 0 <|endoftext|> (document separator / pad), 1 <|im_start|>, 2 <|im_end|> (eos).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOS_ID = 2

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['content'] is string %}{%- set content = message['content'] %}"
    "{%- else %}{%- set content = message['content'] | map(attribute='text') | join('') %}{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def train_tokenizer(corpus_dir, out_dir, vocab_size=8192):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    corpus_dir, out_dir = Path(corpus_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    texts = [json.loads(l)["text"] for l in open(corpus_dir / "train.jsonl")]
    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )

    def it():
        for t in texts:
            # the special tokens are not learnt as merges
            yield t.replace("<|im_start|>", "\n").replace("<|im_end|>", "\n")
    tok.train_from_iterator(it(), trainer=trainer, length=len(texts))
    tok.save(str(out_dir / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 4096,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": True}
            for i, s in enumerate(SPECIALS)
        },
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))
    (out_dir / "special_tokens_map.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, indent=1))
    print("tokenizer:", tok.get_vocab_size(), "tokens ->", out_dir)
    return tok


def encode_corpus(corpus_dir, tok_dir, out_dir):
    """Pre-tokenize: one uint16 stream, documents separated by <|endoftext|> (id 0)."""
    from tokenizers import Tokenizer

    corpus_dir, out_dir = Path(corpus_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer.from_file(str(Path(tok_dir) / "tokenizer.json"))
    texts = [json.loads(l)["text"] for l in open(corpus_dir / "train.jsonl")]
    encs = tok.encode_batch(texts, add_special_tokens=False)
    n = sum(len(e.ids) + 1 for e in encs)
    arr = np.empty(n, dtype=np.uint16)
    i = 0
    for e in encs:
        arr[i] = 0
        arr[i + 1: i + 1 + len(e.ids)] = e.ids
        i += len(e.ids) + 1
    np.save(out_dir / "train_tokens.npy", arr)
    # eval prompts, rendered with the chat template (generation prompt added)
    for name in ("eval_prompts", "eval_prompts_seen"):
        prompts = []
        for l in open(corpus_dir / f"{name}.jsonl"):
            d = json.loads(l)
            text = f"<|im_start|>user\n{d['prompt']}<|im_end|>\n<|im_start|>assistant\n"
            prompts.append({"kind": d["kind"], "prompt": d["prompt"], "ids": tok.encode(text).ids})
        (out_dir / f"{name}.json").write_text(json.dumps(prompts))
    chars = sum(len(t) for t in texts)
    info = {"tokens": int(n), "chars": chars, "chars_per_token": round(chars / n, 3),
            "eval_prompts": len(prompts)}
    (out_dir / "data_info.json").write_text(json.dumps(info, indent=1))
    print(json.dumps(info))
    return info


class Encoder:
    """text -> token ids with a built tokenizer (the held-out-loss measurements take one)."""

    def __init__(self, tok_dir):
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(str(Path(tok_dir) / "tokenizer.json"))

    def encode(self, text: str):
        return self.tok.encode(text).ids
