#!/usr/bin/env bash
# The NVIDIA check of the cuda backend, in one run (for a lent GPU machine):
# the kernel and oracle tests on both backends (cuda and wgpu on the GPU's
# Vulkan driver), then decode tokens/s at batch 1 and 32 and prompt tokens/s,
# cuda against wgpu. Results go to $OUT (default target/device-check/).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${OUT:-target/device-check}"
mkdir -p "$out"
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$out/gpu.txt"
./models/fetch.sh >/dev/null
nvrtc="$(./scripts/fetch_nvrtc.sh || true)"
export LD_LIBRARY_PATH="${nvrtc:+$nvrtc:}${LD_LIBRARY_PATH:-}"
cargo build --release --features cuda 2>&1 | tail -n 3
# Kernel tests (CPU reference) and the oracle on both backends.
cargo test --release --features cuda --test cuda_tests --test backend_tests --test oracle_tests \
  --test gemm_tests --test ops_tests --test attention_tests -- --nocapture 2>&1 | tee "$out/tests.txt" \
  | grep -E "^test |test result|skipped|adapter|cuda:"
for dev in cuda wgpu; do
  # Decode: 128-token prompts, 128 output tokens, 1 and 32 at once.
  ./target/release/wllm bench serve --device "$dev" --concurrency 1,32 --input-len 128 --output-len 128 \
    --json "$out/decode-$dev.json" 2>&1 | tail -n 6
  # Prompt throughput: 2048-token prompts, one output token.
  ./target/release/wllm bench serve --device "$dev" --concurrency 1 --input-len 2048 --output-len 1 \
    --num-prompts 4 --max-num-batched-tokens 2048 --json "$out/prefill-$dev.json" 2>&1 | tail -n 4
done
echo "results in $out"
