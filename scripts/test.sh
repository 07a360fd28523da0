#!/usr/bin/env bash
# The test command of the README: sets up what the tests need on a fresh machine
# (a Vulkan driver — lavapipe where there is no GPU — the default model,
# llama.cpp's gguf-py, the quantisation tests' reference, and Debian's chromium
# for the browser tests of the server's pages), then runs the
# whole test suite in release mode on the real adapter (arguments go to
# `cargo test`; without any, the binaries run as parallel processes), and the
# cuda backend's tests (`--features cuda`): on a machine without an NVIDIA
# device those compile its kernels with NVRTC (fetched from PyPI) and print why
# the device comparisons skip.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! ls /usr/share/vulkan/icd.d/*.json >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "test.sh: no Vulkan driver found; installing lavapipe (mesa-vulkan-drivers)" >&2
    apt-get update -qq && apt-get install -y -qq mesa-vulkan-drivers >/dev/null
  else
    echo "test.sh: no Vulkan driver found; install one (Debian/Ubuntu: sudo apt-get install mesa-vulkan-drivers)" >&2
  fi
fi
./models/fetch.sh >/dev/null
# Gemma 3 270M: the SentencePiece and Gemma 3 tests (tokenizer_tests, arch_tests).
./models/fetch-gemma3.sh >/dev/null
# llama.cpp's vocabulary fixtures (Qwen 2, Llama SentencePiece, Phi-3): tokenizer_tests.
./models/fetch-vocabs.sh >/dev/null
# The browser tests drive the server's pages in headless Chromium (Debian's chromium).
if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null && [ -z "${WLLM_CHROMIUM:-}" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "test.sh: installing Debian's chromium for the browser tests" >&2
    apt-get update -qq && apt-get install -y -qq chromium >/dev/null
  else
    echo "test.sh: the browser tests need Chromium (Debian/Ubuntu: sudo apt-get install chromium)" >&2
  fi
fi
# The quantisation tests check wllm against llama.cpp's own reader, gguf-py.
if ! python3 -c "import gguf" 2>/dev/null; then
  echo "test.sh: installing llama.cpp's gguf-py (python3 -m pip install gguf) for the quantisation tests" >&2
  python3 -m pip install --quiet gguf >&2
fi
# The test binaries open devices without the CLI's private runtime dir (src/main.rs).
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
if [ $# -gt 0 ]; then
  cargo test --release "$@"
else
  # Every test binary, as parallel processes (scripts/run_tests.py says why).
  cargo test --release --no-run --message-format=json-render-diagnostics | python3 scripts/run_tests.py
fi
# In CI, a missing NVRTC or g++ fails the cuda tests instead of skipping them.
if [ "${CI:-}" = true ]; then export WLLM_REQUIRE_CUDA_TOOLS=1; fi
nvrtc="$(./scripts/fetch_nvrtc.sh)"
LD_LIBRARY_PATH="${nvrtc:+$nvrtc:}${LD_LIBRARY_PATH:-}" \
  cargo test --release --features cuda --test cuda_tests -- --nocapture
