"""cedar reads checkpoints it did not write: tools/tiny_checkpoint.py (an independent Python writer of the
released format) writes tiny V4.1 / V4 checkpoints, quantized and --bf16, and

* `cedar inspect DIR --json` must report the weight-inventory check as passed, for the right architecture;
* `cedar tensors DIR --json` must list exactly the tensors Python wrote, with the same dtypes and shapes (the
  reference list comes from this suite's own header parser, safetensors_dir_reader.py).

A cedar binary that lacks either command FAILS these tests (naming the missing command): they are not
skipped. Binary: $CEDAR_BINARY, default <repo>/build/release/cedar.

JSON shapes accepted (the commands are specified elsewhere; the readers below accept the obvious forms):
* tensors: a list of {"name", "dtype", "shape"}, or {"tensors": that list}, or {"tensors": {name: {"dtype",
  "shape"}}} / {name: {"dtype", "shape"}};
* inspect: a boolean "inventory_ok" / "inventory_passed" / "inventory_complete", or an "inventory" entry
  anywhere in the document, either a boolean or an object with a verdict
  (`ok` / `passed` / `complete` / `valid` true, or `status` "ok"/"pass"/"passed"/"complete"/"valid") and, when
  present, empty `missing` / `unexpected` / `extra` / `mismatched` / `mismatches` / `errors` lists.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from safetensors_dir_reader import read_checkpoint

ROOT = pathlib.Path(__file__).resolve().parents[2]
BINARY = pathlib.Path(os.environ.get("CEDAR_BINARY", ROOT / "build" / "release" / "cedar"))
VARIANTS = [("deepseek_v41", False), ("deepseek_v41", True), ("deepseek_v4", False), ("deepseek_v4", True)]
_WRITTEN: dict = {}


def variant_id(v):
    return f"{v[0]}{'-bf16' if v[1] else ''}"


@pytest.fixture(params=VARIANTS, ids=variant_id)
def checkpoint(request, tmp_path_factory):
    """(arch, directory, {name: (dtype, shape)} as written) — each variant written once."""
    arch, bf16 = request.param
    if request.param not in _WRITTEN:
        out = tmp_path_factory.mktemp(variant_id(request.param))
        cmd = [sys.executable, str(ROOT / "tools" / "tiny_checkpoint.py"), str(out), "--arch", arch, "--seed", "3"]
        subprocess.run(cmd + (["--bf16"] if bf16 else []), check=True, capture_output=True, text=True)
        _, tensors = read_checkpoint(out)
        _WRITTEN[request.param] = (arch, out, {n: (t.dtype, list(t.shape)) for n, t in tensors.items()})
    return _WRITTEN[request.param]


def run_cedar_json(command: str, directory: pathlib.Path):
    if not BINARY.is_file():
        pytest.fail(f"cedar binary {BINARY} does not exist (build it, or set CEDAR_BINARY); "
                    f"needed for `cedar {command} DIR --json`")
    proc = subprocess.run([str(BINARY), command, str(directory), "--json"], capture_output=True, text=True,
                          timeout=300)
    if proc.returncode == 2 and "unknown command" in proc.stderr:
        pytest.fail(f"cedar binary {BINARY} has no `{command}` command yet (it answered: {proc.stderr.strip()!r}); "
                    f"this test needs `cedar {command} DIR --json`")
    if proc.returncode != 0:
        pytest.fail(f"`cedar {command} {directory} --json` exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError as e:
        pytest.fail(f"`cedar {command} --json` printed no valid JSON ({e}): {proc.stdout[:2000]!r}")


def find_key(doc, key):
    """First value stored under `key` anywhere in the document (depth first), or None."""
    if isinstance(doc, dict):
        if key in doc:
            return doc[key]
        children = doc.values()
    elif isinstance(doc, list):
        children = doc
    else:
        return None
    for child in children:
        found = find_key(child, key)
        if found is not None:
            return found
    return None


def strings_in(doc):
    if isinstance(doc, str):
        yield doc
    elif isinstance(doc, dict):
        for v in doc.values():
            yield from strings_in(v)
    elif isinstance(doc, list):
        for v in doc:
            yield from strings_in(v)


PROBLEM_KEYS = ("missing", "unexpected", "extra", "mismatched", "mismatches", "errors")


def inventory_verdict(doc) -> tuple[bool | None, dict]:
    for key in ("inventory_ok", "inventory_passed", "inventory_complete"):
        if isinstance(find_key(doc, key), bool):
            return find_key(doc, key), {}
    inv = find_key(doc, "inventory")
    if isinstance(inv, bool):
        return inv, {}
    if not isinstance(inv, dict):
        return None, {}
    problems = {k: inv[k] for k in PROBLEM_KEYS if inv.get(k)}
    for k in ("ok", "passed", "complete", "valid"):
        if isinstance(inv.get(k), bool):
            return inv[k], problems
    if isinstance(inv.get("status"), str):
        return inv["status"].lower() in ("ok", "pass", "passed", "complete", "valid"), problems
    return (not problems if any(k in inv for k in PROBLEM_KEYS) else None), problems


def test_cedar_inspect_passes_the_inventory_check(checkpoint):
    arch, directory, _ = checkpoint
    doc = run_cedar_json("inspect", directory)
    verdict, problems = inventory_verdict(doc)
    if verdict is None:
        top = list(doc) if isinstance(doc, dict) else type(doc).__name__
        pytest.fail(f"no inventory verdict in `cedar inspect --json` (top-level keys: {top}); see this file's "
                    f"docstring for the accepted shapes")
    assert verdict and not problems, f"inventory check failed for {directory.name}: {json.dumps(problems)[:4000]}"
    assert arch in set(strings_in(doc)), f"`cedar inspect --json` does not name the architecture {arch!r}"


def tensor_table(doc) -> dict[str, tuple[str, list[int]]]:
    items = doc.get("tensors", doc) if isinstance(doc, dict) else doc
    if isinstance(items, dict) and all(isinstance(v, dict) for v in items.values()):
        items = [{"name": k, **v} for k, v in items.items()]
    if not isinstance(items, list) or not all(isinstance(e, dict) and {"name", "dtype", "shape"} <= set(e)
                                              for e in items):
        pytest.fail(f"unrecognised `cedar tensors --json` output (see this file's docstring): {str(doc)[:1000]}")
    table = {}
    for e in items:
        assert e["name"] not in table, f"cedar lists {e['name']} twice"
        table[e["name"]] = (e["dtype"], [int(x) for x in e["shape"]])
    return table


def test_cedar_tensors_match_what_python_wrote(checkpoint):
    _, directory, written = checkpoint
    listed = tensor_table(run_cedar_json("tensors", directory))
    missing = sorted(set(written) - set(listed))
    extra = sorted(set(listed) - set(written))
    different = sorted(n for n in set(written) & set(listed) if written[n] != listed[n])
    assert not (missing or extra or different), (
        f"missing {len(missing)}: {missing[:8]}; extra {len(extra)}: {extra[:8]}; "
        f"different {len(different)}: {[(n, written[n], listed[n]) for n in different[:8]]}")
