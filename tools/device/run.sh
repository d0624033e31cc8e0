#!/usr/bin/env bash
# Runs on the lent H200 machine from the repository root (tools/device/pack.sh made .dev/pack.tar.xz).
# Env: BENCH=1 [BENCH_ARGS] [BENCH_TIMEOUT] [BENCH2_ARGS: a second bench], TESTS=1 [TEST_TIMEOUT] with an
# optional gtest filter as $1, KBENCH=1 [KBENCH_ARGS], DOCTOR=1, NCU=1 [NCU_ARGS: ncu's kernel filter, default the
# packed MoE GEMV's first 12 launches; NCU_KBENCH_ARGS] (Nsight Compute on cuda_kernels_bench --once: ncu_details$TAG.txt
# and ncu_source$TAG.csv.xz for tools/device/ncu_sass_summary.py). Outputs land in $OUT (bench.txt, tests.log).
# PACK=FILE runs another bundle than .dev/pack.tar.xz and TAG=NAME suffixes the output files (bench$TAG.txt, ...):
# builds A/B in one device call (run.sh once per bundle; a bundle of binaries alone keeps the libraries of the
# one before it, so the others can be small: `tar -cJf .dev/packB.tar.xz -C DIR bin`).
# Benches run line-buffered (stdbuf), so a bench cut by its timeout keeps the rows it printed.
set -u
cd "$(dirname "$0")/.."
T=${TAG:-}
rm -rf /tmp/dev/bin && mkdir -p /tmp/dev && tar -xJf "${PACK:-.dev/pack.tar.xz}" -C /tmp/dev
B=/tmp/dev/bin
export LD_LIBRARY_PATH=/tmp/dev/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$OUT"
# At most 8 files come back from $OUT (the device README): the clocks and make-tiny's log stay in /tmp/dev.
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv | tee "/tmp/dev/gpu$T.txt"
CEDAR_CUPTI=$(find / -name 'libcupti.so.13*' -not -path '/proc/*' 2>/dev/null | head -1)
export CEDAR_CUPTI  # cedar bench --timeline loads CUPTI from here
make_perf() {  # the perf checkpoint the bench and doctor read (kept across bundles of one call)
  [ -d /tmp/perf ] || $B/cedar make-tiny /tmp/perf --profile perf --threads 16 --no-tokenizer > /tmp/dev/make.txt 2>&1 ||
    tail -5 /tmp/dev/make.txt
}
if [ "${BENCH:-0}" = 1 ]; then
  t0=$(date +%s)
  make_perf
  timeout "${BENCH_TIMEOUT:-400}" stdbuf -oL -eL $B/cedar bench /tmp/perf --device cuda --threads 16 ${BENCH_ARGS:-} > "$OUT/bench$T.txt" 2>&1
  echo "bench rc=$? after $(($(date +%s) - t0)) s"
  grep -E "tpot|^ +[18] |A/B|layer 2[01] of|CED|exact|error" "$OUT/bench$T.txt" | head -80
  if [ -n "${BENCH2_ARGS:-}" ]; then
    timeout "${BENCH_TIMEOUT:-400}" stdbuf -oL -eL $B/cedar bench /tmp/perf --device cuda --threads 16 $BENCH2_ARGS > "$OUT/bench2$T.txt" 2>&1
    echo "bench2 rc=$?"
    grep -E "^ +[18] |layer 2[01] of|error" "$OUT/bench2$T.txt" | head -20
  fi
fi
if [ "${TESTS:-0}" = 1 ]; then
  timeout "${TEST_TIMEOUT:-300}" $B/cedar_cuda_tests ${1:+--gtest_filter=$1} > "$OUT/tests$T.log" 2>&1
  rc=$?
  echo "tests rc=$rc"
  grep -E "^\[  (PASSED|FAILED) |FAILED|Failure" "$OUT/tests$T.log" | head -40
  # A timeout (124) prints no summary: the last test that started says where it stopped.
  [ "$rc" = 0 ] || grep -E "^\[ RUN|^\[       OK" "$OUT/tests$T.log" | tail -2
fi
if [ "${KBENCH:-0}" = 1 ]; then
  timeout 200 $B/cuda_kernels_bench ${KBENCH_ARGS:-} > "$OUT/kbench$T.txt" 2>&1
  echo "kbench rc=$?"
  tail -40 "$OUT/kbench$T.txt"
fi
if [ "${DOCTOR:-0}" = 1 ]; then
  make_perf
  $B/cedar doctor /tmp/perf > "$OUT/doctor$T.txt" 2>&1
  echo "doctor rc=$?"
  tail -15 "$OUT/doctor$T.txt"
fi
if [ "${NCU:-0}" = 1 ]; then
  NCU_BIN=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  # --set full replays each kernel ~40 times at base clocks: durations there are not the benchmark's.
  timeout 400 "$NCU_BIN" --set full --import-source no ${NCU_ARGS:--k regex:gemv_mxfp4_packed --launch-count 12} \
    -f -o /tmp/dev/ncu$T $B/cuda_kernels_bench ${NCU_KBENCH_ARGS:---sections moe} --once > "$OUT/ncu_run$T.txt" 2>&1
  echo "ncu rc=$?"
  "$NCU_BIN" -i /tmp/dev/ncu$T.ncu-rep --print-details all > "$OUT/ncu_details$T.txt" 2>&1
  "$NCU_BIN" -i /tmp/dev/ncu$T.ncu-rep --page source --print-source sass --csv 2>&1 | xz -6 > "$OUT/ncu_source$T.csv.xz"
  grep -E "^  [a-z_ ]*void|^    (Duration|DRAM Throughput|Issue Slots Busy|Registers Per Thread) " "$OUT/ncu_details$T.txt" | head -60
fi
