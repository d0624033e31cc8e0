"""Generated-request fuzzer for `cedar serve` (--fake-backend): thousands of mutated chat / completion /
messages / tokenize bodies (type swaps, deletions, out-of-range numbers, odd Unicode and invalid bytes,
deep nesting, huge arrays). Every answer must be a well-formed HTTP response with status 200 or a 4xx
and an error body; never a 5xx, a hang, or a dead server. Seeded, so a failure replays.
"""
import http.client
import json
import random

import pytest

from serve_util import CedarServer

VALID_CHAT = {
    "model": "deepseek-v4.1-flash",
    "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
                 {"role": "assistant", "content": "", "reasoning_content": "r",
                  "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                 {"role": "tool", "tool_call_id": "c1", "content": "out"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "thinking": {"type": "enabled"}, "reasoning_effort": "high", "max_tokens": 8, "temperature": 0.7,
    "top_p": 0.9, "seed": 1, "stop": ["x"], "stream": False, "logprobs": True, "top_logprobs": 2,
}
VALID_COMPLETION = {"model": "deepseek-v4.1-flash", "prompt": "abc", "max_tokens": 4, "logprobs": 1, "echo": True}
VALID_MESSAGES = {"model": "deepseek-v4.1-flash", "max_tokens": 8, "system": "s",
                  "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}
ODD_VALUES = [None, True, False, 0, -1, 2**63, -2**63, 1e308, -1e-308, 1.5, "", "x", "\u0000", "\ud7ff",
              "<｜User｜>", "<｜DSML｜ calls>", "</think>", [], [1], {}, {"a": None}, "a" * 5000]


def mutate(value, rng, depth=0):
    r = rng.random()
    if r < 0.15:
        return rng.choice(ODD_VALUES)
    if isinstance(value, dict) and value:
        out = dict(value)
        key = rng.choice(list(out))
        op = rng.random()
        if op < 0.3:
            del out[key]
        elif op < 0.4:
            out[rng.choice(["unknown", "n", "stream_options", "response_format", "tool_choice"])] = \
                rng.choice(ODD_VALUES)
        else:
            out[key] = mutate(out[key], rng, depth + 1)
        return out
    if isinstance(value, list) and value:
        out = list(value)
        i = rng.randrange(len(out))
        op = rng.random()
        if op < 0.2:
            del out[i]
        elif op < 0.3:
            out.append(rng.choice(out))
        else:
            out[i] = mutate(out[i], rng, depth + 1)
        return out
    return rng.choice(ODD_VALUES)


def raw_bodies(rng):
    yield b""
    yield b"null"
    yield b"[" * 100000 + b"]" * 100000
    yield b'{"messages": [' + b'{"role": "user", "content": "x"},' * 20000 + b'{"role": "user", "content": "y"}]}'
    yield b'{"messages": [{"role": "user", "content": "\xc3\x28"}]}'
    yield b'{"messages": [{"role": "user", "content": "\\ud800"}]}'
    for _ in range(20):
        yield bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))


@pytest.fixture(scope="module")
def server():
    with CedarServer(["--fake-backend", "--context-length", "4096", "--max-body-bytes", "2000000"]) as s:
        yield s


def post(server, path, body):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, data


def check(status, data, what):
    assert status < 500, f"{what} -> {status} {data[:300]!r}"
    if status != 200:
        err = json.loads(data)["error"]
        assert isinstance(err["message"], str) and err["message"], what


@pytest.mark.parametrize("path,valid", [("/v1/chat/completions", VALID_CHAT), ("/v1/completions", VALID_COMPLETION),
                                        ("/v1/messages", VALID_MESSAGES), ("/tokenize", VALID_CHAT)])
def test_mutated_bodies_never_5xx(server, path, valid):
    rng = random.Random(hash(path) & 0xFFFF)
    status, data = post(server, path, json.dumps(valid))
    assert status == 200, data
    for i in range(150):
        body = valid
        for _ in range(rng.randrange(1, 4)):
            body = mutate(body, rng)
        text = json.dumps(body, ensure_ascii=rng.random() < 0.5)
        check(*post(server, path, text.encode("utf-8", "surrogatepass")), f"{path} #{i}: {text[:200]}")


def test_raw_bytes_never_5xx(server):
    rng = random.Random(7)
    for i, body in enumerate(raw_bodies(rng)):
        for path in ("/v1/chat/completions", "/v1/messages", "/detokenize"):
            check(*post(server, path, body), f"{path} raw #{i}: {body[:80]!r}")
    status, _ = post(server, "/v1/chat/completions", json.dumps(VALID_CHAT))
    assert status == 200  # still alive and serving
