#!/usr/bin/env bash
# Runs every test: the C++ suite (release and ASan+UBSan builds) through ctest, then pytest.
# Prints one closing line "tests: N passed, N failed, N skipped" over all runners.
set -uo pipefail
cd "$(dirname "$0")/.."
jobs="$(nproc)"
status=0
passed=0; failed=0; skipped=0

run_ctest() {  # $1 = preset
  local preset="$1" log
  log="$(mktemp)"
  cmake --preset "$preset" -G Ninja >/dev/null && cmake --build --preset "$preset" -j "$jobs" || { status=1; failed=$((failed+1)); return; }
  ctest --preset "$preset" -j "$jobs" 2>&1 | tee "$log"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  local total nfail nskip
  total=$(sed -n 's/.*tests passed, \([0-9]*\) tests failed out of \([0-9]*\).*/\2/p' "$log" | tail -1)
  nfail=$(sed -n 's/.*tests passed, \([0-9]*\) tests failed out of.*/\1/p' "$log" | tail -1)
  nskip=$(grep -c '\*\*\*Skipped\| Skipped ' "$log" || true)
  total=${total:-0}; nfail=${nfail:-0}
  passed=$((passed + total - nfail - nskip)); failed=$((failed + nfail)); skipped=$((skipped + nskip))
  rm -f "$log"
}

run_ctest release
if [ "${CEDAR_SKIP_ASAN:-0}" != "1" ]; then run_ctest asan; else echo "ASan run skipped: CEDAR_SKIP_ASAN=1"; fi

if [ -x .venv/bin/python ]; then
  log="$(mktemp)"
  CEDAR_BINARY="$PWD/build/release/cedar" .venv/bin/python -m pytest -q -rs tests/python 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || status=1
  p=$(grep -Eo '[0-9]+ passed' "$log" | tail -1 | cut -d' ' -f1); f=$(grep -Eo '[0-9]+ failed' "$log" | tail -1 | cut -d' ' -f1)
  s=$(grep -Eo '[0-9]+ skipped' "$log" | tail -1 | cut -d' ' -f1); e=$(grep -Eo '[0-9]+ errors?' "$log" | tail -1 | cut -d' ' -f1)
  passed=$((passed + ${p:-0})); failed=$((failed + ${f:-0} + ${e:-0})); skipped=$((skipped + ${s:-0}))
  rm -f "$log"
else
  echo "pytest not run: .venv missing (run scripts/setup.sh first)"; status=1; failed=$((failed+1))
fi

# Bounded libFuzzer run of every fuzz target (needs clang); counted as one test.
if command -v clang++ >/dev/null; then
  if scripts/fuzz.sh "${CEDAR_FUZZ_SECONDS:-20}"; then passed=$((passed+1)); else failed=$((failed+1)); status=1; fi
else
  echo "fuzz not run: clang++ not found"; skipped=$((skipped+1))
fi

# The CUDA backend must compile without a GPU. Its tests run here too: the host-only ones (layouts, options,
# plans) pass or fail, and every test that needs a GPU skips and prints why; the parity tests run on the device.
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
  if cmake --preset cuda -G Ninja >/dev/null &&
     cmake --build --preset cuda -j "$jobs" --target cedar_cuda cedar cedar_cuda_tests; then
    echo "cuda build: passed"; passed=$((passed+1))
    log="$(mktemp)"
    ./build/cuda/tests/cedar_cuda_tests 2>&1 | tee "$log" | grep -E '^\[  (PASSED|FAILED|SKIPPED) *\] [0-9]+ test|^\[  SKIP +\]' | sort | uniq -c
    rc=${PIPESTATUS[0]}
    p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) tests\?\..*/\1/p' "$log" | tail -1)
    f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) tests\?, listed below.*/\1/p' "$log" | tail -1)
    s=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) tests\?, listed below.*/\1/p' "$log" | tail -1)
    if [ "$rc" != 0 ] && [ -z "$f" ]; then f=1; fi  # a crash or a failure the summary did not count
    [ "$rc" = 0 ] || status=1
    echo "cuda tests (no GPU here: host-only tests run, the others skip): ${p:-0} passed, ${f:-0} failed, ${s:-0} skipped"
    passed=$((passed + ${p:-0})); failed=$((failed + ${f:-0})); skipped=$((skipped + ${s:-0}))
    rm -f "$log"
  else
    echo "cuda build: FAILED"; failed=$((failed+1)); status=1
  fi
else
  echo "cuda build not run: nvcc not found"; skipped=$((skipped+1))
fi

echo "tests: ${passed} passed, ${failed} failed, ${skipped} skipped"
exit $status
