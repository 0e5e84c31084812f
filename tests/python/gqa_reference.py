"""Grouped-query attention in PyTorch against the runner's CPU kernels (tests/test_ops_gqa.cpp).

usage: gqa_reference.py DIR B T C NH NKV

DIR holds the test's fp32 little-endian files: qkv.f32 (B, T, W) packed [q: NH*HS | k: NKV*HS |
v: NKV*HS] per token (W = (NH + 2 NKV) HS, HS = C / NH), dout.f32 (B, T, C), and the runner's
out.f32 (B, T, C) and dqkv.f32 (B, T, W). The reference is the Hugging Face Llama convention:
K and V repeated to the query heads with repeat_interleave (query head h reads key-value head
h // (NH / NKV)), then torch's scaled_dot_product_attention (its private pre-2.0 name on torch 1.13), causal, in fp32; dqkv is autograd's
gradient of sum(out * dout). Prints the largest differences relative to each tensor's largest
entry and exits 1 when one is over 1e-5.
"""
import os
import sys

import numpy as np
import torch

torch.set_num_threads(1)


def load(d, name, shape):
    return torch.from_numpy(np.fromfile(os.path.join(d, name), dtype="<f4").reshape(shape).copy())


def sdpa_causal(q, k, v):
    f = getattr(torch.nn.functional, "scaled_dot_product_attention", None)
    if f is not None:
        return f(q, k, v, is_causal=True)
    # torch 1.13 (this machine's) has the same operator under its pre-2.0 private name,
    # returning (output, weights).
    return torch.nn.functional._scaled_dot_product_attention(q, k, v, None, 0.0, False, True)[0]


def main():
    d = sys.argv[1]
    B, T, C, NH, NKV = (int(x) for x in sys.argv[2:7])
    HS = C // NH
    W = (NH + 2 * NKV) * HS
    qkv = load(d, "qkv.f32", (B, T, W)).requires_grad_(True)
    dout = load(d, "dout.f32", (B, T, C))
    q, k, v = qkv.split([NH * HS, NKV * HS, NKV * HS], dim=2)
    q = q.view(B, T, NH, HS).transpose(1, 2)
    k, v = (t.view(B, T, NKV, HS).transpose(1, 2).repeat_interleave(NH // NKV, dim=1) for t in (k, v))
    y = sdpa_causal(q, k, v)
    out = y.transpose(1, 2).reshape(B, T, C)
    (out * dout).sum().backward()
    worst = 0.0
    for name, ref, ours in [("out", out.detach(), load(d, "out.f32", (B, T, C))),
                            ("dqkv", qkv.grad, load(d, "dqkv.f32", (B, T, W)))]:
        rel = ((ref - ours).abs().max() / ref.abs().max()).item()
        worst = max(worst, rel)
        print(f"NH={NH} NKV={NKV} {name}: max |torch - runner| / max |torch| = {rel:.2e}")
    sys.exit(0 if worst <= 1e-5 else 1)


if __name__ == "__main__":
    main()
