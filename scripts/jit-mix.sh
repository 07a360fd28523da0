#!/usr/bin/env bash
# What a decode GEMV executes on lavapipe: runs the kernel bench's decode of
# one weight format and shape (WLLM_BENCH_DECODE_REPS) under perf, copies
# llvmpipe's JIT code while it runs, and prints the bench's row and the
# instruction mix of the hottest stretch of JIT code (the kernel's loop) by
# class, per weight multiply (every format multiplies once a weight, 8 lanes
# an instruction), with the x86 instructions a second that implies (at the
# bench's rate, which for a small weight includes the dispatch's launch).
#
#   scripts/jit-mix.sh Q4_1 576x49152
#
# Needs perf, gdb and objdump (apt-get install linux-perf gdb binutils) and
# root or kernel.perf_event_paranoid <= 1. Linux x86-64 with lavapipe only.
# KEEP=1 keeps the work folder (samples, code, disassembly).
set -euo pipefail
usage="usage: scripts/jit-mix.sh FORMAT KxN (e.g. Q4_1 576x49152)"
format=${1:?$usage}
shape=${2:?$usage}
[[ $shape =~ ^[0-9]+[xX][0-9]+$ ]] || { echo "$usage" >&2; exit 2; }
for tool in perf gdb objdump python3; do
    command -v "$tool" >/dev/null || { echo "jit-mix: $tool not found (apt-get install linux-perf gdb binutils python3)" >&2; exit 1; }
done
cd "$(dirname "$0")/.."
bench=$(cargo bench --bench kernels --no-run 2>&1 | sed -n 's/.*Executable .*(\(.*\))$/\1/p' | tail -1)
[ -x "$bench" ] || { echo "jit-mix: could not build the kernel bench" >&2; exit 1; }
work=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] && echo "kept $work" || rm -rf "$work"' EXIT
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
k=${shape%[xX]*}
n=${shape#*[xX]}
# About 10-20 s of decode dispatches on a 2-core machine.
auto=$((120000000000 / (k * n)))
reps=${REPS:-$((auto > 2000 ? auto : 2000))}
WLLM_BENCH_FORMATS=$format WLLM_BENCH_SHAPES=$shape WLLM_BENCH_DECODE_REPS=$reps \
    perf record -q -F 2000 -o "$work/perf.data" -- "$bench" >"$work/bench.txt" 2>&1 &
rec=$!
# Once the roofs are measured the weight is uploaded and the decode runs:
# then copy the JIT code (anonymous executable mappings) while it is live.
for _ in $(seq 1200); do
    grep -q '^read roof' "$work/bench.txt" 2>/dev/null && break
    kill -0 "$rec" 2>/dev/null || break
    sleep 0.1
done
sleep "${WAIT:-6}"
pid=$(pgrep -P "$rec" | head -1 || true)
[ -n "$pid" ] || { wait "$rec" || true; cat "$work/bench.txt"; echo "jit-mix: the bench ended early" >&2; exit 1; }
cmds=()
i=0
while read -r a b; do
    cmds+=(-ex "dump binary memory $work/jit.$i.bin 0x$a 0x$b")
    echo "$i $a" >>"$work/jit.txt"
    i=$((i + 1))
done < <(awk '$2 ~ /x/ && $6 == "" { split($1, r, "-"); print r[1], r[2] }' "/proc/$pid/maps")
gdb -p "$pid" -batch "${cmds[@]}" >/dev/null 2>&1 || true
wait "$rec" || true
grep '^| ' "$work/bench.txt" | sed -n '1p;2p' | tee "$work/row.txt"
perf script -i "$work/perf.data" -F ip,dso 2>/dev/null |
    awk 'NF == 2 && ($2 ~ /perf-[0-9]+\.map/ || $2 ~ /unknown/) { print $1 }' >"$work/ips.txt"
read -r lo hi < <(python3 "$(dirname "$0")/jit_mix.py" hot "$work/ips.txt")
# Disassemble the stretch from the mapping that holds it.
while read -r i a; do
    size=$(stat -c %s "$work/jit.$i.bin" 2>/dev/null || echo 0)
    if ((lo >= 0x$a && hi <= 0x$a + size)); then
        objdump -D -b binary -m i386:x86-64 --adjust-vma="0x$a" --start-address="$lo" --stop-address="$hi" \
            "$work/jit.$i.bin" >"$work/dis.txt"
    fi
done <"$work/jit.txt"
[ -s "$work/dis.txt" ] || { echo "jit-mix: the hot code was not in a copied mapping" >&2; exit 1; }
python3 "$(dirname "$0")/jit_mix.py" mix "$work/dis.txt" "$work/row.txt" "$format $shape"
