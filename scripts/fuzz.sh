#!/usr/bin/env bash
# Builds the `fuzz` preset (clang + libFuzzer + ASan/UBSan) and runs every fuzz target for a bounded
# time on its seed corpus tests/fuzz/corpus/<target without _fuzz>/. New inputs go to the git-ignored
# tests/fuzz/corpus-work/; a crash leaves its reproducer in build/fuzz/crashes/ and fails the script.
#   scripts/fuzz.sh [SECONDS_PER_TARGET]   (default 30)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-30}"

# chat_request_fuzz tokenizes V4.1 prompts with the V4.1 tokenizer derived from the V4 one (stdlib Python).
[ -f third_party/downloads/deepseek-v41-derived/tokenizer.json ] || python3 tools/derive_v41_tokenizer.py

cmake --preset fuzz -G Ninja >/dev/null
cmake --build --preset fuzz -j "$(nproc)"

mkdir -p build/fuzz/crashes
status=0
for target in build/fuzz/tests/fuzz/*_fuzz; do
  [ -x "$target" ] || continue
  name="$(basename "$target")"
  corpus="tests/fuzz/corpus/${name%_fuzz}"
  work="tests/fuzz/corpus-work/${name%_fuzz}"
  mkdir -p "$work"
  echo "fuzz: running $name for ${seconds}s on $corpus"
  if "$target" -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="build/fuzz/crashes/${name}-" "$work" "$corpus" >"build/fuzz/${name}.log" 2>&1; then
    echo "fuzz: $name passed ($(grep -o 'stat::number_of_executed_units: *[0-9]*' "build/fuzz/${name}.log" | grep -o '[0-9]*$') runs)"
  else
    echo "fuzz: $name FAILED; last lines of build/fuzz/${name}.log:"
    tail -40 "build/fuzz/${name}.log"
    status=1
  fi
done
exit $status
