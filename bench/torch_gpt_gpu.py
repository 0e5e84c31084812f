#!/usr/bin/env python3
"""PyTorch peer on the GPU for scripts/gpu-check.sh: GPT-2 124M (pre-norm, layernorm, tanh
GELU, learned positions, tied embeddings, biases: recipes/gpt2-124m.yaml's model) trained with
AdamW on random tokens, eager or torch.compile, fp32 or bf16 autocast, optionally with
activation checkpointing per block (the analogue of our selective recompute).

    python3 bench/torch_gpt_gpu.py --dtype bf16 --compile 1 --batch 8 --seq 1024 --steps 10 --json

One step = zero_grad, forward, cross-entropy, backward, clip_grad_norm_(1.0), AdamW (fused
where this PyTorch has it). Prints tokens/s (median step after warm-up), MFU against
--peak-tflops (gpu-check.sh passes the bf16 matmul peak it measured in the same run; 0:
measure it here), and peak memory (torch.cuda.max_memory_allocated). FLOPs per token:
6 N (N = non-embedding + embedding parameters, as llm.c and nanoGPT count) + 12 L T C
(attention scores and values, forward and backward).

--device cpu runs a tiny config anywhere (a smoke test of the script itself).
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

from common import add_model_args


def causal_attention(q, k, v):
    if hasattr(F, "scaled_dot_product_attention"):  # torch >= 2.0: flash / memory-efficient kernels
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.shape[-2]
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return s.softmax(-1) @ v


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.fc2 = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
        self.H = H

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))
        y = causal_attention(q, k, v)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, V, T, C, L, H, recompute):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block(C, H) for _ in range(L))
        self.lnf = nn.LayerNorm(C)
        self.recompute = recompute
        for m in self.modules():  # GPT-2's initialisation
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            if self.recompute and self.training:
                x = torch.utils.checkpoint.checkpoint(b, x, use_reentrant=False)
            else:
                x = b(x)
        logits = self.lnf(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))


def matmul_peak_tflops(device, dtype=torch.bfloat16, n=8192, reps=20):
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()
    return 2 * n ** 3 * reps / (time.perf_counter() - t0) / 1e12


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16")
    p.add_argument("--compile", type=int, choices=[0, 1], default=0)
    p.add_argument("--recompute", type=int, choices=[0, 1], default=0)
    add_model_args(p, vocab=50257, seq=1024, d_model=768, layers=12, heads=12, batch=8)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--peak-tflops", type=float, default=0.0)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    cuda = a.device.startswith("cuda")
    torch.manual_seed(0)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 (our backend uses no TF32)
        torch.backends.cudnn.allow_tf32 = False
    model = GPT(a.vocab, a.seq, a.d_model, a.layers, a.heads, bool(a.recompute)).to(a.device)
    n_params = sum(p.numel() for p in model.parameters())
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=cuda)
    except (TypeError, RuntimeError):
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    step_model = model
    compiled = False
    if a.compile:
        if not hasattr(torch, "compile"):
            raise SystemExit(json.dumps({"impl": "pytorch-compile", "error": "torch.compile not in torch " + torch.__version__}))
        step_model = torch.compile(model)
        compiled = True
    x = torch.randint(0, a.vocab, (a.batch, a.seq), device=a.device)
    y = torch.randint(0, a.vocab, (a.batch, a.seq), device=a.device)
    amp = torch.autocast(device_type="cuda" if cuda else "cpu", dtype=torch.bfloat16, enabled=a.dtype == "bf16")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(a.warmup + a.steps):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with amp:
            loss = step_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    step = statistics.median(times)
    tok_s = a.batch * a.seq / step
    flops_tok = 6 * n_params + 12 * a.layers * a.seq * a.d_model
    peak = a.peak_tflops or (matmul_peak_tflops(a.device) if cuda else 0.0)
    res = {
        "impl": "pytorch-compile" if compiled else "pytorch-eager",
        "dtype": a.dtype,
        "recompute": bool(a.recompute),
        "tokens_per_s": round(tok_s, 1),
        "step_ms": round(step * 1e3, 2),
        "mfu": round(tok_s * flops_tok / (peak * 1e12), 4) if peak else None,
        "peak_tflops_bf16_matmul": round(peak, 1) if peak else None,
        "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2 ** 30, 2) if cuda else None,
        "loss": round(float(loss), 4),
        "params": n_params,
        "config": {"batch": a.batch, "seq": a.seq, "d_model": a.d_model, "layers": a.layers, "heads": a.heads,
                   "vocab": a.vocab, "steps": a.steps, "warmup": a.warmup},
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
    }
    print(json.dumps(res) if a.json else res)


if __name__ == "__main__":
    main()
