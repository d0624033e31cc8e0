#!/usr/bin/env bash
# SASS of one CUDA source for sm_90a, without a GPU: nvcc -cubin, then cuobjdump (the CUDA toolkit here has
# no cuobjdump; the first run fetches NVIDIA's PyPI wheels of cuobjdump and nvdisasm into .dev/tools). Prints ptxas's register / spill
# report and the opcode counts of each loop (sass_loops.py); the full listing stays in .dev/sass/.
# usage: tools/sass/sass.sh src/backend/cuda/gemv.cu [FUNCTION_SUBSTRING]
set -euo pipefail
cd "$(dirname "$0")/../.."
src=$1
want=${2:-}
tools=.dev/tools
cuobjdump=$(find "$tools" -name cuobjdump -type f 2>/dev/null | head -1 || true)
if [ -z "$cuobjdump" ]; then
  mkdir -p "$tools"
  python3 -m pip download --quiet --no-deps nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm -d "$tools"
  (cd "$tools" && for w in nvidia_cuda_*.whl; do python3 -m zipfile -e "$w" wheel; done)
  cuobjdump=$(find "$tools" -name cuobjdump -type f | head -1)
  chmod +x "$cuobjdump" "$(dirname "$cuobjdump")/nvdisasm"
fi
export PATH="$(dirname "$cuobjdump"):$PATH"  # cuobjdump runs nvdisasm
mkdir -p .dev/sass
base=.dev/sass/$(basename "$src" .cu)
nvcc -DCEDAR_HAVE_CUDA=1 -Isrc -O3 -arch=sm_90a -std=c++17 -cubin -Xptxas -v "$src" -o "$base.cubin" 2>&1 |
  grep -E "Compiling entry|Used|spill" | grep -B1 -A1 -- "$want" || true
"$cuobjdump" -sass "$base.cubin" > "$base.sass"
python3 tools/sass/sass_loops.py "$base.sass" "$want"
