"""Regenerates the seed corpora of the text fuzz targets from the published fixtures in tests/data/encoding:

* corpus/chat_request/: request bodies (the goldens' and deepseek-recipe's requests, the official cases'
  messages, an Anthropic Messages body), each after one policy byte;
* corpus/output_parser/ and corpus/response/: completions (fastllm's DSML cases, hand-written thinking /
  tool / JSON-mode texts), each after an options byte and a split-seed byte (the targets' sources say what
  the bytes mean; response_fuzz reads the options byte its own way, any byte is valid).

* corpus/tokenizer_load/: small tokenizer.json files in DeepSeek's format (its pre-tokenizer, decoder and
  added-token flags over a 256-byte vocabulary with a few merges), each after one unused byte
  (tokenizer_load_fuzz.cpp; needs third_party/downloads/deepseek-v4/tokenizer.json, tools/fetch_tokenizer.py).
* corpus/config/: the checkpoint configs of tests/data/configs (HF and reference-inference spellings), each
  after one unused byte (config_fuzz.cpp).

Small seeds on purpose: libFuzzer mutates them. Run: python3 tests/fuzz/make_text_corpus.py
"""
import json
import pathlib

HERE = pathlib.Path(__file__).parent
DATA = HERE.parent / "data" / "encoding"
MAX_BYTES = 4096  # scripts/fuzz.sh runs with -max_len=4096


def dump(obj) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode()


def write(directory: pathlib.Path, name: str, payload: bytes) -> None:
    if len(payload) <= MAX_BYTES:
        (directory / name).write_bytes(payload)


def chat_requests(out: pathlib.Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for i, case in enumerate(json.loads((DATA / "goldens.json").read_text())):
        write(out, f"golden_{i}", bytes([0x03 | (0x08 if case.get("thinking") else 0)]) + dump(case["request"]))
    rtp = json.loads((DATA / "rtp_recipe_fixtures.json").read_text())
    for i, case in enumerate(rtp["requests"]):
        write(out, f"rtp_{i}", bytes([0x03 | (0x08 if case.get("default_thinking") else 0)]) + dump(case["request"]))
    for i, case in enumerate(json.loads((DATA / "official_cases.json").read_text())):
        if "messages" not in case:  # the cases kept in files of their own are too large for a seed
            continue
        body = {"model": "deepseek-v4.1-flash", "messages": case["messages"]}
        if "reasoning_effort" in case:
            body["reasoning_effort"] = case["reasoning_effort"]
        write(out, f"official_{i}", bytes([0x03 | (0x08 if case.get("thinking") else 0)]) + dump(body))
    anthropic = {
        "model": "deepseek-v4.1-flash",
        "max_tokens": 64,
        "system": "You are terse.",
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "tools": [{"name": "get_weather", "description": "Weather of a city",
                   "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Call the tool."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"}]},
        ],
        "stop_sequences": ["\n\nHuman:"],
    }
    write(out, "anthropic_tools", bytes([0x03]) + dump(anthropic))
    completion = {"model": "x", "prompt": "Once upon", "max_tokens": 8, "logprobs": 2, "echo": True}
    write(out, "completion", bytes([0x03]) + dump(completion))


def completions(out: pathlib.Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for line in (DATA / "fastllm" / "deepseek_v4_dsml.jsonl").read_text().splitlines():
        case = json.loads(line)
        write(out, f"fastllm_{case['id']}", bytes([0x00, 0x05]) + case["raw_output"].encode())
    dsml = "｜DSML｜"
    tool = (f"<{dsml}tool_calls>\n<{dsml}invoke name=\"search\">\n"
            f"<{dsml}parameter name=\"q\" string=\"true\">cedar</{dsml}parameter>\n"
            f"<{dsml}parameter name=\"n\" string=\"false\">3</{dsml}parameter>\n"
            f"</{dsml}invoke>\n</{dsml}tool_calls>")
    texts = {
        # options byte: start (bits 0-2), json (8), no tools (16), 1017 dialect (32), length (64), stops (128)
        "thinking_then_tool": (0x01, "Let me look.</think>I will search." + tool),
        "thinking_no_close": (0x41, "Still thinking about it"),
        "content_stop": (0x80, "stop\0Hello world, stop here please."),
        "json_fenced": (0x08, "Here:\n```json\n{\"a\": [1, 2, {\"b\": \"c\"}]}\n```\nDone."),
        "json_raw_stop": (0x88, "]\0[1, 2, 3] trailing"),
        "forced_tool": (0x04, tool[len(f"<{dsml}tool_calls>\n"):]),
        "ns_tool": (0x20, tool.replace("\"search\"", "\"web::search\"")),
        "continuation": (0x03, "\n\nkept newlines</think>answer"),
    }
    for name, (options, text) in texts.items():
        write(out, name, bytes([options, 0x03]) + text.encode())


def configs(out: pathlib.Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for path in sorted((HERE.parent / "data" / "configs").glob("*/config.json")):
        write(out, path.parent.name, b"\x00" + path.read_bytes())


def byte_level(b: int) -> str:
    """GPT-2's byte -> printable character map (HF ByteLevel)."""
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    if b in printable:
        return chr(b)
    return chr(256 + [x for x in range(256) if x not in printable].index(b))


def tokenizers(out: pathlib.Path) -> None:
    real = HERE.parent.parent / "third_party" / "downloads" / "deepseek-v4" / "tokenizer.json"
    if not real.exists():
        return
    t = json.loads(real.read_text(encoding="utf-8"))
    out.mkdir(parents=True, exist_ok=True)
    vocab = {byte_level(b): b for b in range(256)}
    merges = [("t", "h"), ("th", "e"), ("Ġ", "t"), ("i", "n"), ("e", "r")]
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))
    for n_added in (0, 3):
        added = []
        for i, tok in enumerate(t["added_tokens"][:n_added]):
            added.append(dict(tok, id=len(vocab) + i))
        model = dict(t["model"], vocab=vocab, merges=[f"{a} {b}" for a, b in merges])
        small = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
                 "normalizer": t["normalizer"], "pre_tokenizer": t["pre_tokenizer"], "post_processor": None,
                 "decoder": t["decoder"], "model": model}
        write(out, f"small_{n_added}_added", b"\x00" + json.dumps(small, ensure_ascii=False, separators=(",", ":")).encode())


def main() -> None:
    chat_requests(HERE / "corpus" / "chat_request")
    completions(HERE / "corpus" / "output_parser")
    completions(HERE / "corpus" / "response")
    configs(HERE / "corpus" / "config")
    tokenizers(HERE / "corpus" / "tokenizer_load")


if __name__ == "__main__":
    main()
