#!/usr/bin/env bash
# Fetches NVRTC (libnvrtc, the CUDA runtime compiler; no GPU needed) from the
# PyPI wheel nvidia-cuda-nvrtc-cu12 into target/nvrtc/ and prints its lib
# directory, so that the cuda backend's kernels can be compiled on a machine
# without the CUDA toolkit (the device-free part of tests/cuda_tests.rs).
# Idempotent. Prints nothing and exits 0 when pip cannot fetch it (exits 1 in CI).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dest="$PWD/target/nvrtc"
lib="$dest/nvidia/cuda_nvrtc/lib"
if ! ls "$lib"/libnvrtc.so* >/dev/null 2>&1; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  if ! python3 -m pip download --quiet --no-deps --dest "$tmp" "nvidia-cuda-nvrtc-cu12==12.8.*" >&2; then
    echo "fetch_nvrtc.sh: could not download nvidia-cuda-nvrtc-cu12; NVRTC tests will skip" >&2
    # In CI that is a failure (WLLM_REQUIRE_CUDA_TOOLS), not a skip.
    [ "${CI:-}" = true ] && exit 1
    exit 0
  fi
  mkdir -p "$dest"
  python3 - "$(ls "$tmp"/*.whl | head -n 1)" "$dest" <<'PY'
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])
PY
fi
echo "$lib"
