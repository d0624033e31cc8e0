"""Random Chat Completions requests for oracle tests (tools, multi-turn, efforts, unicode, tool results,
reasoning, images, latest_reminder)."""
import json
import random

WORDS = ["hello", "world", "中文", "日本語", "naïve", "🙂", "a<b", "x & y", "\"quoted\"", "back\\slash", "tab\t",
         "line\nbreak", "  spaced  ", "1234567", "3.14", "</tool_result>", "{json}", "[1, 2]", "｜", "∑", "\u00e9"]


def text(rng, lo=0, hi=6):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


FLOAT_ENUMS = [True]  # the recipe's V4 renderer writes 1e-05 as 0.00001 (official: Python repr)


def rand_schema(rng, depth=0):
    t = rng.choice(["string", "integer", "number", "boolean", "array", "object"] if depth < 2 else ["string", "integer"])
    s = {"type": t}
    if rng.random() < 0.5:
        s["description"] = text(rng, 1, 4)
    if t == "number" and rng.random() < 0.4 and FLOAT_ENUMS[0]:
        s["enum"] = [0.0, -0.0, 1e-05, 1e16, 2.5, 100.0]
    if t == "array":
        s["items"] = rand_schema(rng, depth + 1)
    if t == "object":
        s["properties"] = {f"p{i}": rand_schema(rng, depth + 1) for i in range(rng.randint(0, 3))}
    return s


def rand_tool(rng, i):
    props = {f"arg_{k}": rand_schema(rng) for k in range(rng.randint(0, 4))}
    params = {"type": "object", "properties": props}
    if props and rng.random() < 0.5:
        params["required"] = list(props)[:1]
    return {"type": "function", "function": {"name": f"tool_{i}", "description": text(rng, 1, 5), "parameters": params}}


def rand_value(rng, depth=0):
    k = rng.choice(["s", "s", "i", "f", "b", "n", "l", "d"] if depth < 2 else ["s", "i"])
    if k == "s":
        return text(rng, 0, 3)
    if k == "i":
        return rng.randint(-1000, 10**6)
    if k == "f":
        return rng.choice([0.5, -0.0, 1e-05, 1e16, 2.25, 100.0, 0.1] if FLOAT_ENUMS[0] else [0.5, 2.25, 100.0])
    if k == "b":
        return rng.random() < 0.5
    if k == "n":
        return None
    if k == "l":
        return [rand_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {f"k{j}": rand_value(rng, depth + 1) for j in range(rng.randint(0, 3))}


def rand_args(rng, min_args=0):
    args = {f"arg_{k}": rand_value(rng) for k in range(rng.randint(min_args, 3))}
    compact = rng.random() < 0.5
    return json.dumps(args, ensure_ascii=rng.random() < 0.3, separators=(",", ":") if compact else None)


def rand_user_content(rng, allow_images, min_words=0):
    if allow_images and rng.random() < 0.25:
        parts = []
        for _ in range(rng.randint(1, 3)):
            if rng.random() < 0.4:
                parts.append({"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}})
            else:
                parts.append({"type": "text", "text": text(rng, 1, 4)})
        return parts
    return text(rng, min_words, 8)


def rand_request(rng, *, allow_images=True, allow_latest_reminder=True, efforts=("low", "high", "max", "minimal", "medium", "xhigh", None),
                 min_args=0, min_user_words=0):
    """min_args / min_user_words avoid two spots where the recipe's V4 renderer departs from the official
    encoder (empty-argument invokes, empty user parts)."""
    req = {"model": "DeepSeek-V4.1-Flash", "messages": []}
    msgs = req["messages"]
    with_tools = rng.random() < 0.5
    if with_tools:
        req["tools"] = [rand_tool(rng, i) for i in range(rng.randint(1, 3))]
    mode = rng.choice(["enabled", "disabled", None])
    if mode:
        req["thinking"] = {"type": mode}
    eff = rng.choice(efforts)
    if eff is not None and mode != "disabled":
        req["reasoning_effort"] = eff
    if rng.random() < 0.6:
        msgs.append({"role": "system", "content": text(rng, 1, 6)})
    if allow_latest_reminder and rng.random() < 0.15:
        msgs.append({"role": "latest_reminder", "content": "2026-09-30, Tuesday"})
    n_turns = rng.randint(1, 4)
    for turn in range(n_turns):
        msgs.append({"role": "user", "content": rand_user_content(rng, allow_images, min_user_words)})
        if rng.random() < 0.2:
            msgs.append({"role": "user", "content": text(rng, 1, 3)})
        last = turn == n_turns - 1
        if last and rng.random() < 0.7:
            break
        # assistant turn(s), possibly a tool loop
        for _loop in range(rng.randint(1, 3)):
            a = {"role": "assistant", "content": text(rng, 0, 6)}
            if rng.random() < 0.7:
                a["reasoning_content"] = text(rng, 0, 6)
            calls = []
            if with_tools and rng.random() < 0.6:
                for c in range(rng.randint(1, 3)):
                    calls.append({"id": f"call_{turn}_{_loop}_{c}", "type": "function",
                                  "function": {"name": rng.choice(req["tools"])["function"]["name"], "arguments": rand_args(rng, min_args)}})
                a["tool_calls"] = calls
            msgs.append(a)
            if not calls:
                break
            order = list(range(len(calls)))
            rng.shuffle(order)
            for k in order:
                msgs.append({"role": "tool", "tool_call_id": calls[k]["id"], "content": text(rng, 0, 5)})
    return req
