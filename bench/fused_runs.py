#!/usr/bin/python3
"""Whole training runs with model.fuse on and off (ops/op_fused.cpp): CPU time.

    /usr/bin/python3 bench/fused_runs.py [--configs small,gpt2] [--steps N] [--pairs P] [--runner BIN]

Runs `runner train` on the same fp32 recipe (random tokens, dropout 0) with model.fuse false
and true, alternately (P pairs, so that both see the same load), and prints each run's user +
system CPU seconds (what a shared machine's load disturbs least; start-up included), wall
seconds, the median step and backward ms after the first step (metrics.jsonl), the medians and
the ratios fused / unfused, the peak bytes, and whether the losses are equal (they must be: the
fused operators are bit-identical). Print `uptime` beside the numbers: the machine is shared.
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = {
    # name: vocab, seq, d_model, layers, heads, micro-batch (the quickstart's size; GPT-2 124M at seq 64)
    "small": dict(vocab=256, seq=256, d_model=384, layers=6, heads=6, batch=8),
    "gpt2": dict(vocab=50257, seq=64, d_model=768, layers=12, heads=12, batch=4),
}


def write_recipe(cfg, steps, threads, work, fuse):
    data = os.path.join(work, "tokens.bin")
    if not os.path.exists(data):
        np.random.default_rng(0).integers(0, cfg["vocab"], size=500_000, dtype=np.uint16).tofile(data)
    recipe = os.path.join(work, f"fuse-{fuse}.yaml")
    with open(recipe, "w") as f:
        f.write(f"""name: bench
model: {{vocab_size: {cfg['vocab']}, seq_len: {cfg['seq']}, d_model: {cfg['d_model']}, n_layers: {cfg['layers']}, n_heads: {cfg['heads']}, dropout: 0.0, fuse: {str(fuse).lower()}}}
data: {{kind: bin, path: {data}}}
batch: {{micro: {cfg['batch']}, accum: 1}}
optimizer: {{lr: 3.0e-4}}
train: {{steps: {steps}, log_every: 1, eval_batches: 1, threads: {threads}}}
checkpoint: {{cadence: never}}
""")
    return recipe


def run(runner, recipe, run_dir, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_WAIT_POLICY="PASSIVE", RUNNER_PEAK_CACHE="off")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    subprocess.run([runner, "train", recipe, "--quiet", "--run-dir", run_dir], check=True, env=env)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        steps = [r for r in map(json.loads, f) if "loss" in r and "step_ms" in r and not r.get("summary")]
    losses = [r["loss"] for r in steps]
    # Median step and backward ms over the steps after the first (warm-up), and the peak bytes.
    later = steps[1:] or steps
    step_ms = statistics.median(r["step_ms"] for r in later)
    bwd_ms = statistics.median(r["backward_ms"] for r in later)
    return cpu, wall, losses, step_ms, bwd_ms, steps[-1]["peak_bytes"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--configs", default="small,gpt2")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runner", default=os.path.join(ROOT, "build", "runner"))
    args = ap.parse_args()
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    for name in args.configs.split(","):
        cfg = CONFIGS[name]
        with tempfile.TemporaryDirectory() as work:
            cpu = {False: [], True: []}
            wall = {False: [], True: []}
            step = {False: [], True: []}
            bwd = {False: [], True: []}
            peak = {}
            losses = {}
            for p in range(args.pairs):
                for fuse in (False, True) if p % 2 == 0 else (True, False):
                    recipe = write_recipe(cfg, args.steps, args.threads, work, fuse)
                    c, w, l, sm, bm, pk = run(args.runner, recipe, os.path.join(work, f"run-{fuse}-{p}"), args.threads)
                    cpu[fuse].append(c)
                    wall[fuse].append(w)
                    step[fuse].append(sm)
                    bwd[fuse].append(bm)
                    peak[fuse] = pk
                    losses[fuse] = l
            mc = {f: statistics.median(v) for f, v in cpu.items()}
            mw = {f: statistics.median(v) for f, v in wall.items()}
            print(f"{name}: {args.steps} steps, {args.threads} threads, {args.pairs} pairs")
            print(f"  CPU s  unfused {[round(x, 1) for x in cpu[False]]}  fused {[round(x, 1) for x in cpu[True]]}"
                  f"  median ratio fused/unfused {mc[True] / mc[False]:.3f}")
            print(f"  wall s unfused {[round(x, 1) for x in wall[False]]}  fused {[round(x, 1) for x in wall[True]]}"
                  f"  median ratio fused/unfused {mw[True] / mw[False]:.3f}")
            for what, d in (("step ms", step), ("bwd ms", bwd)):
                med = {f: statistics.median(v) for f, v in d.items()}
                print(f"  {what:6} unfused {[round(x) for x in d[False]]}  fused {[round(x) for x in d[True]]}"
                      f"  median ratio fused/unfused {med[True] / med[False]:.3f}")
            print(f"  peak bytes (all accounts) unfused {peak[False]:,}  fused {peak[True]:,}")
            print(f"  losses equal: {losses[True] == losses[False]} (last {losses[True][-1:]} vs {losses[False][-1:]})")
    print("uptime:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
