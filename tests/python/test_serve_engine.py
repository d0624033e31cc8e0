"""`cedar serve` on the embedded default model (the real engine, tiny checkpoint): the official openai
client, streaming == non-streaming for the same seed, logprobs, and cancellation on disconnect.
"""
import json
import socket
import time
import urllib.request

import pytest

openai = pytest.importorskip("openai", reason="the openai client is pinned in requirements-test.txt")

from serve_util import CedarServer  # noqa: E402

MODEL = "deepseek-v4.1-flash"


@pytest.fixture(scope="module")
def server():
    with CedarServer(["--threads", "2", "--max-running", "8"], timeout_s=300) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="none", max_retries=0)


def test_models_report_the_models_context(client):
    m = client.models.list().data[0]
    assert m.model_extra["context_length"] > 0


@pytest.mark.parametrize("thinking", ["enabled", "disabled"])
def test_stream_equals_non_stream_same_seed(client, thinking):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Hello there"}], seed=1234, max_tokens=12,
              temperature=1.0, extra_body={"thinking": {"type": thinking}})
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    assert a.choices[0].message.content == b.choices[0].message.content  # same seed, same output
    content, reasoning, finish, usage = "", "", None, None
    for chunk in client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}):
        if chunk.usage:
            usage = chunk.usage
        for ch in chunk.choices:
            content += ch.delta.content or ""
            reasoning += (ch.delta.model_extra or {}).get("reasoning_content") or ""
            finish = ch.finish_reason or finish
    assert content == a.choices[0].message.content
    assert reasoning == (a.choices[0].message.model_extra.get("reasoning_content") or "")
    assert finish == a.choices[0].finish_reason and finish in ("stop", "length", "tool_calls")
    assert usage.completion_tokens == a.usage.completion_tokens
    assert usage.prompt_tokens == a.usage.prompt_tokens


def test_logprobs_and_max_tokens(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=5,
                                       logprobs=True, top_logprobs=2, seed=3,
                                       extra_body={"thinking": {"type": "disabled"}})
    assert r.usage.completion_tokens <= 5
    lp = r.choices[0].logprobs.content
    assert len(lp) == r.usage.completion_tokens
    for t in lp:
        assert t.logprob <= 0 and len(t.top_logprobs) == 2
        assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob


def test_completions_greedy_is_deterministic(client):
    a = client.completions.create(model=MODEL, prompt="The sky is", max_tokens=8, temperature=0)
    b = client.completions.create(model=MODEL, prompt="The sky is", max_tokens=8, temperature=0)
    assert a.choices[0].text == b.choices[0].text
    assert a.usage.completion_tokens == b.usage.completion_tokens


def test_disconnect_cancels_generation(server):
    sock = socket.create_connection(("127.0.0.1", server.port))
    body = json.dumps({"messages": [{"role": "user", "content": "go"}], "stream": True, "max_tokens": 100000,
                       "ignore_eos": True})
    sock.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
    assert sock.recv(100).startswith(b"HTTP/1.1 200")
    time.sleep(0.3)
    sock.close()
    deadline = time.time() + 30
    while time.time() < deadline and (server.metric("cedar_requests_inflight") > 0 or
                                       server.metric("cedar_requests_running") > 0):
        time.sleep(0.1)
    assert server.metric("cedar_requests_inflight") == 0
    assert server.metric("cedar_requests_running") == 0
    assert server.metric("cedar_kv_cache_used_bytes") == 0


def test_repeated_prompt_reports_cached_tokens_in_usage(server, client):
    """The engine's prefix cache: the second identical request reports all full 64-token blocks of its
    prompt but the one holding the last token as cached, in OpenAI and DeepSeek usage fields, streamed
    and not, and in Anthropic's cache_read_input_tokens."""
    text = " ".join(f"word{i}" for i in range(120))  # a few hundred tokens
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Repeat after me: " + text}], max_tokens=3,
              temperature=0, extra_body={"thinking": {"type": "disabled"}})
    client.chat.completions.create(**kw)
    r = client.chat.completions.create(**kw)
    n = r.usage.prompt_tokens
    expected = (n - 1) // 64 * 64
    assert expected >= 128
    assert r.usage.prompt_tokens_details.cached_tokens == expected
    assert r.usage.model_extra["prompt_cache_hit_tokens"] == expected
    assert r.usage.model_extra["prompt_cache_miss_tokens"] == n - expected
    usage = None
    for chunk in client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}):
        usage = chunk.usage or usage
    assert usage.prompt_tokens_details.cached_tokens == expected
    body = {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": "Repeat after me: " + text}]}
    for _ in range(2):
        req = urllib.request.Request(server.base_url + "/v1/messages", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            msg = json.loads(resp.read())
    assert msg["usage"]["cache_read_input_tokens"] > 0
    assert msg["usage"]["input_tokens"] + msg["usage"]["cache_read_input_tokens"] >= expected
    assert server.metric("cedar_prefix_cache_enabled") == 1
    assert server.metric("cedar_prefix_cache_hit_tokens_total") >= 2 * expected
    assert server.metric("cedar_prefix_cache_index_bytes") > 0
    assert server.metric("cedar_swa_pool_entries") > 0
