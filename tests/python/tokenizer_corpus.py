"""Deterministic multilingual corpus for tokenizer parity tests and benchmarks.

`build_corpus(target_bytes, seed)` returns a list of documents (str) whose UTF-8 size is at least
`target_bytes`: prose-like text in many scripts, whitespace and newline runs, numbers in many digit systems,
Python sources from the standard library on this machine, JSON, code-fence/tilde runs, special-token strings as
content, long runs that stress the BPE heap path, and random Unicode scalar values from every plane.
"""
from __future__ import annotations

import json
import pathlib
import random
import sysconfig

# (first, last) code point ranges of letters (and marks) per script; words are drawn from these.
SCRIPTS = {
    "latin": [(0x61, 0x7A), (0x41, 0x5A), (0xC0, 0xFF), (0x100, 0x17F)],
    "latin_combining": [(0x61, 0x7A), (0x300, 0x36F)],
    "cyrillic": [(0x410, 0x44F), (0x450, 0x45F)],
    "greek": [(0x391, 0x3A9), (0x3B1, 0x3C9), (0x1F00, 0x1F15)],
    "arabic": [(0x621, 0x64A), (0x64B, 0x652), (0x6A9, 0x6AF)],
    "hebrew": [(0x5D0, 0x5EA), (0x5B0, 0x5BC)],
    "devanagari": [(0x915, 0x939), (0x93E, 0x94D), (0x905, 0x914)],
    "thai": [(0xE01, 0xE2E), (0xE30, 0xE3A), (0xE40, 0xE4E)],
    "han": [(0x4E00, 0x9FA5), (0x9FA6, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF)],
    "kana": [(0x3041, 0x3096), (0x3099, 0x309F), (0x30A0, 0x30FF), (0xFF66, 0xFF9D)],
    "hangul": [(0xAC00, 0xD7A3), (0x1100, 0x11FF), (0x3131, 0x318E)],
    "misc": [(0x10A0, 0x10FF), (0x531, 0x587), (0x1200, 0x137C), (0x13A0, 0x13F4), (0x1780, 0x17DD)],
}
PUNCT = list(".,;:!?'\"()[]{}<>-_/\\|@#$%^&*+=~`") + list("。、！？「」『』（）《》・…—–«»¡¿،؛؟।॥“”‘’") + ["§", "¶", "©", "®", "°"]
SPACES = [" ", " ", " ", "  ", "\t", "\n", "\r\n", "\n\n", "\r", "\u3000", "\u00a0", "\u2028", "\u0085", "\u200b",
          "\u000b", "\u000c", " \n", "\t\t", "    ", " \r\n ", "\u2003", "\u202f"]
EMOJI = ["🙂", "🎉", "👍", "👍🏽", "👩‍💻", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷", "🇯🇵", "🇺🇸", "1️⃣", "❤️", "✈︎", "🧑🏿‍🚀",
         "🤷‍♀️", "🐈‍⬛", "😀😃😄", "🫠", "🫶🏻", "⭐", "☕"]
DIGITS = ["0123456789", "٠١٢٣٤٥٦٧٨٩", "०१२३४५६७८९", "０１２３４５６７８９", "๐๑๒๓๔๕๖๗๘๙", "²³¹", "½¼¾", "ⅠⅡⅢⅣⅫ", "①②③"]
TOKEN_STRINGS = ["<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "｜DSML｜", "<｜DSML｜ calls>",
                 "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<｜latest_reminder｜>",
                 "<｜place▁holder▁no▁799｜>", "<｜image｜>", "<|EOT|>", "<dsml:", "</dsml:", "<｜/table>｜"]


def _char(rng: random.Random, ranges) -> str:
    lo, hi = rng.choice(ranges)
    return chr(rng.randint(lo, hi))


def _word(rng: random.Random, ranges) -> str:
    return "".join(_char(rng, ranges) for _ in range(rng.randint(1, 9)))


def _number(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.5:
        return str(rng.randint(0, 10 ** rng.randint(1, 12)))
    if kind < 0.7:
        return f"{rng.uniform(-1e6, 1e6):.{rng.randint(0, 8)}f}"
    if kind < 0.8:
        return f"{rng.randint(0, 999)},{rng.randint(0, 999):03d},{rng.randint(0, 999):03d}"
    digits = rng.choice(DIGITS)
    return "".join(rng.choice(digits) for _ in range(rng.randint(1, 8)))


def prose(rng: random.Random, size: int) -> str:
    scripts = list(SCRIPTS.values())
    parts, n = [], 0
    ranges = rng.choice(scripts)
    while n < size:
        r = rng.random()
        if r < 0.55:
            s = _word(rng, ranges)
        elif r < 0.75:
            s = rng.choice(SPACES)
        elif r < 0.85:
            s = rng.choice(PUNCT) * rng.choice([1, 1, 1, 2, 3])
        elif r < 0.92:
            s = _number(rng)
        elif r < 0.97:
            s = rng.choice(EMOJI)
        else:
            ranges = rng.choice(scripts)  # switch script mid-document
            s = rng.choice(SPACES)
        parts.append(s)
        n += len(s)
    return "".join(parts)


def random_scalars(rng: random.Random, count: int) -> str:
    """Random Unicode scalar values from every plane (surrogates excluded), biased to the assigned BMP."""
    out = []
    for _ in range(count):
        r = rng.random()
        if r < 0.5:
            cp = rng.randint(0, 0xFFFF)
        elif r < 0.8:
            cp = rng.randint(0x10000, 0x3FFFF)
        else:
            cp = rng.randint(0, 0x10FFFF)
        if 0xD800 <= cp <= 0xDFFF:
            cp = 0xFFFD
        out.append(chr(cp))
    return "".join(out)


def long_runs(rng: random.Random) -> list[str]:
    """Pieces longer than the BPE small-piece limit: exercises the heap merge path."""
    b64 = "".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/") for _ in range(3000))
    return [
        " " * 5000, "a" * 3000, "ab" * 1500, "=" * 2000, "-" * 500 + "\n", "\n" * 700, "\t" * 300 + "x",
        b64, "9" * 1000, "日本語" * 400, "🙂" * 300, "ñ" * 1000, "\u3000" * 200 + "y", "\r\n" * 300,
        "".join(rng.choice("ab") for _ in range(4000)), "x" + "\u0301" * 500, "ก" * 800,
        "Supercalifragilisticexpialidocious" * 50, " ~~~" * 100, "~~~~~~~~~~" * 30, "```python\n" * 20,
    ]


def json_docs(rng: random.Random, count: int) -> list[str]:
    def value(depth: int):
        r = rng.random()
        if depth > 3 or r < 0.3:
            return rng.choice([rng.randint(-10 ** 9, 10 ** 9), rng.random() * 1e3, True, False, None,
                               prose(rng, rng.randint(1, 40))])
        if r < 0.65:
            return [value(depth + 1) for _ in range(rng.randint(0, 5))]
        return {prose(rng, rng.randint(1, 12)): value(depth + 1) for _ in range(rng.randint(0, 5))}

    return [json.dumps(value(0), ensure_ascii=rng.random() < 0.3, indent=rng.choice([None, 2, 4]))
            for _ in range(count)]


def special_token_docs(rng: random.Random, count: int) -> list[str]:
    docs = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(2, 12)):
            parts.append(rng.choice(TOKEN_STRINGS) if rng.random() < 0.4 else prose(rng, rng.randint(0, 30)))
        docs.append("".join(parts))
    return docs


def stdlib_sources(limit_bytes: int) -> list[str]:
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    docs, total = [], 0
    for path in sorted(root.glob("*.py")) + sorted(root.glob("*/*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        docs.append(text)
        total += len(text.encode("utf-8"))
        if total >= limit_bytes:
            break
    return docs


def build_corpus(target_bytes: int = 10_500_000, seed: int = 20260901) -> list[str]:
    rng = random.Random(seed)
    docs: list[str] = []
    docs += stdlib_sources(target_bytes // 4)
    docs += json_docs(rng, 400)
    docs += special_token_docs(rng, 300)
    docs += long_runs(rng)
    docs += [random_scalars(rng, rng.randint(50, 4000)) for _ in range(200)]
    docs += ["Hello world", " ~~~", "a~b", "", " ", "\n", "\r\n", "x\u3000", "\u00a0\u00a0z", "tabs\tand\r\ncr"]
    size = sum(len(d.encode("utf-8")) for d in docs)
    while size < target_bytes:
        d = prose(rng, rng.randint(200, 12000))
        docs.append(d)
        size += len(d.encode("utf-8"))
    return docs


def corpus_size(docs: list[str]) -> int:
    return sum(len(d.encode("utf-8")) for d in docs)
