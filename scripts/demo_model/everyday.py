"""Everyday questions for the demo corpus (v2): what a new user types first.

The v1 corpus covered English words, the Python FAQ and quotes; on anything else ("Explain what
a violin is", "Who was Marie Curie?", "What is 17 times 23?", "Write a function that reverses a
string") the trunk was unsure, and an unsure trunk is what a one-layer head cannot draft: the
Race tab measured 36-65 % acceptance on such prompts against 85 % on the benchmark's. These
generators answer them in a few fixed, natural shapes from offline sources:

  concept     WordNet nouns: "A violin is <gloss>. It is a kind of <hypernym>. Kinds of violin
              include ... Parts of a violin include ... For example: ..." (2-5 sentences)
  person      WordNet instances of people: "Who was X?" -> "X was <gloss>."
  place       WordNet instances of places, and "What is the capital of C?" from the glosses
  difference  two nouns with one hypernym: "A is ..., while B is .... Both are kinds of H."
  spelling    "How do you spell X?", "How many letters are in X?"
  arithmetic  + - x / and percentages, computed
  code        hand-written small Python tasks, each with a function, an example call and its result

Each returns items {"kind", "messages": [question, answer], "word"?, "data"?}; "data" carries
what the tool conversations need (a definition, an expression and its value).
"""
from __future__ import annotations

import random
import re

from corpus import _article, _w, _wn_index, _wn_synsets

CONCEPT_Q = [
    "What is {a} {w}?", "Explain what {a} {w} is.", "Tell me about {a} {w}.", "Can you explain what {a} {w} is?",
    "Describe {a} {w}.", "What exactly is {a} {w}?", "I would like to know what {a} {w} is.",
    "Explain in a few sentences what {a} {w} is.", "What is {a} {w}? Give an example.",
    "Explain {a} {w} to me, with an example.", "What's {a} {w}, in simple words?", "Tell me something about {w}.",
]
PERSON_Q = ["Who was {n}?", "Who is {n}?", "Tell me about {n}.", "What is {n} known for?", "Who was {n}, in one sentence?",
            "What did {n} do?"]
PLACE_Q = ["Where is {n}?", "What is {n}?", "Tell me about {n}.", "Where can I find {n}?", "What do you know about {n}?"]
CAPITAL_Q = ["What is the capital of {c}?", "What's the capital of {c}?", "Which city is the capital of {c}?",
             "Capital of {c}?", "Tell me the capital of {c}."]
DIFF_Q = ["What is the difference between {a1} {w1} and {a2} {w2}?", "How is {a1} {w1} different from {a2} {w2}?",
          "{W1} or {w2}: what is the difference?", "Compare {a1} {w1} and {a2} {w2}."]
SPELL_Q = ["How do you spell {w}?", "Spell {w} for me.", "How is {w} spelled?", "Can you spell the word {w}?"]
LETTERS_Q = ["How many letters are in the word {w}?", "How many letters does {w} have?", "Count the letters in {w}."]


def _sentence(text: str) -> str:
    text = text.strip().rstrip(";,").strip()
    return text[:1].upper() + text[1:] + ("" if text.endswith((".", "!", "?")) else ".")


def _gloss(d: str) -> str:
    """A WordNet gloss as the rest of a sentence ("a sheltered port where ships ..."): its first
    clause, without a leading domain label such as "(physics)"."""
    d = re.sub(r"^\([^)]*\)\s*", "", d.strip())
    return re.sub(r"\s+", " ", d.split(";")[0].strip())


def _np(d: str) -> str:
    """A gloss as a noun phrase with an article ("hinge joint in ..." -> "a hinge joint in ...")."""
    if re.match(r"(a|an|the|any|one|some|someone|something|anything|everything|all|each|two|three)\b", d):
        return d
    return f"{_article(d)} {d}"


class WordNet:
    """The parsed WordNet 3.0 database, loaded once."""

    def __init__(self):
        self.syn = _wn_synsets()
        self.idx = _wn_index()

    def noun_senses(self, min_tagged=1):
        """(word, first synset) of the common lowercase nouns."""
        out = []
        for (lemma, t), info in self.idx.items():
            if t != "n" or info["tagged"] < min_tagged:
                continue
            w = _w(lemma)
            if not re.fullmatch(r"[a-z][a-z -]*", w) or len(w) < 3:
                continue
            s = self.syn.get(info["synsets"][0])
            if s and s["def"]:
                out.append((w, info["synsets"][0], s))
        return out

    def first_word(self, key):
        s = self.syn.get(key)
        return _w(s["words"][0]) if s else None

    def related(self, s, sym, k=3):
        words = []
        for p in s["ptrs"]:
            if p[0] == sym and (p[1], p[2] if p[2] != "s" else "a") in self.syn:
                x = self.first_word((p[1], p[2] if p[2] != "s" else "a"))
                if x and re.fullmatch(r"[A-Za-z][A-Za-z' -]*", x) and x not in words:
                    words.append(x)
        return words[:k]


def concept_answer(wn, w, s, with_example=True):
    a = _article(w)
    parts = [f"{a.capitalize()} {w} is {_np(_gloss(s['def']))}."]
    hyper = wn.related(s, "@", 1)
    if hyper and hyper[0].lower() != w:
        parts.append(f"It is a kind of {hyper[0]}.")
    kinds = [x for x in wn.related(s, "~", 3) if x.lower() != w]
    if len(kinds) >= 2:
        parts.append(f"Kinds of {w} include {_list(kinds)}.")
    has = wn.related(s, "%p", 3)
    if len(has) >= 2:
        parts.append(f"Parts of {a} {w} include {_list(has)}.")
    ex = next((e for e in s["ex"] if w.split()[0] in e.lower()), None)
    if with_example and ex:
        parts.append(f'For example: "{ex}"')
    return " ".join(parts)


def _list(xs):
    return xs[0] if len(xs) == 1 else ", ".join(xs[:-1]) + " and " + xs[-1]


def concepts(wn, rng, phrasings=1):
    out = []
    for w, key, s in wn.noun_senses():
        a = _article(w)
        for q in rng.sample(CONCEPT_Q, phrasings):
            ans = concept_answer(wn, w, s)
            out.append({"kind": "concept", "word": w, "messages": [q.format(a=a, w=w), ans],
                        "data": {"definition": _gloss(s["def"]), "pos": "noun"}})
    return out


def _person_name(words):
    names = [_w(x) for x in words]
    full = max(names, key=lambda n: (len(n.split()), len(n)))
    return full if re.fullmatch(r"[A-Z][A-Za-z.' -]+", full) else None


def persons_and_places(wn, rng):
    """Instances: people ('(1879-1955)' in the gloss, or a human hypernym) and places."""
    out = []
    for key, s in wn.syn.items():
        inst = [p for p in s["ptrs"] if p[0] == "@i"]
        if key[1] != "n" or not inst or not s["def"]:
            continue
        name = _person_name(s["words"])
        if not name:
            continue
        d = _gloss(s["def"])
        person = bool(re.search(r"\(\d{3,4}-\d{3,4}\)|\(born in \d{4}\)|\(died \d{3,4}\)", d))
        if person:
            q = rng.choice(PERSON_Q).format(n=name)
            verb = "is" if "born in" in d and "(" in d else "was"
            out.append({"kind": "person", "messages": [q, f"{name} {verb} {_article(d)} {d}." if not
                                                       re.match(r"(a|an|the|one) ", d) else f"{name} {verb} {d}."]})
            continue
        if re.search(r"\b(city|town|country|republic|kingdom|state|river|mountain|island|lake|sea|ocean|port|"
                     r"capital|region|province|desert|peak|bay|island)\b", d):
            q = rng.choice(PLACE_Q).format(n=name)
            out.append({"kind": "place", "messages": [q, f"{name} is {d}." if re.match(r"(a|an|the) ", d)
                                                      else f"{name} is {_article(d)} {d}."]})
            m = re.search(r"\bcapital (?:and largest city )?of ((?:the )?[A-Z][A-Za-z]+(?: (?:and )?[A-Z][A-Za-z]+)*)", d)
            if m:
                c = m.group(1)
                q = rng.choice(CAPITAL_Q).format(c=c)
                out.append({"kind": "capital", "messages": [q, f"The capital of {c} is {name}. {name} is "
                                                            + (d if re.match(r"(a|an|the) ", d) else "the " + d) + "."]})
    return out


def differences(wn, rng, n=6000):
    """Two common nouns under one hypernym."""
    by_hyper = {}
    for w, key, s in wn.noun_senses():
        h = [p for p in s["ptrs"] if p[0] == "@"]
        if h:
            by_hyper.setdefault(h[0][1], []).append((w, s))
    groups = [g for g in by_hyper.values() if len(g) >= 2]
    out = []
    for _ in range(n):
        g = rng.choice(groups)
        (w1, s1), (w2, s2) = rng.sample(g, 2)
        hyper = wn.related(s1, "@", 1)
        a1, a2 = _article(w1), _article(w2)
        q = rng.choice(DIFF_Q).format(a1=a1, w1=w1, a2=a2, w2=w2, W1=w1.capitalize())
        ans = f"{a1.capitalize()} {w1} is {_np(_gloss(s1['def']))}, while {a2} {w2} is {_np(_gloss(s2['def']))}."
        if hyper:
            ans += f" Both are kinds of {hyper[0]}."
        out.append({"kind": "difference", "messages": [q, ans]})
    return out


def spelling(wn, rng, n=6000):
    words = [w for w, _, _ in wn.noun_senses() if " " not in w and "-" not in w]
    out = []
    for w in rng.sample(words, min(n, len(words))):
        if rng.random() < 0.5:
            q = rng.choice(SPELL_Q).format(w=w)
            out.append({"kind": "spelling", "messages": [q, f'"{w}" is spelled {"-".join(w.upper())}.']})
        else:
            q = rng.choice(LETTERS_Q).format(w=w)
            out.append({"kind": "spelling", "messages": [q, f'The word "{w}" has {len(w)} letters: {"-".join(w.upper())}.']})
    return out


# ------------------------------------------------------------------------------- arithmetic

ARITH_Q = {
    "+": ["What is {a} + {b}?", "What is {a} plus {b}?", "How much is {a} plus {b}?", "Add {a} and {b}.",
          "Calculate {a} + {b}.", "{a} + {b} = ?", "What do you get if you add {a} and {b}?"],
    "-": ["What is {a} - {b}?", "What is {a} minus {b}?", "How much is {a} minus {b}?", "Subtract {b} from {a}.",
          "Calculate {a} - {b}.", "{a} - {b} = ?"],
    "*": ["What is {a} * {b}?", "What is {a} times {b}?", "How much is {a} times {b}?", "Multiply {a} by {b}.",
          "Calculate {a} * {b}.", "What is {a} multiplied by {b}?", "{a} x {b} = ?"],
    "/": ["What is {a} / {b}?", "What is {a} divided by {b}?", "How much is {a} divided by {b}?",
          "Divide {a} by {b}.", "Calculate {a} / {b}."],
    "%": ["What is {b}% of {a}?", "How much is {b} percent of {a}?", "Calculate {b}% of {a}."],
}
WORD_OP = {"+": "plus", "-": "minus", "*": "times", "/": "divided by"}


def arith_problem(rng):
    op = rng.choice(["+", "+", "-", "-", "*", "*", "/", "%"])
    if op in "+-":
        a, b = rng.randint(2, 999), rng.randint(2, 999)
        if op == "-" and b > a:
            a, b = b, a
        r = a + b if op == "+" else a - b
    elif op == "*":
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        r = a * b
    elif op == "/":
        b, r = rng.randint(2, 30), rng.randint(2, 99)
        a = b * r
    else:
        b = rng.choice([5, 10, 15, 20, 25, 30, 40, 50, 60, 75, 80])
        a = rng.choice([20, 40, 60, 80, 100, 120, 150, 200, 250, 300, 400, 500, 800, 1000])
        r = a * b / 100
        r = int(r) if r == int(r) else r
    expr = f"{b}% of {a}" if op == "%" else f"{a} {op} {b}"
    return op, a, b, r, expr


def arithmetic(rng, n=20000):
    out = []
    for _ in range(n):
        op, a, b, r, expr = arith_problem(rng)
        q = rng.choice(ARITH_Q[op]).format(a=a, b=b)
        if op == "%":
            ans = f"{b}% of {a} is {r}."
        else:
            ans = rng.choice([f"{a} {op} {b} = {r}.", f"{a} {WORD_OP[op]} {b} is {r}."])
        out.append({"kind": "arithmetic", "messages": [q, ans],
                    "data": {"expression": (f"{a} * {b} / 100" if op == "%" else expr), "result": r, "question": q}})
    return out


# ------------------------------------------------------------------------------- code

# (task, function name, arguments, body lines, example argument, example result)
CODE_TASKS = [
    ("reverses a string", "reverse_string", "s", ["return s[::-1]"], '"hello"', '"olleh"'),
    ("returns the sum of a list of numbers", "total", "numbers", ["return sum(numbers)"], "[1, 2, 3]", "6"),
    ("returns the largest number in a list", "largest", "numbers", ["return max(numbers)"], "[3, 9, 4]", "9"),
    ("returns the smallest number in a list", "smallest", "numbers", ["return min(numbers)"], "[3, 9, 4]", "3"),
    ("checks whether a number is even", "is_even", "n", ["return n % 2 == 0"], "4", "True"),
    ("checks whether a number is odd", "is_odd", "n", ["return n % 2 == 1"], "4", "False"),
    ("checks whether a string is a palindrome", "is_palindrome", "s", ["s = s.lower()", "return s == s[::-1]"],
     '"Level"', "True"),
    ("counts the vowels in a string", "count_vowels", "s", ["return sum(1 for c in s.lower() if c in \"aeiou\")"],
     '"banana"', "3"),
    ("computes the factorial of a number", "factorial", "n",
     ["result = 1", "for i in range(2, n + 1):", "    result *= i", "return result"], "5", "120"),
    ("returns the n-th Fibonacci number", "fibonacci", "n", ["a, b = 0, 1", "for _ in range(n):", "    a, b = b, a + b",
                                                            "return a"], "10", "55"),
    ("returns the average of a list of numbers", "average", "numbers", ["return sum(numbers) / len(numbers)"],
     "[2, 4, 6]", "4.0"),
    ("converts Celsius to Fahrenheit", "celsius_to_fahrenheit", "c", ["return c * 9 / 5 + 32"], "100", "212.0"),
    ("converts Fahrenheit to Celsius", "fahrenheit_to_celsius", "f", ["return (f - 32) * 5 / 9"], "212", "100.0"),
    ("counts the words in a sentence", "count_words", "text", ["return len(text.split())"], '"the cat sat"', "3"),
    ("removes duplicates from a list", "unique", "items", ["return list(dict.fromkeys(items))"], "[1, 2, 2, 3, 1]",
     "[1, 2, 3]"),
    ("squares every number in a list", "squares", "numbers", ["return [n * n for n in numbers]"], "[1, 2, 3]",
     "[1, 4, 9]"),
    ("keeps only the even numbers of a list", "evens", "numbers", ["return [n for n in numbers if n % 2 == 0]"],
     "[1, 2, 3, 4]", "[2, 4]"),
    ("checks whether a number is prime", "is_prime", "n",
     ["if n < 2:", "    return False", "for i in range(2, int(n ** 0.5) + 1):", "    if n % i == 0:",
      "        return False", "return True"], "7", "True"),
    ("returns the length of the longest word in a sentence", "longest_word_length", "text",
     ["return max(len(w) for w in text.split())"], '"a quick brown fox"', "5"),
    ("capitalizes the first letter of every word", "title_case", "text", ["return text.title()"], '"hello world"',
     '"Hello World"'),
    ("counts how often each character appears in a string", "char_counts", "s",
     ["counts = {}", "for c in s:", "    counts[c] = counts.get(c, 0) + 1", "return counts"], '"aab"',
     "{'a': 2, 'b': 1}"),
    ("merges two dictionaries", "merge", "a, b", ["return {**a, **b}"], '{"x": 1}, {"y": 2}', "{'x': 1, 'y': 2}"),
    ("returns the last element of a list", "last", "items", ["return items[-1]"], "[4, 5, 6]", "6"),
    ("flattens a list of lists", "flatten", "lists", ["return [x for sub in lists for x in sub]"], "[[1, 2], [3]]",
     "[1, 2, 3]"),
    ("sorts a list of words alphabetically", "sort_words", "words", ["return sorted(words)"], '["pear", "apple"]',
     "['apple', 'pear']"),
    ("returns the second largest number in a list", "second_largest", "numbers", ["return sorted(set(numbers))[-2]"],
     "[5, 1, 9, 7]", "7"),
    ("checks whether two words are anagrams", "is_anagram", "a, b", ["return sorted(a) == sorted(b)"],
     '"listen", "silent"', "True"),
    ("returns the sum of the digits of a number", "digit_sum", "n", ["return sum(int(d) for d in str(n))"], "1234",
     "10"),
    ("counts how many times a word appears in a text", "count_word", "text, word",
     ["return text.lower().split().count(word.lower())"], '"the cat and the dog", "the"', "2"),
    ("returns the greatest common divisor of two numbers", "gcd", "a, b", ["while b:", "    a, b = b, a % b",
                                                                        "return a"], "12, 18", "6"),
    ("converts a list of strings to upper case", "shout", "words", ["return [w.upper() for w in words]"],
     '["hi", "there"]', "['HI', 'THERE']"),
    ("returns the area of a circle with a given radius", "circle_area", "r", ["import math", "return math.pi * r * r"],
     "1", "3.141592653589793"),
    ("checks whether a year is a leap year", "is_leap_year", "year",
     ["return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)"], "2024", "True"),
    ("returns the first n even numbers", "first_evens", "n", ["return [2 * i for i in range(n)]"], "4",
     "[0, 2, 4, 6]"),
    ("joins a list of words into one sentence", "join_words", "words", ["return \" \".join(words)"],
     '["hello", "world"]', '"hello world"'),
    ("returns the number of uppercase letters in a string", "count_upper", "s", ["return sum(c.isupper() for c in s)"],
     '"Hello World"', "2"),
    ("swaps the keys and values of a dictionary", "invert", "d", ["return {v: k for k, v in d.items()}"],
     '{"a": 1}', "{1: 'a'}"),
    ("returns every second element of a list", "every_other", "items", ["return items[::2]"], "[1, 2, 3, 4, 5]",
     "[1, 3, 5]"),
    ("removes the spaces from a string", "remove_spaces", "s", ["return s.replace(\" \", \"\")"], '"a b c"', '"abc"'),
    ("returns the product of a list of numbers", "product", "numbers",
     ["result = 1", "for n in numbers:", "    result *= n", "return result"], "[2, 3, 4]", "24"),
]
CODE_Q = [
    "Write a Python function that {task}.", "Write a function that {task}.", "How do I write a function that {task}?",
    "Can you write a Python function that {task}?", "Show me a Python function that {task}.",
    "I need a Python function that {task}.", "Give me Python code for a function that {task}.",
    "Python: write a function that {task}.",
]


def code_tasks(rng, repeats=30):
    out = []
    for task, name, args, body, ex_in, ex_out in CODE_TASKS:
        code = "\n".join([f"def {name}({args}):"] + ["    " + line for line in body])
        for q in [rng.choice(CODE_Q) for _ in range(repeats)]:
            intro = rng.choice([f"Here is a Python function that {task}:", f"Here is a function that {task}:",
                                f"Sure. This function {task.replace('returns', 'returns', 1)}:"])
            ans = (f"{intro}\n\n```python\n{code}\n```\n\nFor example, `{name}({ex_in})` returns `{ex_out}`.")
            out.append({"kind": "code", "messages": [q.format(task=task), ans]})
    return out


def everyday(rng, wn=None):
    wn = wn or WordNet()
    return {
        "concept": concepts(wn, rng),
        "person_place": persons_and_places(wn, rng),
        "difference": differences(wn, rng),
        "spelling": spelling(wn, rng),
        "arithmetic": arithmetic(rng),
        "code": code_tasks(rng),
    }


if __name__ == "__main__":
    rng = random.Random(0)
    parts = everyday(rng)
    for k, v in parts.items():
        print(k, len(v))
        for d in rng.sample(v, 3):
            print("  Q:", d["messages"][0])
            print("  A:", d["messages"][1][:300].replace("\n", " / "))
