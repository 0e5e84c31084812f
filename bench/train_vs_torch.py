#!/usr/bin/python3
"""Training throughput: runner vs PyTorch (fp32), same model, batch, sequence and threads.

Runs, in one invocation and on the same machine state, `runner train` on a synthetic
token file and bench/torch_gpt.py (PyTorch's own tuned training loop), then prints
tokens/s of each, the ratio, and MFU against the runner's measured sgemm peak.

    /usr/bin/python3 bench/train_vs_torch.py [--configs small,gpt2] [--steps N] [--threads 2]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = {
    # name: vocab, seq, d_model, layers, heads, batch, steps
    "small": dict(vocab=256, seq=256, d_model=384, layers=6, heads=6, batch=8, steps=30),
    "gpt2": dict(vocab=50257, seq=64, d_model=768, layers=12, heads=12, batch=4, steps=12),
}


def run_runner(cfg, steps, threads, work):
    tokens = np.random.default_rng(0).integers(0, cfg["vocab"], size=2_000_000, dtype=np.uint16)
    data = os.path.join(work, "tokens.bin")
    tokens.tofile(data)  # nanoGPT's raw uint16 format
    recipe = os.path.join(work, "bench.yaml")
    with open(recipe, "w") as f:
        f.write(f"""name: bench
model: {{vocab_size: {cfg['vocab']}, seq_len: {cfg['seq']}, d_model: {cfg['d_model']}, n_layers: {cfg['layers']}, n_heads: {cfg['heads']}, dropout: 0.0}}
data: {{kind: bin, path: {data}}}
batch: {{micro: {cfg['batch']}, accum: 1}}
optimizer: {{lr: 3.0e-4}}
train: {{steps: {steps}, log_every: 1000, eval_batches: 1, threads: {threads}}}
checkpoint: {{cadence: never}}
""")
    run_dir = os.path.join(work, "run")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_WAIT_POLICY="PASSIVE")
    subprocess.run([os.path.join(ROOT, "build", "runner"), "train", recipe, "--quiet", "--run-dir", run_dir],
                   check=True, env=env)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        recs = [json.loads(l) for l in f]
    summary = [r for r in recs if r.get("summary")][-1]
    return summary["tokens_per_s"], summary["peak_flops"]


def run_torch(cfg, steps, threads):
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    out = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "bench", "torch_gpt.py"), "--vocab", str(cfg["vocab"]),
                          "--seq", str(cfg["seq"]), "--d-model", str(cfg["d_model"]), "--layers", str(cfg["layers"]),
                          "--heads", str(cfg["heads"]), "--batch", str(cfg["batch"]), "--steps", str(steps),
                          "--threads", str(threads), "--json"], check=True, env=env, capture_output=True, text=True)
    line = [l for l in out.stdout.splitlines() if l.startswith("{")][-1]
    return json.loads(line)["tokens_per_s"]


def flops_per_token(cfg):
    C, L, V, T = cfg["d_model"], cfg["layers"], cfg["vocab"], cfg["seq"]
    params = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
    return 6 * params + 12 * L * T * C


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default="small,gpt2")
    ap.add_argument("--steps", type=int, default=0, help="timed steps (0: per-config default)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    rows = []
    for name in args.configs.split(","):
        cfg = CONFIGS[name]
        steps = args.steps or cfg["steps"]
        with tempfile.TemporaryDirectory() as work:
            ours, peak = run_runner(cfg, steps + 2, args.threads, work)
        theirs = run_torch(cfg, steps, args.threads)
        fpt = flops_per_token(cfg)
        rows.append((name, ours, theirs, ours / theirs, fpt * ours / peak, fpt * theirs / peak, peak))
        print(f"{name}: runner {ours:,.0f} tok/s | pytorch {theirs:,.0f} tok/s | ratio {ours / theirs:.2f}x", flush=True)
    print()
    print(f"{'config':<8} {'runner tok/s':>13} {'pytorch tok/s':>14} {'ratio':>7} {'runner MFU':>11} {'torch MFU':>10}   (sgemm peak)")
    for name, ours, theirs, ratio, mo, mt, peak in rows:
        print(f"{name:<8} {ours:>13,.0f} {theirs:>14,.0f} {ratio:>6.2f}x {100 * mo:>10.0f}% {100 * mt:>9.0f}%   ({peak / 1e9:.0f} GFLOP/s)")


if __name__ == "__main__":
    sys.exit(main())
