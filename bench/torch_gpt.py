#!/usr/bin/python3
"""PyTorch peer for the training benchmark: the same GPT-2 (pre-norm, layernorm, tanh-GELU,
learned positions, tied embeddings, biases) trained with AdamW on random tokens, fp32 on CPU.

    /usr/bin/python3 bench/torch_gpt.py --vocab 256 --seq 256 --d-model 384 --layers 6 \
        --heads 6 --batch 8 --steps 30 --warmup 5 --threads 2 --json

Prints the median tokens/s over the steps after warm-up; with --json one line
{"impl":"pytorch","tokens_per_s":..,"step_ms":..,"config":{..}}.

PyTorch gets its best setup: torch.set_num_threads(--threads), and the process runs with
OMP_WAIT_POLICY=PASSIVE (idle OpenMP workers sleep instead of spinning, so they do not steal
the cores from the threads that have work). The OpenMP runtime reads that variable when it
starts, i.e. before torch is imported, so the script re-executes itself with it set when it
is missing (it also sets OPENBLAS_CORETYPE, see openblas_coretype() in bench/torch_env.py, and
OMP_NUM_THREADS=--threads unless the caller set them). One step = zero_grad, forward, cross-entropy, backward, clip_grad_norm_(1.0),
AdamW step: what our runner does per optimizer step.

Variants measured on the 2-core dev machine (Xeon family 6 model 207, torch 1.13.1,
OpenBLAS 0.3.21-OpenMP; min-of-N micro-benchmarks, the machine was shared) and the defaults
kept (--attn/--foreach/--mkldnn re-measure them):
  OpenBLAS    auto-detected "Prescott" 640 tok/s, Haswell 1330, SkylakeX ~2050, Cooperlake
              ~2100 (d384 config): the OPENBLAS_CORETYPE fix above is worth 3.3x
  attention   baddbmm with an additive causal mask: 42 ms fwd+bwd per layer (d384, B8, T256);
              masked_fill + softmax: 55-63 ms; torch 1.13's private
              F._scaled_dot_product_attention (math kernel): 44 ms          -> baddbmm
  AdamW       foreach=False 30 ms (10.8M) / 365-385 ms (124M); foreach=True 42 ms / 405-580 ms
              (1.13's CPU foreach path materialises whole-list temporaries) -> foreach=False
              (fused=True does not exist for AdamW on CPU in 1.13)
  mkldnn      torch.backends.mkldnn.enabled on/off: no measurable difference (fp32 nn.Linear
              goes to BLAS either way)                                     -> left on (default)
  OpenMP      OMP_WAIT_POLICY PASSIVE 2020-2100 tok/s, ACTIVE 1880, unset (libgomp default)
              1850 (d384 config, shared machine: differences near the noise) -> PASSIVE
"""
import argparse
import json
import os
import sys

from common import add_model_args, reexec_with_torch_env


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(p, vocab=256, seq=256, d_model=384, layers=6, heads=6, batch=8)
    p.add_argument("--steps", type=int, default=30, help="timed steps (after warm-up)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", action="store_true", help="print one JSON line")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--clip", type=float, default=1.0, help="global grad-norm clip (0: off)")
    p.add_argument("--seed", type=int, default=0)
    # variants (defaults: the fastest measured)
    p.add_argument("--attn", choices=["masked_fill", "baddbmm", "sdpa"], default="baddbmm")
    p.add_argument("--foreach", type=int, choices=[0, 1], default=0)
    p.add_argument("--mkldnn", type=int, choices=[0, 1], default=1)
    return p.parse_args()


ARGS = parse_args()


# Re-exec with the OpenMP/OpenBLAS settings in place before anything loads those runtimes.
# Values the caller set explicitly are kept (OMP_WAIT_POLICY is forced to PASSIVE).
reexec_with_torch_env(ARGS.threads, "TORCH_GPT_REEXECED")

import math  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


class Block(nn.Module):
    def __init__(self, C, NH, T, attn):
        super().__init__()
        self.NH, self.HS, self.attn_kind = NH, C // NH, attn
        self.ln1 = nn.LayerNorm(C, eps=1e-5)
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C, eps=1e-5)
        self.fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)  # True above the diagonal: masked
        self.register_buffer("mask", mask, persistent=False)
        self.register_buffer("mask_bias", torch.zeros(T, T).masked_fill(mask, float("-inf")),
                             persistent=False)

    def attention(self, x):
        B, T, C = x.shape
        NH, HS = self.NH, self.HS
        q, k, v = self.qkv(x).view(B, T, 3, NH, HS).permute(2, 0, 3, 1, 4)  # each (B,NH,T,HS)
        scale = 1.0 / math.sqrt(HS)
        if self.attn_kind == "sdpa":
            y, _ = F._scaled_dot_product_attention(q, k, v, None, 0.0, False, True)
        elif self.attn_kind == "baddbmm":
            qf, kf = q.reshape(B * NH, T, HS), k.reshape(B * NH, T, HS)
            s = torch.baddbmm(self.mask_bias[:T, :T], qf, kf.transpose(1, 2), beta=1.0, alpha=scale)
            y = torch.bmm(F.softmax(s, dim=-1), v.reshape(B * NH, T, HS)).view(B, NH, T, HS)
        else:
            s = (q @ k.transpose(-2, -1)) * scale
            s = s.masked_fill(self.mask[:T, :T], float("-inf"))
            y = F.softmax(s, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.mlp_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, V, T, C, L, NH, attn):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList([Block(C, NH, T, attn) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        self.register_buffer("pos", torch.arange(T), persistent=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, tokens, targets):
        T = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(self.pos[:T])
        for blk in self.h:
            x = blk(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied lm_head
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1), ignore_index=-1)


def main():
    a = ARGS
    torch.set_num_threads(a.threads)
    torch.backends.mkldnn.enabled = bool(a.mkldnn)
    torch.manual_seed(a.seed)
    model = GPT(a.vocab, a.seq, a.d_model, a.layers, a.heads, a.attn)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, foreach=bool(a.foreach))
    params = list(model.parameters())
    gen = torch.Generator().manual_seed(a.seed + 1)

    times, losses = [], []
    for step in range(a.warmup + a.steps):
        data = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=gen)
        tokens, targets = data[:, :-1].contiguous(), data[:, 1:].contiguous()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(tokens, targets)
        loss.backward()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(params, a.clip)
        opt.step()
        lv = loss.item()  # synchronises nothing on CPU, but keeps the loss honest
        dt = time.perf_counter() - t0
        losses.append(lv)
        if step >= a.warmup:
            times.append(dt)
        if not a.json:
            print(f"step {step:3d}{' (warm-up)' if step < a.warmup else ''}: loss {lv:.4f} "
                  f"{dt * 1e3:8.1f} ms  {a.batch * a.seq / dt:9.1f} tok/s", file=sys.stderr)

    med = statistics.median(times)
    tps = a.batch * a.seq / med
    config = dict(vocab=a.vocab, seq=a.seq, d_model=a.d_model, layers=a.layers, heads=a.heads,
                  batch=a.batch, steps=a.steps, warmup=a.warmup, threads=a.threads,
                  params=n_params, torch=torch.__version__, attn=a.attn, foreach=a.foreach,
                  mkldnn=a.mkldnn, clip=a.clip, omp_wait_policy=os.environ.get("OMP_WAIT_POLICY"),
                  openblas_coretype=os.environ.get("OPENBLAS_CORETYPE", "auto"),
                  final_loss=losses[-1])
    if a.json:
        print(json.dumps(dict(impl="pytorch", tokens_per_s=round(tps, 2), step_ms=round(med * 1e3, 3),
                              config=config)))
    else:
        print(f"pytorch: {tps:.1f} tokens/s (median step {med * 1e3:.1f} ms over {a.steps} steps, "
              f"{n_params / 1e6:.2f}M params, {a.threads} threads)")


if __name__ == "__main__":
    main()
