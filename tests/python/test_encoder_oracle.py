"""cedar's prompt encoder against deepseek-recipe 0.2.0 (DeepSeek's own renderer) as a live oracle.

Random Chat Completions requests (tools, multi-turn tool loops with shuffled results, efforts, unicode,
images, latest_reminder, reasoning) must give byte-identical prompts, the same control/text split
(recipe's special_ranges vs cedar's segments) AND identical token ids (`cedar encode --ids` vs the
recipe's `DeepseekV41Encoding().with_tokenizer(...).encode(...)`; V4: `DeepseekV4Encoding`). Ids use
the V4.1 tokenizer.json derived from the V4 one (tools/derive_v41_tokenizer.py) and the V4 file itself.
Where the recipe departs from the official encoder (encoding.md §6.1) cedar follows the official
behaviour; those differences are pinned by explicit tests.
"""
import importlib.util
import json
import random

import pytest

import conversation_gen
from cedar_cli import REPO, encode_many

recipe = pytest.importorskip("deepseek_recipe", reason="deepseek-recipe==0.2.0 (requirements-test.txt) is required")

# The official encoder, its README and the transformers processor spell the image placeholder
# <｜deepseek_image｜> (id 129264, encoding.md §1); recipe 0.2.0 defaults to <｜image｜>, so it is configured
# to the official spelling (the difference is pinned by test_recipe_default_image_spelling_*).
IMAGE = "<｜deepseek_image｜>"
V4_TOKENIZER = REPO / "third_party" / "downloads" / "deepseek-v4" / "tokenizer.json"


@pytest.fixture(scope="module")
def v4_tokenizer():
    assert V4_TOKENIZER.exists(), f"{V4_TOKENIZER} missing: run tools/fetch_tokenizer.py (scripts/setup.sh does)"
    return V4_TOKENIZER


@pytest.fixture(scope="module")
def v41_tokenizer(v4_tokenizer, tmp_path_factory):
    spec = importlib.util.spec_from_file_location("derive_v41_tokenizer", REPO / "tools" / "derive_v41_tokenizer.py")
    derive = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(derive)
    path = tmp_path_factory.mktemp("v41") / "tokenizer.json"
    path.write_text(json.dumps(derive.derive(json.loads(v4_tokenizer.read_text(encoding="utf-8"))), ensure_ascii=False),
                    encoding="utf-8")
    return path


def recipe_conv(req, tokens):
    return recipe.ChatCompletionRequest(req).convert(recipe.ConversionOptions().with_special_tokens(tokens)).conversation


def recipe_encoding(v41, tokens, tokenizer=None):
    enc = (recipe.DeepseekV41Encoding() if v41 else recipe.DeepseekV4Encoding()).with_special_tokens(tokens)
    return enc.with_tokenizer(tokenizer) if tokenizer is not None else enc


def recipe_render(req, v41=True):
    tokens = recipe.SpecialTokens(image=IMAGE)
    return recipe_encoding(v41, tokens).render_conversation(recipe_conv(req, tokens))


def recipe_segments(rendered):
    p, segs, pos = rendered.prompt, [], 0
    for a, b in rendered.special_ranges:
        if a > pos:
            segs.append(["text", p[pos:a]])
        segs.append(["control", p[a:b]])
        pos = b
    if pos < len(p):
        segs.append(["text", p[pos:]])
    return segs


def compare(reqs, dialect, v41, tokenizer_path):
    """Prompt, segments and ids of every request the recipe accepts; both must reject the same ones."""
    ours = encode_many(reqs, dialect=dialect, extra=("--ids", "--tokenizer", str(tokenizer_path)))
    tokens = recipe.SpecialTokens(image=IMAGE)
    render = recipe_encoding(v41, tokens)
    encode = recipe_encoding(v41, tokens, recipe.Tokenizer.from_file(str(tokenizer_path)))
    compared = 0
    for req, got in zip(reqs, ours):
        try:
            conv = recipe_conv(req, tokens)
            ref = render.render_conversation(conv)
        except Exception as e:  # both must reject the same requests
            assert "error" in got, f"recipe rejected ({e}) but cedar accepted: {json.dumps(req)[:300]}"
            continue
        assert "error" not in got, f"cedar rejected ({got['error']}): {json.dumps(req)[:300]}"
        assert got["prompt"] == ref.prompt, json.dumps(req)
        assert got["segments"] == recipe_segments(ref), json.dumps(req)
        assert got["ids"] == encode.encode(conv), json.dumps(req)
        compared += 1
    return compared


def test_v41_random_conversations_match_recipe(v41_tokenizer):
    rng = random.Random(20260930)
    reqs = [conversation_gen.rand_request(rng) for _ in range(400)]
    assert compare(reqs, "v41", True, v41_tokenizer) >= 380


def test_v4_0731_random_conversations_match_recipe(v4_tokenizer):
    # The recipe's V4 renderer departs from the official one on float text, empty argument lists and
    # empty user parts; the generator avoids those here (they are pinned by the C++ golden tests).
    conversation_gen.FLOAT_ENUMS[0] = False
    try:
        rng = random.Random(731)
        reqs = []
        for _ in range(200):
            r = conversation_gen.rand_request(rng, allow_images=False, min_args=1, min_user_words=1)
            r["model"] = "DeepSeek-V4-Pro"
            reqs.append(r)
    finally:
        conversation_gen.FLOAT_ENUMS[0] = True
    assert compare(reqs, "v4-0731", False, v4_tokenizer) >= 190


# ---- where the recipe and the official encoder differ: cedar follows the official encoder ----------

def one(req, dialect="v41"):
    return encode_many([req], dialect=dialect)[0]


def test_empty_system_message_is_kept_like_the_official_encoder():
    req = {"model": "DeepSeek-V4.1-Flash", "thinking": {"type": "disabled"},
           "messages": [{"role": "system", "content": ""}, {"role": "user", "content": "U"}]}
    assert recipe_render(req).prompt == "<｜begin▁of▁sentence｜><｜User｜>U<｜Assistant｜></think>"
    assert one(req)["prompt"] == "<｜begin▁of▁sentence｜><｜System｜><｜User｜>U<｜Assistant｜></think>"


def test_tool_schema_is_the_whole_function_object():
    fn = {"name": "f", "parameters": {"type": "object", "properties": {}}, "strict": True}
    req = {"model": "DeepSeek-V4.1-Flash", "thinking": {"type": "disabled"}, "tools": [{"type": "function", "function": fn}],
           "messages": [{"role": "user", "content": "U"}]}
    line = json.dumps(fn, ensure_ascii=False)
    assert line in one(req)["prompt"]
    assert line not in recipe_render(req).prompt  # recipe adds description "" and normalizes strict schemas


def test_integer_reasoning_effort_is_accepted_for_v41():
    req = {"model": "DeepSeek-V4.1-Flash", "reasoning_effort": 37, "messages": [{"role": "user", "content": "U"}]}
    with pytest.raises(Exception):
        recipe_render(req)
    assert "Reasoning Effort: 37 (range 1-100" in one(req)["prompt"]


def test_recipe_default_image_spelling_is_not_the_official_token(v41_tokenizer):
    """encoding.md §1: 129264 is <｜deepseek_image｜> (official encoder + README, transformers image_token_id,
    RTP-RECIPE's content-block fixture). recipe 0.2.0 spells its image placeholder <｜image｜> by default
    while exporting IMAGE_SPECIAL_TOKEN_ID = 129264; in the V4-lineage tokenizer.json <｜image｜> is another,
    `special` token (129279), so the recipe's default ids put 129279 where the model expects 129264."""
    req = {"model": "DeepSeek-V4.1-Flash", "thinking": {"type": "disabled"},
           "messages": [{"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                                      {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]}
    tk = recipe.Tokenizer.from_file(str(v41_tokenizer))
    default = recipe.SpecialTokens()
    assert default.token(recipe.SpecialToken.Image) == "<｜image｜>"
    assert recipe.IMAGE_SPECIAL_TOKEN_ID == 129264
    recipe_default_ids = recipe_encoding(True, default, tk).encode(recipe_conv(req, default))
    ours = encode_many([req], extra=("--ids", "--tokenizer", str(v41_tokenizer)))[0]
    assert IMAGE in ours["prompt"] and "<｜image｜>" not in ours["prompt"]
    assert 129264 in ours["ids"] and 129279 not in ours["ids"]
    assert 129279 in recipe_default_ids and 129264 not in recipe_default_ids
    # Everything else is the same; with the official spelling configured the recipe agrees exactly.
    assert [129264 if i == 129279 else i for i in recipe_default_ids] == ours["ids"]
    official = recipe.SpecialTokens(image=IMAGE)
    assert recipe_encoding(True, official, tk).encode(recipe_conv(req, official)) == ours["ids"]


def test_encode_ids_cli(v41_tokenizer, v4_tokenizer):
    """Plain --ids output; a V4.1 prompt needs <｜System｜>, which the V4 tokenizer.json lacks."""
    from cedar_cli import run_cedar
    req = json.dumps({"model": "m", "reasoning_effort": 37, "messages": [{"role": "user", "content": "<｜User｜>"}]})
    proc = run_cedar(["encode", "--ids", "--tokenizer", str(v41_tokenizer)], req)
    assert proc.returncode == 0, proc.stderr.decode()
    ids = [int(x) for x in proc.stdout.split()]
    assert ids[:2] == [0, 128799] and ids[-1] == 128821
    assert [30, 28217, 6756, 28217, 32] == ids[-7:-2]  # user text "<｜User｜>" stays five BPE tokens
    proc = run_cedar(["encode", "--ids", "--tokenizer", str(v4_tokenizer)], req)
    assert proc.returncode == 1 and "<｜System｜>" in proc.stderr.decode()
    assert run_cedar(["encode", "--ids"], req).returncode == 2
