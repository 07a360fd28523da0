#!/usr/bin/env python3
"""An independent reference forward pass of the decoder families wllm runs,
in float64 numpy from the dequantised weights of a GGUF file (read with
llama.cpp's own gguf-py), following each family's published definition:
llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3.

  arch_ref.py MODEL.gguf N ID,ID,...[;ID,ID,...]   greedy-generates N tokens after each prompt
  arch_ref.py MODEL.gguf embed IDS[;IDS]           each prompt's embeddings: the final-normed
                                                  hidden states pooled by mean, cls and last, L2-normalised

Prints one JSON object a prompt: {"tokens": [...], "margins": [...]} where margins[i]
is the gap between the best and second-best logit at step i (a small gap is
where float rounding may pick either).
"""
import json
import sys

import numpy as np
from gguf import GGUFReader, quants


def field(r, key, default=None):
    f = r.fields.get(key)
    if f is None:
        return default
    v = f.contents()
    return v


def main():
    path, mode = sys.argv[1], sys.argv[2]
    n_new = 0 if mode == "embed" else int(mode)
    prompts = [[int(x) for x in p.split(",")] for p in sys.argv[3].split(";")]
    r = GGUFReader(path)
    arch = field(r, "general.architecture")
    k = lambda name, d=None: field(r, f"{arch}.{name}", d)
    W = {}
    for t in r.tensors:
        a = quants.dequantize(t.data, t.tensor_type).astype(np.float64)
        W[t.name] = a.reshape([int(d) for d in reversed(t.shape)]) if len(t.shape) > 1 else a.reshape(-1)
    hidden, layers = k("embedding_length"), k("block_count")
    heads = k("attention.head_count")
    kv_heads = k("attention.head_count_kv", heads)
    hd = k("attention.key_length") or k("rope.dimension_count") or hidden // heads
    eps = k("attention.layer_norm_rms_epsilon", 1e-5)
    theta = k("rope.freq_base", 10000.0)
    window = k("attention.sliding_window", 0) or 0
    gemma = arch in ("gemma2", "gemma3")
    neox = arch != "llama" and arch != "mistral"
    if arch == "gemma2":
        swa = [l % 2 == 0 for l in range(layers)]
    elif arch == "gemma3":
        swa = [l % 6 < 5 for l in range(layers)]
    elif arch in ("llama", "mistral"):
        swa = [window > 0] * layers
    else:
        swa = [False] * layers
    if not window:
        swa = [False] * layers
    attn_cap = k("attn_logit_softcapping") if arch == "gemma2" else None
    final_cap = k("final_logit_softcapping") if arch == "gemma2" else None
    scale = 1.0 / np.sqrt(hd)

    def rms(x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w

    def rope(x, theta_l):  # x: (T, H, hd)
        T = x.shape[0]
        pos = np.arange(T)[:, None]
        freq = theta_l ** (-2.0 * np.arange(hd // 2) / hd)
        ang = pos * freq[None, :]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        if neox:
            a, b = x[..., : hd // 2], x[..., hd // 2:]
            return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)
        a, b = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = a * c - b * s
        out[..., 1::2] = a * s + b * c
        return out

    def gelu(x):
        return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))

    def silu(x):
        return x / (1.0 + np.exp(-x))

    def hidden_states(toks):
        T = len(toks)
        h = W["token_embd.weight"][toks]
        if gemma:
            h = h * np.sqrt(hidden)
        for l in range(layers):
            p = lambda n: W[f"blk.{l}.{n}"]
            x = rms(h, p("attn_norm.weight"))
            if arch == "phi3":
                qkv = x @ p("attn_qkv.weight").T
                q, kk, v = np.split(qkv, [heads * hd, (heads + kv_heads) * hd], axis=-1)
            else:
                q, kk, v = x @ p("attn_q.weight").T, x @ p("attn_k.weight").T, x @ p("attn_v.weight").T
            if arch == "qwen2":
                q, kk, v = q + p("attn_q.bias"), kk + p("attn_k.bias"), v + p("attn_v.bias")
            q, kk, v = q.reshape(T, heads, hd), kk.reshape(T, kv_heads, hd), v.reshape(T, kv_heads, hd)
            if arch in ("qwen3", "gemma3"):
                q, kk = rms(q, p("attn_q_norm.weight")), rms(kk, p("attn_k_norm.weight"))
            th = 10000.0 if (arch == "gemma3" and swa[l]) else theta
            q, kk = rope(q, th), rope(kk, th)
            g = heads // kv_heads
            out = np.zeros((T, heads, hd))
            for hh in range(heads):
                s = q[:, hh, :] @ kk[:, hh // g, :].T * scale
                if attn_cap:
                    s = attn_cap * np.tanh(s / attn_cap)
                i, j = np.arange(T)[:, None], np.arange(T)[None, :]
                mask = j > i
                if swa[l]:
                    mask |= (i - j) >= window
                s = np.where(mask, -np.inf, s)
                s = np.exp(s - s.max(axis=1, keepdims=True))
                s /= s.sum(axis=1, keepdims=True)
                out[:, hh, :] = s @ v[:, hh // g, :]
            a = out.reshape(T, heads * hd) @ p("attn_output.weight").T
            if gemma:
                a = rms(a, p("post_attention_norm.weight"))
            h = h + a
            x = rms(h, p("ffn_norm.weight"))
            if arch == "phi3":
                gate, up = np.split(x @ p("ffn_up.weight").T, 2, axis=-1)
            else:
                gate, up = x @ p("ffn_gate.weight").T, x @ p("ffn_up.weight").T
            m = ((gelu(gate) if gemma else silu(gate)) * up) @ p("ffn_down.weight").T
            if gemma:
                m = rms(m, p("post_ffw_norm.weight"))
            h = h + m
        return h

    def forward(toks):
        x = rms(hidden_states(toks)[-1], W["output_norm.weight"])
        head = W.get("output.weight", W["token_embd.weight"])
        logits = head @ x
        if final_cap:
            logits = final_cap * np.tanh(logits / final_cap)
        return logits

    if mode == "embed":
        for ids in prompts:
            x = rms(hidden_states(list(ids)), W["output_norm.weight"])
            pooled = {"mean": x.mean(axis=0), "cls": x[0], "last": x[-1]}
            print(json.dumps({k: (e / np.linalg.norm(e)).tolist() for k, e in pooled.items()}))
        return
    for ids in prompts:
        toks, out, margins = list(ids), [], []
        for _ in range(n_new):
            lg = forward(toks)
            best = int(np.argmax(lg))
            top2 = np.sort(lg)[-2:]
            out.append(best)
            margins.append(float(top2[1] - top2[0]))
            toks.append(best)
        print(json.dumps({"tokens": out, "margins": margins}))


if __name__ == "__main__":
    main()
