#!/usr/bin/env python3
"""Reference side of wllm's quantisation tests, done by llama.cpp's own gguf-py.

  gguf_ref.py dequantize TYPE ROWS IN OUT   raw GGUF blocks (ROWS equal rows) -> f32 values
  gguf_ref.py quantize TYPE ROWS IN OUT     f32 values (ROWS rows) -> gguf.quants.quantize bytes
  gguf_ref.py tensors GGUF OUTDIR           every tensor of a GGUF: NAME.type, NAME.f32 (dequantised)

Exits 3 with a line saying how to install gguf when it is missing.
"""
import sys

try:
    import numpy as np
    from gguf import GGMLQuantizationType as T, quants, GGUFReader
except ImportError as e:  # pragma: no cover
    print(f"gguf_ref.py: {e}: install llama.cpp's reader with `python3 -m pip install gguf`", file=sys.stderr)
    sys.exit(3)


def main() -> None:
    cmd = sys.argv[1]
    if cmd == "tensors":
        reader = GGUFReader(sys.argv[2])
        for t in reader.tensors:
            base = f"{sys.argv[3]}/{t.name}"
            with open(base + ".type", "w") as f:
                f.write(t.tensor_type.name)
            quants.dequantize(t.data, t.tensor_type).astype(np.float32).tofile(base + ".f32")
        return
    qt, rows, src, dst = T[sys.argv[2]], int(sys.argv[3]), sys.argv[4], sys.argv[5]
    if cmd == "dequantize":
        raw = np.fromfile(src, dtype=np.uint8).reshape(rows, -1)
        quants.dequantize(raw, qt).astype(np.float32).tofile(dst)
    elif cmd == "quantize":
        vals = np.fromfile(src, dtype=np.float32).reshape(rows, -1)
        quants.quantize(vals, qt).tofile(dst)
    else:
        sys.exit(f"gguf_ref.py: unknown command {cmd}")


if __name__ == "__main__":
    main()
