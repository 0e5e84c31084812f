#!/usr/bin/python3
"""Generation throughput: `runner generate` with its KV cache against a PyTorch loop with its
own KV cache, on the same model, in the same run.

    /usr/bin/python3 bench/generate.py --runner build/runner [--threads 2] [--json]

What it does:
  1. trains a small GPT-2-style model for a few steps (the weights only need to be the
     same on both sides) and exports it with `runner export --format safetensors`;
  2. reads the plan's inference figures (`runner generate --stats`) and picks a custom device
     memory (hardware.device=custom, memory_gb) so that the fp32 cache's largest batch is
     --max-batch sequences: weights + (max_batch + 1/2) x KV per sequence;
  3. for the fp32 and the bf16 cache and a batch sweep 1, 2, 4, ... up to the plan's largest
     batch: runs `runner generate --stats` (prefill tokens/s = prompt positions / prefill
     wall time; decode tokens/s = rows x steps / decode wall time), and the PyTorch loop on
     the exported weights (prefill over the batch of prompts filling a preallocated cache of
     (B, NH, context, HS) per layer, then one token per row per step; bf16 stores the cache
     in torch.bfloat16 and widens it to read), both greedy, and checks that the fp32 runs
     produce the same tokens;
  4. asks the runner for the plan's largest batch + 1, which it must refuse (the cache no
     longer fits), and prints the peak bytes per memory account beside the plan's figures.

OMP_WAIT_POLICY=PASSIVE and OPENBLAS_CORETYPE as in bench/torch_gpt.py (the script re-executes
itself with them set); both sides get --threads threads.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from common import read_safetensors as read_f32_safetensors, reexec_with_torch_env


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runner", default="build/runner")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--max-batch", type=int, default=16, help="the fp32 cache's largest batch (sets the device memory)")
    p.add_argument("--repeats", type=int, default=2, help="runs per point; the fastest is kept")
    p.add_argument("--json", action="store_true")
    return p.parse_args()


ARGS = parse_args()


reexec_with_torch_env(ARGS.threads, "GENERATE_BENCH_REEXECED")

import math  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(ARGS.threads)
SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, check=True):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}\n{r.stderr}")
    return r


def read_safetensors(path):
    return {k: torch.from_numpy(v) for k, v in read_f32_safetensors(path, dtypes=("F32",)).items()}


class TorchGpt2:
    """GPT-2 (Hugging Face layout: Conv1D (in, out), gelu_new, tied embeddings) with a KV cache."""

    def __init__(self, cfg, w):
        self.cfg, self.w = cfg, w
        self.C, self.NH, self.L = cfg["n_embd"], cfg["n_head"], cfg["n_layer"]
        self.HS = self.C // self.NH
        self.eps = cfg["layer_norm_epsilon"]

    def ln(self, x, p):
        return torch.nn.functional.layer_norm(x, (self.C,), self.w[p + ".weight"], self.w[p + ".bias"], self.eps)

    def conv1d(self, x, p):
        return torch.addmm(self.w[p + ".bias"], x.reshape(-1, x.shape[-1]), self.w[p + ".weight"]).view(*x.shape[:-1], -1)

    def forward(self, tokens, start, cache, dtype, every=False):
        """tokens (B, T) at positions [start, start + T); cache[l] = (K, V) (B, NH, ctx, HS)."""
        B, T = tokens.shape
        w, C, NH, HS = self.w, self.C, self.NH, self.HS
        x = w["transformer.wte.weight"][tokens] + w["transformer.wpe.weight"][start:start + T]
        end = start + T
        for l in range(self.L):
            p = f"transformer.h.{l}"
            qkv = self.conv1d(self.ln(x, p + ".ln_1"), p + ".attn.c_attn")
            q, k, v = (t.view(B, T, NH, HS).transpose(1, 2) for t in qkv.split(C, dim=2))
            K, V = cache[l]
            K[:, :, start:end] = k.to(dtype)
            V[:, :, start:end] = v.to(dtype)
            Kr, Vr = K[:, :, :end].float(), V[:, :, :end].float()
            s = (q @ Kr.transpose(-1, -2)) / math.sqrt(HS)
            if T > 1:
                mask = torch.ones(T, end, dtype=torch.bool).tril(start)
                s = s.masked_fill(~mask, float("-inf"))
            y = (torch.softmax(s, dim=-1) @ Vr).transpose(1, 2).reshape(B, T, C)
            x = x + self.conv1d(y, p + ".attn.c_proj")
            h = self.conv1d(self.ln(x, p + ".ln_2"), p + ".mlp.c_fc")
            h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h ** 3)))
            x = x + self.conv1d(h, p + ".mlp.c_proj")
        if every:  # logits at every position (B, T, V)
            return self.ln(x, "transformer.ln_f") @ w["transformer.wte.weight"].T
        x = self.ln(x[:, -1:], "transformer.ln_f")
        return x[:, -1] @ w["transformer.wte.weight"].T

    def teacher_forced_argmax(self, seqs, context):
        """Argmax at every position of one full pass over the given sequences (B, T)."""
        B, T = seqs.shape
        cache = [(torch.empty(B, self.NH, context, self.HS), torch.empty(B, self.NH, context, self.HS)) for _ in range(self.L)]
        with torch.no_grad():
            return self.forward(seqs, 0, cache, torch.float32, every=True).argmax(-1)

    def generate(self, prompts, new_tokens, context, dtype):
        B = prompts.shape[0]
        cache = [(torch.empty(B, self.NH, context, self.HS, dtype=dtype), torch.empty(B, self.NH, context, self.HS, dtype=dtype))
                 for _ in range(self.L)]
        out = []
        with torch.no_grad():
            t0 = time.perf_counter()
            logits = self.forward(prompts, 0, cache, dtype)
            t1 = time.perf_counter()
            tok = logits.argmax(-1)
            out.append(tok)
            for s in range(1, new_tokens):
                logits = self.forward(tok[:, None], prompts.shape[1] + s - 1, cache, dtype)
                tok = logits.argmax(-1)
                out.append(tok)
            t2 = time.perf_counter()
        return torch.stack(out, 1), t1 - t0, t2 - t1


def main():
    tmp = tempfile.mkdtemp(prefix="runner_bench_generate_")
    run_dir, export_dir = os.path.join(tmp, "run"), os.path.join(tmp, "export")
    context = ARGS.prompt_len + ARGS.new_tokens
    model_sets = [f"model.d_model={ARGS.d_model}", f"model.n_layers={ARGS.layers}", f"model.n_heads={ARGS.heads}",
                  f"model.seq_len={max(64, context)}"]
    run([ARGS.runner, "train", os.path.join(SRC, "recipes/quickstart.yaml"), "--quiet", "--run-dir", run_dir, "--set",
         "train.steps=20", "train.eval_every=0", "checkpoint.every_steps=20", "batch.micro=4", "optimizer.lr=3e-3",
         *model_sets])
    run([ARGS.runner, "export", run_dir, "--format", "safetensors", "--out", export_dir])
    with open(os.path.join(export_dir, "config.json")) as f:
        cfg = json.load(f)
    torch_model = TorchGpt2(cfg, read_safetensors(os.path.join(export_dir, "model.safetensors")))

    # Prompts: digits of addition problems, all of one length (every row's positions are real).
    def prompts_for(B):  # the same B prompts on every call for B
        rng = np.random.default_rng(B)
        rows = ["".join(rng.choice(list("0123456789+="), ARGS.prompt_len)) for _ in range(B)]
        path = os.path.join(tmp, f"prompts_{B}.txt")
        with open(path, "w") as f:
            f.write("\n".join(rows) + "\n")
        return rows, path

    def runner_generate(B, dtype, memory_gb, extra=(), check=True):
        rows, path = prompts_for(B)
        sets = [f"inference.batch={B}", f"inference.kv_dtype={dtype}", f"inference.context={context}"]
        if memory_gb:
            sets += ["hardware.device=custom", f"hardware.memory_gb={memory_gb:.9f}"]
        r = run([ARGS.runner, "generate", run_dir, "--prompts", path, "--max-new-tokens", str(ARGS.new_tokens), "--json",
                 "--stats", *extra, "--set", *sets], check=check)
        if r.returncode != 0:
            return rows, None, r
        stats = json.loads(r.stderr.strip().splitlines()[-1])
        recs = [json.loads(l) for l in r.stdout.splitlines()]
        return rows, (stats, [rec["tokens"] for rec in recs]), r

    # The plan's figures, then the device memory that makes the fp32 largest batch ARGS.max_batch.
    _, (probe, _), _ = runner_generate(1, "fp32", 0)
    weights, per_seq = probe["plan"]["weights_bytes"], probe["plan"]["kv_cache_bytes"]
    memory_gb = (weights + (ARGS.max_batch + 0.5) * per_seq) / 2 ** 30
    results = []
    for dtype in ["fp32", "bf16"]:
        _, (st, _), _ = runner_generate(1, dtype, memory_gb)
        max_batch = st["plan"]["max_batch"]
        batches = sorted({b for b in [1, 2, 4, 8, 16, 32, 64] if b <= max_batch} | {max_batch})
        for B in batches:
            best = None
            for _ in range(ARGS.repeats):
                rows, (st, toks), _ = runner_generate(B, dtype, memory_gb)
                if best is None or st["decode_s"] < best[0]["decode_s"]:
                    best = (st, toks)
            st, toks = best
            tp = torch.tensor([[ord(c) for c in r] for r in rows], dtype=torch.long)
            tt = None
            for _ in range(ARGS.repeats):
                t_toks, t_pre, t_dec = torch_model.generate(tp, ARGS.new_tokens, context,
                                                            torch.float32 if dtype == "fp32" else torch.bfloat16)
                if tt is None or t_dec < tt[2]:
                    tt = (t_toks, t_pre, t_dec)
            t_toks, t_pre, t_dec = tt
            same = sum(int(a == b) for a, b in zip(np.array(toks).ravel().tolist(), t_toks.numpy().ravel().tolist()))
            # Per position, without the cascade of a first difference: PyTorch's argmax over the
            # runner's own sequence (prompt + its tokens) at each generated position.
            full = torch.cat([tp, torch.tensor(toks, dtype=torch.long)], 1)[:, :-1]
            tf = torch_model.teacher_forced_argmax(full, context)[:, ARGS.prompt_len - 1:]
            agree = (tf == torch.tensor(toks, dtype=torch.long)).float().mean().item()
            rec = {"kv_dtype": dtype, "batch": B, "max_batch": max_batch,
                   "runner_prefill_tok_s": st["prefill_tokens"] / st["prefill_s"],
                   "runner_decode_tok_s": st["decode_tokens"] / st["decode_s"],
                   "torch_prefill_tok_s": B * ARGS.prompt_len / t_pre,
                   "torch_decode_tok_s": B * (ARGS.new_tokens - 1) / t_dec,
                   "same_tokens": same / (B * ARGS.new_tokens), "argmax_agreement": agree,
                   "kv_cache_bytes": st["kv_cache_bytes"], "plan_kv_cache_bytes": st["plan"]["kv_cache_bytes"],
                   "peak_bytes": st["peak_bytes"], "plan_weights_bytes": st["plan"]["weights_bytes"]}
            rec["prefill_ratio"] = rec["runner_prefill_tok_s"] / rec["torch_prefill_tok_s"]
            rec["decode_ratio"] = rec["runner_decode_tok_s"] / rec["torch_decode_tok_s"]
            results.append(rec)
            if ARGS.json:
                print(json.dumps(rec), flush=True)
            else:
                print(f"{dtype} B={B:3d}/{max_batch}: prefill runner {rec['runner_prefill_tok_s']:8.0f} tok/s torch "
                      f"{rec['torch_prefill_tok_s']:8.0f} (x{rec['prefill_ratio']:.2f}) | decode runner "
                      f"{rec['runner_decode_tok_s']:7.0f} tok/s torch {rec['torch_decode_tok_s']:7.0f} "
                      f"(x{rec['decode_ratio']:.2f}) | same tokens {100 * rec['same_tokens']:.0f}%, argmax agreement "
                      f"{100 * agree:.1f}% | KV "
                      f"{rec['kv_cache_bytes']} B (plan {rec['plan_kv_cache_bytes']:.0f}) | peak B: params "
                      f"{st['peak_bytes']['parameters']} (plan {st['plan']['weights_bytes']:.0f}) kv_cache "
                      f"{st['peak_bytes']['kv_cache']} grads {st['peak_bytes']['gradients']} act "
                      f"{st['peak_bytes']['activations']} ws {st['peak_bytes']['workspace']}", flush=True)
        # One past the plan's largest batch: the cache no longer fits, and the runner says so.
        _, res, r = runner_generate(max_batch + 1, dtype, memory_gb, check=False)
        msg = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
        line = {"kv_dtype": dtype, "batch": max_batch + 1, "refused": r.returncode == 2, "message": msg}
        print(json.dumps(line) if ARGS.json else f"{dtype} B={max_batch + 1}: exit {r.returncode}: {msg}", flush=True)
    shutil.rmtree(tmp, ignore_errors=True)
    return results


if __name__ == "__main__":
    main()
