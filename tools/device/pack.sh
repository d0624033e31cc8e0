#!/usr/bin/env bash
# Packs a `cuda` preset build for the lent H200 machine: the stripped binaries and the shared libraries the
# device image lacks (ICU, cpp-httplib, OpenSSL, brotli, zlib, libstdc++), as .dev/pack.tar.xz (~20 MB, under
# the 64 MiB a run carries). Then: run with carry [".dev/run.sh", ".dev/pack.tar.xz"] and the command
# `BENCH=1 TESTS=1 bash .dev/run.sh [GTEST_FILTER]` (see run.sh for the switches).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.dev
rm -rf "$out/bin" "$out/lib" && mkdir -p "$out/bin" "$out/lib"
for f in build/cuda/cedar build/cuda/tests/cedar_cuda_tests build/cuda/bench/cuda_kernels_bench; do
  [ -x "$f" ] && strip -o "$out/bin/$(basename "$f")" "$f"
done
# Libraries outside the C runtime that the binaries link.
ldd "$out"/bin/* | awk '/=>/ {print $3}' | sort -u |
  grep -E 'libicu|libcpp-httplib|libssl|libcrypto|libbrotli|libz\.so|libstdc\+\+' |
  while read -r l; do cp -L "$l" "$out/lib/"; done
cp tools/device/run.sh "$out/run.sh"
tar -cJf "$out/pack.tar.xz" -C "$out" bin lib
rm -rf "$out/bin" "$out/lib"
ls -la "$out/pack.tar.xz"
