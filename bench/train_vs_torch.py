#!/usr/bin/python3
"""Training throughput: runner vs PyTorch and llm.c (fp32), same model, batch, sequence and threads.

Runs, in one invocation and on the same machine state, `runner train` on a synthetic
token file, bench/torch_gpt.py (PyTorch's own tuned training loop) and, on GPT-2 124M,
llm.c's CPU trainer (from a checkout of https://github.com/karpathy/llm.c given with --llmc DIR
or RUNNER_LLMC_DIR: its train_gpt2.c, driven by bench/bench_llmc.c, built in a temporary folder
with gcc -Ofast -march=native -fopenmp as llm.c's Makefile does, fed a random-init checkpoint
and a token file written here in its formats), then prints tokens/s of each, the ratios, MFU
against the runner's measured sgemm peak and the CPU's flags. Without a checkout the llm.c
column is skipped and the script says how to get one.

    /usr/bin/python3 bench/train_vs_torch.py [--configs small,gpt2] [--steps N] [--threads 2]
        [--llmc DIR] [--llmc-steps 4] [--runner BIN]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from common import omp_env, run_summary, write_bench_recipe, write_tokens

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = {
    # name: vocab, seq, d_model, layers, heads, batch, steps
    "small": dict(vocab=256, seq=256, d_model=384, layers=6, heads=6, batch=8, steps=30),
    "gpt2": dict(vocab=50257, seq=64, d_model=768, layers=12, heads=12, batch=4, steps=12),
}


def run_runner(cfg, steps, threads, work, runner):
    data = write_tokens(os.path.join(work, f"tokens_{cfg['vocab']}.bin"), cfg["vocab"])
    recipe = write_bench_recipe(os.path.join(work, "bench.yaml"), "bench", cfg, data,
                                batch=f"micro: {cfg['batch']}, accum: 1",
                                train=f"steps: {steps}, log_every: 1000, eval_batches: 1, threads: {threads}")
    run_dir = os.path.join(work, "run")
    # The MFU columns divide by the sgemm peak measured in this run (RUNNER_PEAK_CACHE=off): a
    # per-machine cached peak measured once under other load (74 GFLOP/s at 2 threads was seen
    # cached against 88 at 1 thread) would move both MFU columns by the cache's error.
    subprocess.run([runner, "train", recipe, "--quiet", "--run-dir", run_dir],
                   check=True, env=omp_env(threads, RUNNER_PEAK_CACHE="off"))
    summary = run_summary(run_dir)
    return summary["tokens_per_s"], summary["peak_flops"]


def run_torch(cfg, steps, threads):
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    out = subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "bench", "torch_gpt.py"), "--vocab", str(cfg["vocab"]),
                          "--seq", str(cfg["seq"]), "--d-model", str(cfg["d_model"]), "--layers", str(cfg["layers"]),
                          "--heads", str(cfg["heads"]), "--batch", str(cfg["batch"]), "--steps", str(steps),
                          "--threads", str(threads), "--json"], check=True, env=env, capture_output=True, text=True)
    line = [l for l in out.stdout.splitlines() if l.startswith("{")][-1]
    return json.loads(line)["tokens_per_s"]


LLMC_HOWTO = ("llm.c is not part of this repository; to time it, get a checkout "
               "(git clone https://github.com/karpathy/llm.c) and pass --llmc DIR (or set RUNNER_LLMC_DIR=DIR)")


def llmc_checkout(given):
    """The llm.c checkout to build from (--llmc, else RUNNER_LLMC_DIR), or None when none is given.
    A directory without llm.c's CPU trainer in it is an error, not a skip: the user asked for it."""
    d = given or os.environ.get("RUNNER_LLMC_DIR") or None
    if d is None:
        return None
    d = os.path.abspath(os.path.expanduser(d))
    if not os.path.isfile(os.path.join(d, "train_gpt2.c")) or not os.path.isdir(os.path.join(d, "llmc")):
        raise SystemExit(f"{d}: not an llm.c checkout (no train_gpt2.c and llmc/ there); {LLMC_HOWTO}")
    return d


def build_llmc(work, llmc_dir):
    """llm.c's trainer from the checkout llmc_dir, built into work with the flags of its own
    Makefile (-Ofast, OpenMP) plus -march=native; the driver is bench/bench_llmc.c."""
    exe = os.path.join(work, "llmc_train")
    subprocess.run(["gcc", "-Ofast", "-march=native", "-fopenmp", "-DOMP", "-Wno-unused-result", "-I", llmc_dir,
                    os.path.join(ROOT, "bench", "bench_llmc.c"), "-lm", "-o", exe], check=True)
    return exe


def write_llmc_inputs(cfg, work):
    """A random-init checkpoint and a token file in llm.c's formats (train_gpt2.c's
    gpt2_build_from_checkpoint, llmc/dataloader.h): a 256-int header, then the payload."""
    C, L, V, NH = cfg["d_model"], cfg["layers"], cfg["vocab"], cfg["heads"]
    Vp, maxT = (V + 127) // 128 * 128, max(1024, cfg["seq"])  # llm.c pads the vocabulary to 128
    header = np.zeros(256, dtype=np.int32)
    header[:8] = [20240326, 3, maxT, V, L, NH, C, Vp]
    # fill_in_parameter_sizes' order; norms' weights 1, biases 0, matrices N(0, 0.02).
    sizes = [("w", Vp * C), ("w", maxT * C), ("1", L * C), ("0", L * C), ("w", L * 3 * C * C), ("0", L * 3 * C),
             ("w", L * C * C), ("0", L * C), ("1", L * C), ("0", L * C), ("w", L * 4 * C * C), ("0", L * 4 * C),
             ("w", L * 4 * C * C), ("0", L * C), ("1", C), ("0", C)]
    rng = np.random.default_rng(0)
    ckpt = os.path.join(work, "llmc_model.bin")
    with open(ckpt, "wb") as f:
        header.tofile(f)
        for kind, n in sizes:
            if kind == "w":
                (rng.standard_normal(n, dtype=np.float32) * np.float32(0.02)).tofile(f)
            else:
                np.full(n, 1.0 if kind == "1" else 0.0, dtype=np.float32).tofile(f)
    tokens = rng.integers(0, V, size=1_000_000, dtype=np.uint16)
    theader = np.zeros(256, dtype=np.int32)
    theader[:3] = [20240520, 1, tokens.size]
    data = os.path.join(work, "llmc_tokens.bin")
    with open(data, "wb") as f:
        theader.tofile(f)
        tokens.tofile(f)
    return ckpt, data


def run_llmc(cfg, steps, threads, work, llmc_dir):
    exe = build_llmc(work, llmc_dir)
    ckpt, data = write_llmc_inputs(cfg, work)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_WAIT_POLICY="PASSIVE")
    out = subprocess.run([exe, ckpt, data, str(cfg["batch"]), str(cfg["seq"]), str(steps)], check=True, env=env,
                         capture_output=True, text=True)
    line = [l for l in out.stdout.splitlines() if l.startswith("{")][-1]
    return json.loads(line)["tokens_per_s"]


def cpu_flags():
    """The flags that decide the GEMM paths: AVX-512, AVX512-BF16, AMX."""
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
    except OSError:
        return "unknown"
    flags = next((l.split(":", 1)[1].split() for l in info.splitlines() if l.startswith("flags")), [])
    model = next((l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith("model name")), "?")
    have = {f: f in flags for f in ("avx512f", "avx512_bf16", "amx_bf16", "amx_tile")}
    return f"{model}; " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in have.items())


def flops_per_token(cfg):
    C, L, V, T = cfg["d_model"], cfg["layers"], cfg["vocab"], cfg["seq"]
    params = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C
    return 6 * params + 12 * L * T * C


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", default="small,gpt2")
    ap.add_argument("--steps", type=int, default=0, help="timed steps (0: per-config default)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runner", default=os.path.join(ROOT, "build", "runner"), help="the runner binary to time")
    ap.add_argument("--llmc", metavar="DIR", default=None,
                    help="a checkout of github.com/karpathy/llm.c to build the llm.c peer from (default: $RUNNER_LLMC_DIR; "
                         "none: the llm.c peer is skipped)")
    ap.add_argument("--llmc-steps", type=int, default=4, help="llm.c steps on gpt2 (0: skip llm.c)")
    args = ap.parse_args()
    llmc_dir = llmc_checkout(args.llmc) if args.llmc_steps > 0 else None
    if args.llmc_steps > 0 and llmc_dir is None and "gpt2" in args.configs.split(","):
        print(f"llm.c peer skipped: {LLMC_HOWTO}", flush=True)
    print(f"CPU: {cpu_flags()}", flush=True)
    rows = []
    for name in args.configs.split(","):
        cfg = CONFIGS[name]
        steps = args.steps or cfg["steps"]
        with tempfile.TemporaryDirectory() as work:
            ours, peak = run_runner(cfg, steps + 2, args.threads, work, args.runner)
        theirs = run_torch(cfg, steps, args.threads)
        llmc = 0.0
        if name == "gpt2" and llmc_dir is not None:  # llm.c's trainer is GPT-2's architecture at GPT-2's shapes
            with tempfile.TemporaryDirectory() as work:
                llmc = run_llmc(cfg, args.llmc_steps + 1, args.threads, work, llmc_dir)
        fpt = flops_per_token(cfg)
        rows.append((name, ours, theirs, llmc, fpt * ours / peak, fpt * theirs / peak, peak))
        extra = f" | llm.c {llmc:,.0f} tok/s | ratio {ours / llmc:.2f}x" if llmc else ""
        print(f"{name}: runner {ours:,.0f} tok/s | pytorch {theirs:,.0f} tok/s | ratio {ours / theirs:.2f}x{extra}", flush=True)
    print()
    print(f"{'config':<8} {'runner tok/s':>13} {'pytorch tok/s':>14} {'ratio':>7} {'llm.c tok/s':>12} {'ratio':>7}"
          f" {'runner MFU':>11} {'torch MFU':>10}   (sgemm peak)")
    for name, ours, theirs, llmc, mo, mt, peak in rows:
        lc = f"{llmc:>12,.1f} {ours / llmc:>6.2f}x" if llmc else f"{'-':>12} {'-':>7}"
        print(f"{name:<8} {ours:>13,.0f} {theirs:>14,.0f} {ours / theirs:>6.2f}x {lc}"
              f" {100 * mo:>10.0f}% {100 * mt:>9.0f}%   ({peak / 1e9:.0f} GFLOP/s)")


if __name__ == "__main__":
    sys.exit(main())
