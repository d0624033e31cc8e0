"""cedar's JSON writer against Python's json.dumps on random values (encoding.md §2.7)."""
import json
import random
import struct

from cedar_cli import run_cedar

ALPHABET = ["a", "Z", "0", " ", '"', "\\", "/", "\n", "\r", "\t", "\b", "\f", "\x00", "\x01", "\x1f", "\x7f",
            "\x80", "é", "中", "文", "｜", "▁", "\u2028", "\ufeff", "🙂", "𝄞", "<", ">", "&", "'"]


def rand_float(rng):
    kind = rng.randrange(6)
    if kind == 0:
        return struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
    if kind == 1:
        return rng.choice([0.0, -0.0, 0.1, 0.0001, 1e-05, 1e-06, 1e-09, 1e16, 1e20, 1e15, 123456789012345678.0,
                           5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 100.0, 1.5, -2.5e-7, 9.999999999999999e15])
    if kind == 2:
        return rng.uniform(-1000, 1000)
    if kind == 3:
        return float(rng.randint(-10**6, 10**6))
    if kind == 4:
        return rng.random() * 10 ** rng.randint(-30, 30)
    return round(rng.uniform(-10, 10), rng.randint(0, 6))


def rand_value(rng, depth=0):
    kinds = ["int", "float", "str", "bool", "null"] + (["list", "dict"] * 2 if depth < 4 else [])
    k = rng.choice(kinds)
    if k == "int":
        return rng.choice([0, -1, 1, 2**63 - 1, -(2**63), rng.randint(-10**12, 10**12)])
    if k == "float":
        f = rand_float(rng)
        return f if f == f and abs(f) != float("inf") else 0.5
    if k == "str":
        return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 12)))
    if k == "bool":
        return rng.random() < 0.5
    if k == "null":
        return None
    if k == "list":
        return [rand_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    d = {}
    for _ in range(rng.randint(0, 4)):
        d["".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 6)))] = rand_value(rng, depth + 1)
    return d


def dumps_via_cedar(values, extra=(), sep="\n"):
    inp = "".join(json.dumps(v) + "\n" for v in values)  # ASCII-escaped input exercises the reader too
    proc = run_cedar(["pyjson", *extra], inp)
    assert proc.returncode == 0, proc.stderr.decode()
    out = proc.stdout.decode("utf-8")
    parts = out.split(sep)
    assert parts[-1] in ("", "\n")
    return parts[:-1] if sep == "\n" else [p.lstrip("\n") if i else p for i, p in enumerate(parts[:-1])]


def test_random_values_match_json_dumps():
    rng = random.Random(1234)
    values = [rand_value(rng) for _ in range(3000)]
    got = dumps_via_cedar(values)
    for v, g in zip(values, got):
        assert g == json.dumps(v, ensure_ascii=False), v


def test_random_values_match_json_dumps_ensure_ascii():
    rng = random.Random(99)
    values = [rand_value(rng) for _ in range(1000)]
    got = dumps_via_cedar(values, ["--ensure-ascii"])
    for v, g in zip(values, got):
        assert g == json.dumps(v), v


def test_indent_matches_json_dumps():
    rng = random.Random(7)
    values = [rand_value(rng) for _ in range(300)]
    got = dumps_via_cedar(values, ["--indent", "2"], sep="\x1e\n")
    for v, g in zip(values, got):
        assert g == json.dumps(v, ensure_ascii=False, indent=2), v


def test_float_golden_from_spec():
    # RTP-RECIPE golden quoted in encoding.md §2.7.
    src = '{"z": {"type": "number", "enum": [0.0, -0.0, 0.0001, 1e-05, 1e-06, 1e-09, 1e+16, 1e+20]}, "a": {"description": "quote: \\"", "type": "string"}}'
    got = dumps_via_cedar([json.loads(src)])
    assert got[0] == src


def test_duplicate_keys_keep_first_position_last_value():
    proc = run_cedar(["pyjson"], '{"a": 1, "b": 2, "a": 3}\n')
    assert proc.stdout.decode() == json.dumps(json.loads('{"a": 1, "b": 2, "a": 3}')) + "\n"
