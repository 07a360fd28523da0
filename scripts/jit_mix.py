"""Helpers of scripts/jit-mix.sh.

  jit_mix.py hot IPS          the hottest run of consecutive 4 KiB pages of
                              sampled JIT addresses: "LO HI" (first to last
                              sampled instruction)
  jit_mix.py mix DIS ROW WHAT the instruction mix of objdump's disassembly DIS,
                              by class, per weight multiply, and with the bench
                              row ROW (its decode G weights/s) the x86
                              instructions a second
"""

import collections
import re
import sys


def hot(path):
    ips = [int(line, 16) for line in open(path) if line.strip()]
    if not ips:
        sys.exit("jit-mix: no samples in JIT code (is the adapter lavapipe?)")
    pages = collections.Counter(i >> 12 for i in ips)
    hot_pages = sorted(p for p, n in pages.items() if n > len(ips) / 300)
    runs, start = [], hot_pages[0]
    for a, b in zip(hot_pages, hot_pages[1:] + [None]):
        if b != a + 1:
            runs.append((start, a))
            start = b
    best = max(runs, key=lambda r: sum(pages[p] for p in range(r[0], r[1] + 1)))
    inside = [i for i in ips if best[0] <= i >> 12 <= best[1]]
    print(hex(min(inside)), hex(max(inside) + 1))


GATHER = {"movslq", "cltq", "vmovd", "vmovq", "vinserti128", "vinsertf128", "vextracti128",
          "vextractf128", "vmovlhps", "vshufps", "vmovsd", "vmovss"}
LOGIC = {"vpand", "vpandd", "vpandq", "vpandn", "vpandnd", "vpandnq", "vpsrld", "vpslld", "vpsrad",
         "vpshufb", "vpmovdw", "vpor", "vpord", "vporq", "vpternlogd", "vandps"}


def klass(op, args):
    if op.startswith(("vfmadd", "vfnmadd", "vfmsub")):
        return "fused multiply-add"
    if op in ("vmulps", "vaddps", "vsubps"):
        return "fp multiply / add / sub"
    if op.startswith("vcvt"):
        return "convert"
    if op in LOGIC:
        return "integer / logic (dequantise, masks)"
    if "(%rsp)" in args and op.startswith("vmov"):
        return "stack spills and reloads"
    if op in GATHER or op.startswith(("vpextr", "vpinsr", "vpunpck", "vunpck")):
        return "texel gathers (lane addresses, loads, transposes)"
    return "other (addressing, loop, broadcasts, moves)"


def mix(dis, row, what):
    ops = []
    for line in open(dis):
        m = re.match(r"\s*([0-9a-f]+):\t(?:[0-9a-f]{2} )+\s*\t(\S+)\s*(.*)", line)
        if m:
            ops.append((m.group(2), m.group(3)))
    classes = collections.Counter(klass(op, args) for op, args in ops)
    total = len(ops)
    muls = sum(1 for op, _ in ops if op == "vmulps" or op.startswith("vfmadd"))
    per = max(muls, 1)
    print(f"{what}: the kernel's hottest JIT stretch, {total} instructions, {muls} multiplies (8 lanes each)")
    for c, n in classes.most_common():
        print(f"  {c:52s} {n:6d}  {100 * n / total:5.1f} %  {n / per:5.2f} a multiply")
    print(f"  {'all':52s} {total:6d}          {total / per:5.2f} a multiply")
    cells = [c.strip() for c in open(row).read().splitlines()[-1].split("|")]
    try:
        weights = float(cells[6])
    except (IndexError, ValueError):
        return
    rate = weights / 8 * total / per
    print(f"  at the bench's {weights:.2f} G weights/s: {rate:.1f} G x86 instructions/s")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "hot":
        hot(sys.argv[2])
    elif len(sys.argv) == 5 and sys.argv[1] == "mix":
        mix(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        sys.exit(__doc__)
