"""The tokenizer files of a tiny checkpoint: special tokens, the chat templates (ChatML, Qwen3.5's,
Gemma 4's), and a byte-level BPE trained at build time on a small built-in English text.

One module for every family's maker (make_tiny_checkpoint.py, tiny_gemma4.py, the GPU shapes in
scripts/gpu/gpu_make_checkpoint.py, the demo model's tokenizer), so that none of them imports another
maker for its tokens. Imports nothing of the project.
"""
from __future__ import annotations

import json
from pathlib import Path

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}"
    "{{- message['content'] -}}"
    "{%- else -%}"
    "{%- for block in message['content'] -%}"
    "{%- if block['type'] == 'text' -%}{{- block['text'] -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# A Qwen3.5-style template (template="qwen3_5"): tools listed in the system turn, calls as
# <tool_call> blocks, tool results as <tool_response> user turns, and a reasoning switch:
# the generation prompt opens a <think> block, or with enable_thinking=false closes an empty
# one. Earlier turns' thinking is dropped when the history is re-rendered, as Qwen's does.
QWEN35_TEMPLATE = (
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages and messages[0].role == 'system' -%}{{- messages[0].content + '\\n\\n' -}}{%- endif -%}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' -}}{{- tool | tojson -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, "
    "\\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n' -}}"
    "{%- elif messages and messages[0].role == 'system' -%}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- set ns = namespace(last_query=messages|length - 1, done=false) -%}"
    "{%- for m in messages[::-1] -%}"
    "{%- if not ns.done and m.role == 'user' and not (m.content is string and m.content.startswith('<tool_response>')) -%}"
    "{%- set ns.last_query = messages|length - 1 - loop.index0 -%}{%- set ns.done = true -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- set content = m.content if m.content is string else '' -%}"
    "{%- if m.role == 'user' or (m.role == 'system' and not loop.first) -%}"
    "{{- '<|im_start|>' + m.role + '\\n' + content + '<|im_end|>\\n' -}}"
    "{%- elif m.role == 'assistant' -%}"
    "{%- set reasoning = m.reasoning_content if m.reasoning_content is string else '' -%}"
    "{%- if '</think>' in content -%}"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}"
    "{%- endif -%}"
    "{%- if loop.index0 > ns.last_query and reasoning -%}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n' + content -}}"
    "{%- else -%}"
    "{{- '<|im_start|>assistant\\n' + content -}}"
    "{%- endif -%}"
    "{%- for tc in m.tool_calls or [] -%}"
    "{%- set f = tc.function if tc.function else tc -%}"
    "{%- if content or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>\\n{\\\"name\\\": \\\"' + f.name + '\\\", \\\"arguments\\\": ' -}}"
    "{{- f.arguments if f.arguments is string else f.arguments | tojson -}}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif m.role == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' -}}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- else -%}{{- '<think>\\n' -}}{%- endif -%}"
    "{%- endif -%}"
)
# A Gemma 4-style template (template="gemma4", the 26B/31B chat_template.jinja's shape): turns as
# <|turn>ROLE ... <turn|>, the assistant's role named "model"; thinking on puts <|think|> at the top
# of a system turn and the model opens its own <|channel>thought ... <channel|> block; thinking off
# (the default) closes an empty one in the generation prompt. Earlier turns' thoughts are dropped.
GEMMA4_TEMPLATE = (
    "{%- set enable_thinking = enable_thinking | default(false) -%}"
    "{%- set first_system = messages and messages[0].role == 'system' -%}"
    "{%- if enable_thinking or first_system -%}"
    "{{- '<|turn>system\n' -}}"
    "{%- if enable_thinking -%}{{- '<|think|>\n' -}}{%- endif -%}"
    "{%- if first_system -%}{{- messages[0].content -}}{%- endif -%}"
    "{{- '<turn|>\n' -}}"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if not (loop.first and first_system) -%}"
    "{%- set content = m.content if m.content is string else '' -%}"
    "{%- if m.role == 'assistant' and '<channel|>' in content -%}"
    "{%- set content = content.split('<channel|>')[-1].lstrip('\n') -%}"
    "{%- endif -%}"
    "{{- '<|turn>' + ('model' if m.role == 'assistant' else m.role) + '\n' + content + '<turn|>\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|turn>model\n' -}}"
    "{%- if not enable_thinking -%}{{- '<|channel>thought\n<channel|>' -}}{%- endif -%}"
    "{%- endif -%}"
)
TEMPLATES = {"chatml": CHAT_TEMPLATE, "qwen3_5": QWEN35_TEMPLATE, "gemma4": GEMMA4_TEMPLATE}
# Added (non-special) tokens of the Qwen3.5 template, as Qwen's tokenizer has them.
QWEN35_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
GEMMA4_TOKENS = ("<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|think|>")
TEMPLATE_TOKENS = {"qwen3_5": QWEN35_TOKENS, "gemma4": GEMMA4_TOKENS}

# A small built-in English text for the BPE (written for this project; no licence issues).
_CORPUS = """
The quick brown fox jumps over the lazy dog. A small model can still write a sentence,
even when its weights are random. This text exists only to teach a byte-level tokenizer
which pieces of English are common: the, and, of, to, in, is, that, it, was, for, on, are,
with, as, his, they, be, at, one, have, this, from, or, had, by, not, word, but, what,
some, we, can, out, other, were, all, there, when, up, use, your, how, said, an, each,
she, which, do, their, time, if, will, way, about, many, then, them, write, would, like,
so, these, her, long, make, thing, see, him, two, has, look, more, day, could, go, come,
did, number, sound, no, most, people, my, over, know, water, than, call, first, who, may,
down, side, been, now, find, any, new, work, part, take, get, place, made, live, where,
after, back, little, only, round, man, year, came, show, every, good, me, give, our,
under, name, very, through, just, form, sentence, great, think, say, help, low, line.

User: What is speculative decoding?
Assistant: Speculative decoding lets a fast draft propose the next few tokens, and the
large model checks all of them in one forward pass. Tokens that the large model agrees
with are kept; at the first disagreement the large model's own choice replaces the draft.
The output has exactly the distribution of the large model, but it arrives faster.

User: What does multi-token prediction mean?
Assistant: A model trained with multi-token prediction has an extra head that guesses the
token after the next one. At inference time that head is a free draft model: it shares the
embedding table and the output layer with the main model, so it costs only one layer.

User: Can you write a short poem about the sea?
Assistant: The sea is grey, the sea is wide,
it keeps its secrets deep inside;
it sings at night, it sleeps at noon,
and dances with the silver moon.

User: How do I make a cup of tea?
Assistant: Boil fresh water, warm the pot, add one spoon of tea for each cup, pour the
water over the leaves and wait three to five minutes. Then pour, and add milk or lemon if
you like. Good tea needs good water and a little patience.

User: Tell me a fact about the moon.
Assistant: The moon always shows the same face to the Earth, because it turns once on its
axis in the same time that it takes to go once around the Earth.

def greet(name):
    return "Hello, " + name + "!"

for i in range(10):
    print(i, greet("world"))

Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 20 50 100 1000 2024 3.14 42.
Punctuation: , . ; : ! ? ' " ( ) [ ] { } - + = * / # @ & % $ < > _ |
Once upon a time there was a little robot who wanted to learn to read. Every morning it
opened a book, looked at the letters, and tried to guess the next word. Some days it was
right, some days it was wrong, but it never stopped trying, and in the end it could read
every story in the library. The library was old and quiet, and the robot liked it there.
"""

_TOKENIZER_CACHE: dict = {}


# --------------------------------------------------------------------------- tokenizer
def _train_tokenizer_json(vocab_size: int, extra_tokens=()) -> str:
    """A byte-level BPE of exactly ``vocab_size`` ids, ChatML specials at the end, any
    ``extra_tokens`` (added, not special) just before them."""
    key = (vocab_size, tuple(extra_tokens))
    if key in _TOKENIZER_CACHE:
        return _TOKENIZER_CACHE[key]
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    n_special = len(SPECIAL_TOKENS) + len(extra_tokens)
    if vocab_size < 256 + n_special:
        raise ValueError(f"vocab_size must be >= {256 + n_special} for a byte-level BPE")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - n_special,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    # A small corpus may give fewer merges than asked (969 tokens): fill so the ids are contiguous
    # and the specials sit at the very end (vocab_size - 3 ...), like Qwen's. The fillers are
    # entries of the BPE's own vocabulary that no merge produces (never in an encoding, decoded
    # as their text), not added tokens: 247,351 added tokens (the 9B shape's 248,320 ids) took
    # llguidance's tokenizer (a forced tool call's grammar, core/constraints.py) 472 s to build
    # on a 2-core CPU, quadratic in their number (32,768 ids: 5 s), and transformers 9 s to load;
    # as vocabulary entries, 1 s.
    n = tok.get_vocab_size()
    if vocab_size - n_special > n:
        data = json.loads(tok.to_str())
        vocab = data["model"]["vocab"]
        fillers = {f"<|extra_{i}|>": n + i for i in range(vocab_size - n_special - n)}
        assert not set(fillers) & set(vocab)
        vocab.update(fillers)
        tok = Tokenizer.from_str(json.dumps(data))
    if extra_tokens:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in extra_tokens])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    assert tok.get_vocab_size() == vocab_size, (tok.get_vocab_size(), vocab_size)
    js = tok.to_str()
    _TOKENIZER_CACHE[key] = js
    return js


def write_tokenizer(out: Path, vocab_size: int, model_max_length: int, template: str = "chatml",
                     extra_tokens=()) -> dict:
    js = _train_tokenizer_json(vocab_size, tuple(TEMPLATE_TOKENS.get(template, ())) + tuple(extra_tokens))
    (out / "tokenizer.json").write_text(js)
    ids = {t: vocab_size - len(SPECIAL_TOKENS) + i for i, t in enumerate(SPECIAL_TOKENS)}
    # Every added token (the specials and extra tokens) with its id: transformers rebuilds the
    # added tokens from this map and would renumber any that are missing.
    added = {
        str(a["id"]): {k: a[k] for k in ("content", "lstrip", "normalized", "rstrip",
                                          "single_word", "special")}
        for a in json.loads(js)["added_tokens"]
    }
    assert all(added[str(ids[t])]["content"] == t for t in SPECIAL_TOKENS)
    tok_cfg = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": [t for t in SPECIAL_TOKENS if t != PAD_TOKEN],
        "bos_token": None,
        "chat_template": TEMPLATES[template],
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS_TOKEN,
        "errors": "replace",
        "model_max_length": model_max_length,
        "pad_token": PAD_TOKEN,
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2))
    (out / "special_tokens_map.json").write_text(json.dumps({
        "additional_special_tokens": [t for t in SPECIAL_TOKENS if t != PAD_TOKEN],
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
    }, indent=2))
    return ids
