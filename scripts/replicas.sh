#!/usr/bin/env bash
# Several `wllm serve` replicas on loopback behind vLLM's router (`vllm-router`, from PyPI):
#   scripts/replicas.sh N [--model PATH] [--port PORT] [--policy POLICY] [-- wllm serve flags...]
# The router listens on PORT (default 30000; its own metrics on PORT+N+1), replica i (1..N) on PORT+i, each with
# --vllm-metric-names so the router (and Prometheus) read vLLM's metric names. POLICY is one of
# vllm-router's: round_robin, power_of_two, cache_aware (the default), consistent_hash, random.
# Prints one line per replica (`replica I http://127.0.0.1:PORT pid PID`), then
# `router http://127.0.0.1:PORT policy POLICY pid PID` and `ready` once every replica and the
# router answer /health; then waits. Ctrl-C (or SIGTERM to this script) stops them all.
#   scripts/replicas.sh --install-router   installs the router only and prints its path.
# Env: WLLM_BIN (default target/release/wllm, built if missing), VLLM_ROUTER (a router binary
# to use instead of installing one), WLLM_ROUTER_VERSION (default 0.1.17), RUN_DIR (logs; default
# a new temporary folder), WLLM_ROUTER_HOME (default ~/.cache/wllm-router: the router's venv).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

install_router() {
  if [ -n "${VLLM_ROUTER:-}" ]; then echo "$VLLM_ROUTER"; return 0; fi
  local home=${WLLM_ROUTER_HOME:-$HOME/.cache/wllm-router} ver=${WLLM_ROUTER_VERSION:-0.1.17}
  local bin=$home/venv/bin/vllm-router
  local have=""
  [ -x "$bin" ] && have=$("$home/venv/bin/pip" show vllm-router 2>/dev/null || true)
  if ! grep -qx "Version: $ver" <<<"$have"; then
    echo "replicas.sh: installing vllm-router $ver from PyPI into $home/venv" >&2
    python3 -m venv "$home/venv" >&2 || { echo "replicas.sh: python3 -m venv failed (Debian: apt-get install python3-venv)" >&2; return 1; }
    "$home/venv/bin/pip" install --quiet "vllm-router==$ver" >&2 || { echo "replicas.sh: pip could not install vllm-router==$ver" >&2; return 1; }
  fi
  "$bin" --help >/dev/null 2>&1 || { echo "replicas.sh: $bin does not run on this machine" >&2; return 1; }
  echo "$bin"
}

if [ "${1:-}" = --install-router ]; then install_router; exit $?; fi
n=${1:-}
case "$n" in ''|*[!0-9]*) echo "usage: scripts/replicas.sh N [--model PATH] [--port PORT] [--policy POLICY] [-- wllm serve flags]" >&2; exit 2;; esac
[ "$n" -ge 1 ] || { echo "replicas.sh: N must be at least 1" >&2; exit 2; }
shift
model=models/SmolLM2-135M-Instruct.Q4_1.gguf port=30000 policy=cache_aware extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift 2;;
    --port) port=$2; shift 2;;
    --policy) policy=$2; shift 2;;
    --) shift; extra=("$@"); break;;
    *) echo "replicas.sh: unknown argument $1" >&2; exit 2;;
  esac
done
[ -f "$model" ] || { echo "replicas.sh: no model at $model (models/fetch.sh fetches the default one)" >&2; exit 2; }
if [ "$policy" = power_of_two ] && [ "$n" -lt 2 ]; then echo "replicas.sh: power_of_two needs 2 replicas or more" >&2; exit 2; fi
wllm=${WLLM_BIN:-target/release/wllm}
[ -x "$wllm" ] || cargo build --release --bin wllm >&2
router=$(install_router)
run=${RUN_DIR:-$(mktemp -d)}; mkdir -p "$run"
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}

pids=()
stop() { trap - EXIT INT TERM; for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap stop EXIT
trap 'stop; exit 0' INT TERM
up() { # url pid: waits for /health while the process lives
  for _ in $(seq 600); do
    curl -sf "$1/health" >/dev/null 2>&1 && return 0
    kill -0 "$2" 2>/dev/null || { echo "replicas.sh: the process behind $1 exited; its log is in $run" >&2; return 1; }
    sleep 0.5
  done
  echo "replicas.sh: $1 did not answer /health in 300 s" >&2; return 1
}

urls=()
for i in $(seq "$n"); do
  p=$((port + i)) url=http://127.0.0.1:$((port + i))
  "$wllm" serve --model "$model" --host 127.0.0.1 --port "$p" --vllm-metric-names "${extra[@]}" >"$run/replica-$i.log" 2>&1 &
  pids+=($!); urls+=("$url")
  echo "replica $i $url pid $!"
done
for i in $(seq "$n"); do up "${urls[$((i - 1))]}" "${pids[$((i - 1))]}"; done
"$router" --host 127.0.0.1 --port "$port" --worker-urls "${urls[@]}" --policy "$policy" \
  --prometheus-port $((port + n + 1)) --log-dir "$run" --log-level warning >"$run/router.log" 2>&1 &
pids+=($!)
echo "router http://127.0.0.1:$port policy $policy pid $!"
up "http://127.0.0.1:$port" "$!"
echo "ready (logs in $run)"
wait "${pids[@]}"
