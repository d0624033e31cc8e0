"""`cedar serve` end to end: the official `openai` client and raw HTTP/SSE against the real binary.

The server runs the deterministic scripted backend (--fake-backend: a reasoning part, `</think>`, then
"Answer for seed S: N prompt tokens."), so every wire field can be checked against known text; the
engine-backed runs are in test_serve_engine.py. References: the OpenAI Python client's own parsing
(pydantic models), the DeepSeek wire contract (serving.md §4b), HTTP status codes.
"""
import http.client
import json
import signal
import socket
import threading
import time

import pytest

openai = pytest.importorskip("openai", reason="the openai client is pinned in requirements-test.txt")

from serve_util import CedarServer  # noqa: E402

MODEL = "deepseek-v4.1-flash"


@pytest.fixture(scope="module")
def server():
    with CedarServer(["--fake-backend", "--api-key", "k-test", "--context-length", "512"]) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="k-test", max_retries=0)


def raw_post(server, path, body, headers=None, key="k-test"):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    h = {"Content-Type": "application/json"}
    if key:
        h["Authorization"] = "Bearer " + key
    h.update(headers or {})
    conn.request("POST", path, body=body if isinstance(body, (bytes, str)) else json.dumps(body), headers=h)
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, dict(r.getheaders()), data


def sse(data: bytes):
    """(data payloads, comment count) of an SSE body."""
    payloads, comments = [], 0
    for ev in data.decode().split("\n\n"):
        if ev.startswith("data: "):
            payloads.append(ev[6:])
        elif ev.startswith(":"):
            comments += 1
    return payloads, comments


def test_models_have_context_length(client):
    models = client.models.list()
    ids = [m.id for m in models.data]
    assert MODEL in ids and "deepseek-v4-flash" in ids
    assert models.data[0].model_extra["context_length"] == 512


def test_chat_non_stream(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], seed=5)
    msg = r.choices[0].message
    assert msg.content == f"Answer for seed 5: {r.usage.prompt_tokens} prompt tokens."
    assert msg.model_extra["reasoning_content"] == "Thinking about seed 5."
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.prompt_tokens_details.cached_tokens == 0
    assert r.usage.model_extra["prompt_cache_hit_tokens"] == 0
    assert r.usage.model_extra["prompt_cache_miss_tokens"] == r.usage.prompt_tokens
    assert 0 < r.usage.completion_tokens_details.reasoning_tokens < r.usage.completion_tokens


def test_chat_stream_equals_non_stream(client):
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "Same seed"}], seed=11)
    whole = client.chat.completions.create(**kw)
    stream = client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    content, reasoning, finish, usage = "", "", None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for ch in chunk.choices:
            content += ch.delta.content or ""
            reasoning += (ch.delta.model_extra or {}).get("reasoning_content") or ""
            finish = ch.finish_reason or finish
    assert content == whole.choices[0].message.content
    assert reasoning == whole.choices[0].message.model_extra["reasoning_content"]
    assert finish == "stop"
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens


def test_chat_logprobs(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], logprobs=True,
                                       top_logprobs=3, seed=2)
    lp = r.choices[0].logprobs.content
    assert len(lp) == r.usage.completion_tokens
    assert all(len(t.top_logprobs) == 3 and t.logprob <= 0 for t in lp)
    assert "".join(bytes(t.bytes).decode("utf-8", "replace") for t in lp).endswith(r.choices[0].message.content)


def test_chat_tools_request_accepted_and_history_replay(client):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "weather",
                                                "parameters": {"type": "object",
                                                               "properties": {"city": {"type": "string"}}}}}]
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "Need the tool.",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    r = client.chat.completions.create(model=MODEL, messages=history, tools=tools, seed=1)
    assert r.choices[0].finish_reason in ("stop", "tool_calls")
    # `reasoning` is accepted as an input alias of reasoning_content.
    history[1] = dict(history[1])
    history[1]["reasoning"] = history[1].pop("reasoning_content")
    r2 = client.chat.completions.create(model=MODEL, messages=history, tools=tools, seed=1)
    assert r2.usage.prompt_tokens == r.usage.prompt_tokens


def test_deepseek_top_level_thinking_and_effort(server):
    for body, has_reasoning in (({"thinking": {"type": "disabled"}}, False),
                                ({"thinking": {"type": "enabled"}, "reasoning_effort": "max"}, True),
                                ({"reasoning_effort": "low"}, True)):
        req = {"model": MODEL, "messages": [{"role": "user", "content": "q"}], "stream": True,
               "stream_options": {"include_usage": True}, **body}
        status, headers, data = raw_post(server, "/v1/chat/completions", req,
                                         {"x-deepseek-harness-session-id": "sess-1"})
        assert status == 200, data
        assert headers["Content-Type"] == "text/event-stream"
        assert headers["x-request-id"].startswith("chatcmpl-")
        payloads, _ = sse(data)
        assert payloads[-1] == "[DONE]"
        chunks = [json.loads(p) for p in payloads[:-1]]
        first = chunks[0]["choices"][0]["delta"]
        assert first["role"] == "assistant"
        assert ("reasoning_content" in first) == has_reasoning
        finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
        assert [f for f in finishes if f] == ["stop"]
        usage = chunks[-1]["usage"]
        assert chunks[-1]["choices"] == []
        for key in ("prompt_tokens", "completion_tokens", "total_tokens", "prompt_cache_hit_tokens",
                    "prompt_cache_miss_tokens"):
            assert isinstance(usage[key], int)
        assert "cached_tokens" in usage["prompt_tokens_details"]
        assert "reasoning_tokens" in usage["completion_tokens_details"]


def test_completions_endpoint(client):
    r = client.completions.create(model=MODEL, prompt="Once upon", max_tokens=4, logprobs=2, seed=3)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 4
    assert len(r.choices[0].logprobs.tokens) == 4
    s = "".join(c.choices[0].text for c in client.completions.create(model=MODEL, prompt="Once upon", max_tokens=4,
                                                                     seed=3, stream=True))
    assert s == r.choices[0].text


def test_tokenize_detokenize_roundtrip(server):
    status, _, data = raw_post(server, "/tokenize", {"prompt": "héllo wörld", "add_special_tokens": False})
    assert status == 200
    toks = json.loads(data)["tokens"]
    status, _, data = raw_post(server, "/detokenize", {"tokens": toks})
    assert status == 200 and json.loads(data)["prompt"] == "héllo wörld"


@pytest.mark.parametrize("key,expected", [(None, 401), ("wrong", 401)])
def test_auth(server, key, expected):
    status, _, data = raw_post(server, "/v1/chat/completions",
                               {"messages": [{"role": "user", "content": "x"}]}, key=key)
    assert status == expected
    assert json.loads(data)["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize("body,status", [
    (b"{oops", 400),
    (b'{"messages": [{"role": "user", "content": "\xff"}]}', 400),
    (b'{"messages": "hello"}', 400),
    (b'{"messages": []}', 400),
    (b'{"messages": [{"role": "user", "content": "x"}], "temperature": "warm"}', 400),
    (b'{"messages": [{"role": "user", "content": "x"}], "n": 3}', 400),
    (b'{"messages": [{"role": "tool", "content": "x"}]}', 400),
    (b'{"messages": [{"role": "user", "content": "x"}], "model": "nope"}', 404),
])
def test_bad_requests(server, body, status):
    got, _, data = raw_post(server, "/v1/chat/completions", body)
    assert got == status, data
    err = json.loads(data)["error"]
    assert err["message"] and err["type"]


def test_unknown_fields_ignored_and_max_tokens_clamped(client):
    r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=256000,
                                       extra_body={"some_future_field": {"a": 1}})
    assert r.choices[0].finish_reason == "stop"


def test_context_overflow_is_400_with_clear_message(server):
    status, _, data = raw_post(server, "/v1/chat/completions",
                               {"messages": [{"role": "user", "content": " ".join(f"w{i}" for i in range(600))}]})
    assert status == 400
    err = json.loads(data)["error"]
    assert err["code"] == "context_length_exceeded"
    assert "maximum context length is 512" in err["message"]


def test_huge_body_is_413():
    with CedarServer(["--fake-backend", "--max-body-bytes", "10000"]) as s:
        status, _, data = raw_post(s, "/v1/chat/completions",
                                   {"messages": [{"role": "user", "content": "a" * 20000}]}, key=None)
        assert status == 413
        assert "error" in json.loads(data)


def test_overload_429_and_disconnect_cancels():
    with CedarServer(["--fake-backend", "--max-inflight", "1", "--fake-tick-ms", "20"]) as s:
        # A long stream holds the only slot; the client walks away after the first bytes.
        sock = socket.create_connection(("127.0.0.1", s.port))
        body = json.dumps({"messages": [{"role": "user", "content": "x"}], "stream": True, "max_tokens": 100000})
        sock.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
        assert sock.recv(100).startswith(b"HTTP/1.1 200")
        status, headers, _ = raw_post(s, "/v1/chat/completions", {"messages": [{"role": "user", "content": "y"}]},
                                      key=None)
        assert status == 429 and headers["Retry-After"] == "1"
        sock.close()
        deadline = time.time() + 10
        while time.time() < deadline and (s.metric("cedar_requests_inflight") > 0 or
                                           s.metric("cedar_requests_running") > 0):
            time.sleep(0.05)
        assert s.metric("cedar_requests_inflight") == 0
        assert s.metric("cedar_requests_running") == 0  # the backend freed the request
        status, _, _ = raw_post(s, "/v1/chat/completions", {"messages": [{"role": "user", "content": "y"}]}, key=None)
        assert status == 200


def test_sse_keepalive_during_slow_generation():
    with CedarServer(["--fake-backend", "--fake-tick-ms", "60", "--keepalive-ms", "20"]) as s:
        status, _, data = raw_post(s, "/v1/chat/completions",
                                   {"messages": [{"role": "user", "content": "x"}], "stream": True, "max_tokens": 3},
                                   key=None)
        payloads, comments = sse(data)
        assert status == 200 and comments > 0 and payloads[-1] == "[DONE]"


def test_metrics_prometheus_text(server, client):
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "m"}])
    _, text = server.get("/metrics")
    for name in ("cedar_requests_total", "cedar_prompt_tokens_total", "cedar_generation_tokens_total",
                 "cedar_time_to_first_token_seconds_bucket", "cedar_time_per_output_token_seconds_bucket",
                 "cedar_prefix_cache_hit_rate", "cedar_kv_cache_usage"):
        assert name in text
    assert server.metric("cedar_generation_tokens_total") > 0


def test_sigterm_drains_inflight_and_exits_0():
    s = CedarServer(["--fake-backend", "--fake-tick-ms", "10"])
    result = {}

    def call():
        result["r"] = raw_post(s, "/v1/chat/completions",
                               {"messages": [{"role": "user", "content": "x"}], "max_tokens": 8}, key=None)

    t = threading.Thread(target=call)
    t.start()
    deadline = time.time() + 5
    while time.time() < deadline and s.metric("cedar_requests_inflight") == 0:
        time.sleep(0.005)
    assert s.stop(signal.SIGTERM) == 0
    t.join()
    status, _, data = result["r"]
    assert status == 200 and json.loads(data)["choices"][0]["finish_reason"] == "length"
