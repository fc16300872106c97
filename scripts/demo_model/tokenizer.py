"""Stage 'tokenizer': byte-level BPE (8192 tokens) with ChatML special tokens and the Qwen3.5
tags as added tokens, the demo's chat template, and the pre-tokenized training data.

Ids: 0 <|endoftext|> (document separator / pad), 1 <|im_start|>, 2 <|im_end|> (eos); the six tags
<think> </think> <tool_call> </tool_call> <tool_response> </tool_response> are the last six ids
(added, not special, as in Qwen's tokenizer: a reply's text keeps them, and the app's parsers read
them there).

Data (uint16 / uint8 .npy, git-ignored): tokens.npy (documents, each followed by <|endoftext|>),
mask.npy (1 on the tokens the model writes: assistant replies and their <|im_end|>, and prose),
docs.npy (start offsets); eval sets as rendered prompt ids.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))
from scripts.checkpoints.tokenizer_files import QWEN35_TEMPLATE, QWEN35_TOKENS  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOS_ID = 2

# Qwen3.5's template (make_tiny_checkpoint's "qwen3_5"): tools in the system turn, <tool_call>
# blocks, <tool_response> turns, earlier turns' thinking dropped; the generation prompt opens a
# <think> block, or writes an empty one with enable_thinking=false. mlx-lm passes
# enable_thinking=true by default to a tokenizer that has these tags, so the app thinks unless
# told not to, as with Qwythos.
CHAT_TEMPLATE = QWEN35_TEMPLATE

# Qwen3.5's pre-tokenizer. transformers (5.x) loads a qwen3_5 checkpoint's tokenizer with this
# split whatever its tokenizer.json says, so the app tokenizes "</think>\n\nA" as
# ['</think>', '\n\n', 'A'] where the ByteLevel regex of the file the demo was built with gives
# ['</think>', '\n', '\n', 'A']. v2 and v3 were trained on the file's ids: every prompt ends in
# '\n\n', which they had seen only before <tool_call>, and v3 answers with a stray '\n' first
# (P = 0.996 after "What is a rest?"), which a JSON grammar then forbids. Data must be encoded as
# the app encodes (qwen_pre_tokenizer; tests/test_demo_v3_data.py holds it to transformers).
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
              r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def qwen_pre_tokenizer(tok) -> None:
    """Give a `tokenizers.Tokenizer` the pre-tokenizer the app loads it with (QWEN_SPLIT)."""
    from tokenizers import Regex, pre_tokenizers

    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])


def as_the_app_tokenizes(tok_dir) -> None:
    """Rewrite tok_dir/tokenizer.json with the app's pre-tokenizer (same vocabulary and merges),
    so training data, the exported checkpoint's file and the app agree on every id."""
    from tokenizers import Tokenizer

    path = Path(tok_dir) / "tokenizer.json"
    tok = Tokenizer.from_file(str(path))
    qwen_pre_tokenizer(tok)
    tok.save(str(path))


def train_tokenizer(corpus_dir, out_dir, vocab_size=8192):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    corpus_dir, out_dir = Path(corpus_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    texts = [json.loads(l)["text"] for l in open(corpus_dir / "docs.jsonl")]
    tok = Tokenizer(models.BPE(byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(QWEN35_TOKENS), special_tokens=SPECIALS, min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )

    def it():
        for t in texts:  # neither the special tokens nor the tags are learnt as merges
            for s in SPECIALS + list(QWEN35_TOKENS):
                t = t.replace(s, "\n")
            yield t
    tok.train_from_iterator(it(), trainer=trainer, length=len(texts))
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in QWEN35_TOKENS])
    assert tok.get_vocab_size() == vocab_size, tok.get_vocab_size()
    tok.save(str(out_dir / "tokenizer.json"))
    added = {str(tok.token_to_id(s)): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                                       "single_word": False, "special": s in SPECIALS}
             for s in SPECIALS + list(QWEN35_TOKENS)}
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
        "split_special_tokens": False,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": added,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))
    (out_dir / "special_tokens_map.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, indent=1))
    print("tokenizer:", tok.get_vocab_size(), "tokens ->", out_dir)
    return tok


def _span_mask(offsets, spans):
    """1 for the tokens that start inside one of the character spans."""
    starts = np.array([o[0] for o in offsets])
    m = np.zeros(len(starts), dtype=np.uint8)
    for a, b in spans:
        m[(starts >= a) & (starts < b)] = 1
    return m


def doc_mask(offsets, doc):
    """A document's mask.npy values: 1 in its spans (written), 2 in its quiet spans (read only)."""
    return _span_mask(offsets, doc["spans"]) + 2 * _span_mask(offsets, doc.get("quiet", ()))


def encode_corpus(corpus_dir, tok_dir, out_dir):
    """tokens.npy: documents, each followed by <|endoftext|> (id 0); mask.npy: 1 on what the model
    writes, 2 on what it reads but must not learn to write (a document's "quiet" spans), 0 elsewhere;
    docs.npy: where each document starts."""
    from tokenizers import Tokenizer

    corpus_dir, out_dir = Path(corpus_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer.from_file(str(Path(tok_dir) / "tokenizer.json"))
    docs = [json.loads(l) for l in open(corpus_dir / "docs.jsonl")]
    encs = tok.encode_batch([d["text"] for d in docs], add_special_tokens=False)
    n = sum(len(e.ids) + 1 for e in encs)
    arr = np.empty(n, dtype=np.uint16)
    mask = np.zeros(n, dtype=np.uint8)
    starts = np.empty(len(docs), dtype=np.int64)
    i = 0
    for j, (d, e) in enumerate(zip(docs, encs)):
        starts[j] = i
        arr[i: i + len(e.ids)] = e.ids
        mask[i: i + len(e.ids)] = doc_mask(e.offsets, d)
        arr[i + len(e.ids)] = 0
        i += len(e.ids) + 1
    np.save(out_dir / "tokens.npy", arr)
    np.save(out_dir / "mask.npy", mask)
    np.save(out_dir / "docs.npy", starts)
    info = {"tokens": int(n), "docs": len(docs), "reply_tokens": int((mask == 1).sum()),
            "chars_per_token": round(sum(len(d["text"]) for d in docs) / n, 3),
            "doc_tokens_p50_p90_max": [int(x) for x in np.percentile(np.diff(np.append(starts, n)), [50, 90, 100])]}
    encode_prompts(corpus_dir, out_dir, tok_dir)
    (out_dir / "data_info.json").write_text(json.dumps(info, indent=1))
    print(json.dumps(info))
    return info


CONTEXTS = (64, 1024, 2048, 3500)


def encode_prompts(corpus_dir, out_dir, tok_dir):
    """Prompts as ids, rendered by the app's own code (core.chat) with the built tokenizer and
    template, for the GPU probe (probe.py): the held-out corpus conversations (eval_prompts.json),
    the everyday prompts (everyday.json), the race prompts padded to each context as bench.py
    --context pads them (context_prompts.json), the dictionary requests and their follow-ups
    (tools_eval.json)."""
    from types import SimpleNamespace

    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from core.chat import chat_prompt_ids, padded_chat_prompt, render

    tok_dir = Path(tok_dir)
    ad = SimpleNamespace(tokenizer=load_tokenizer(tok_dir))  # the app's tokenizer (mlx-lm's wrapper)
    ask = lambda q: chat_prompt_ids(ad, [{"role": "user", "content": q}])  # noqa: E731
    lines = lambda f: [l.strip() for l in (HERE / f).read_text().splitlines() if l.strip()]  # noqa: E731
    sets = {
        "eval_prompts": [json.loads(l) for l in open(Path(corpus_dir) / "eval_prompts.jsonl")],
        "everyday": [{"kind": "everyday", "prompt": q} for q in lines("everyday_prompts.txt")],
    }
    for name, items in sets.items():
        for d in items:
            d["ids"] = ask(d["prompt"])
            d.pop("reference", None)
        (Path(out_dir) / f"{name}.json").write_text(json.dumps(items))
    race = lines("race_prompts.txt")
    ctx = {str(n): [padded_chat_prompt(ad, q, n) for q in race] for n in CONTEXTS}
    (Path(out_dir) / "context_prompts.json").write_text(json.dumps(ctx))
    tools = []
    for l in open(Path(corpus_dir) / "tools_eval.jsonl"):
        e = json.loads(l)
        offered = [TOOL_EVAL_DICTIONARY, TOOL_EVAL_OTHER]
        msgs = [{"role": "user", "content": e["prompt"]}]
        e["tool"] = "lookup_word"
        e["ids"] = render(ad, msgs, tools=offered)
        call = {"type": "function", "function": {"name": "lookup_word", "arguments": json.dumps({"word": e["word"]})}}
        result = json.dumps({"word": e["word"], "part_of_speech": e["pos"], "definition": e["definition"]})
        msgs += [{"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "content": result}]
        e["follow_ids"] = render(ad, msgs, tools=offered)
        tools.append(e)
    (Path(out_dir) / "tools_eval.json").write_text(json.dumps(tools))
    shutil.copy(tok_dir / "tokenizer.json", Path(out_dir) / "tokenizer.json")  # the probe decodes with it


# The tools of the tool evaluation (eval_tools.py, probe.py): a dictionary, and one that fits nothing.
TOOL_EVAL_DICTIONARY = {"type": "function", "function": {
    "name": "lookup_word", "description": "Look up the meaning of an English word in the dictionary.",
    "parameters": {"type": "object", "properties": {"word": {"type": "string", "description": "the word to look up"}},
                   "required": ["word"]}}}
TOOL_EVAL_OTHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "the city name"}},
                   "required": ["city"]}}}


class Encoder:
    """text -> token ids with a built tokenizer (the held-out-loss measurements take one)."""

    def __init__(self, tok_dir):
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(str(Path(tok_dir) / "tokenizer.json"))

    def encode(self, text: str):
        return self.tok.encode(text).ids
