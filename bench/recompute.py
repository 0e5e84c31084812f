#!/usr/bin/python3
"""Activation recompute, side by side on one model: none (the peer), full, selective
(attention core) and auto, each trained by `runner train` in the same run.

Prints per mode the median step time, the measured peak of the activations account (the
allocator's, from the run's metrics.jsonl summary) beside the plan's prediction, and as ratios
against none: the step-time overhead and the activation saving. Auto needs a device that the
model does not fit without recompute; it gets one sized to demand --demand (default 35%) of
none's activation peak back, so it must choose, and the line says what it chose (plan.json).

Modes run round-robin --repeats times (the machine's load drifts; each mode sees it alike) and
each mode's step time is the median over every step but the first of each run.

    /usr/bin/python3 bench/recompute.py [--steps N] [--repeats R] [--demand 0.35] [--runner build/runner]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from common import metrics_records, omp_env, write_bench_recipe, write_tokens

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The "small" model of bench/train_vs_torch.py, one micro-batch of 8 sequences of 256 tokens per step.
MODEL = dict(vocab=256, seq=256, d_model=384, layers=6, heads=6)
MICRO = 8
MODES = {
    "none": [],
    "full": ["recompute.mode=full"],
    "selective": ["recompute.mode=selective", "recompute.modules=[attention_core]"],
    "auto": ["recompute.mode=auto"],  # plus the device, below
}


def gib(b):
    return f"{b / 2**20:.1f} MiB"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--demand", type=float, default=0.35, help="fraction of none's activation peak auto must save")
    ap.add_argument("--runner", default=os.path.join(ROOT, "build", "runner"))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="runner_bench_recompute_")
    data = write_tokens(os.path.join(work, "tokens.bin"), MODEL["vocab"], n=1_000_000)
    recipe = write_bench_recipe(os.path.join(work, "bench.yaml"), "bench_recompute", MODEL, data,
                                batch=f"global: {MICRO}, micro: {MICRO}",
                                train=f"steps: {args.steps}, log_every: 1000, eval_every: 0, eval_batches: 1, threads: {args.threads}")
    env = omp_env(args.threads)

    def plan(sets):
        cmd = [args.runner, "plan", recipe, "--json"]
        for s in sets:
            cmd += ["--set", s]
        return json.loads(subprocess.run(cmd, check=True, env=env, capture_output=True, text=True).stdout)

    # Auto's device: none's total less `demand` of none's activations.
    p_none = plan([])
    st = p_none["stages"][0]
    device = st["total_bytes"] - args.demand * st["activations_bytes"]
    MODES["auto"] = MODES["auto"] + ["hardware.device=custom", f"hardware.memory_gb={device / 2**30:.9f}"]

    steps_ms = {m: [] for m in MODES}
    summary, plans = {}, {}
    for rep in range(args.repeats):
        for mode, sets in MODES.items():
            run_dir = os.path.join(work, f"{mode}_{rep}")
            cmd = [args.runner, "train", recipe, "--quiet", "--run-dir", run_dir]
            for s in sets:
                cmd += ["--set", s]
            subprocess.run(cmd, check=True, env=env)
            recs = metrics_records(run_dir)
            steps = [r for r in recs if "step" in r and "loss" in r and not r.get("summary")]
            steps_ms[mode] += [r["step_ms"] for r in steps[1:]]
            summary[mode] = [r for r in recs if r.get("summary")][-1]
            with open(os.path.join(run_dir, "plan.json")) as f:
                plans[mode] = json.load(f)

    print(f"model: vocab {MODEL['vocab']}, seq {MODEL['seq']}, d {MODEL['d_model']}, {MODEL['layers']} layers, "
          f"{MODEL['heads']} heads; micro-batch {MICRO}; {args.steps} steps x {args.repeats} runs per mode, "
          f"{args.threads} threads; auto's device {gib(device)} (none needs {gib(st['total_bytes'])})")
    print(f"{'mode':<10} {'step ms':>8} {'overhead':>9} {'act. peak':>11} {'planned':>11} {'saving':>7}")
    base_ms = statistics.median(steps_ms["none"])
    base_act = summary["none"]["ledger"]["activations"]["measured"]
    for mode in MODES:
        ms = statistics.median(steps_ms[mode])
        act = summary[mode]["ledger"]["activations"]
        print(f"{mode:<10} {ms:>8.0f} {100 * (ms / base_ms - 1):>+8.1f}% {gib(act['measured']):>11} "
              f"{gib(act['predicted']):>11} {100 * (1 - act['measured'] / base_act):>6.1f}%")
    rc = plans["auto"].get("recompute", {})
    kinds = {}
    for c in rc.get("chosen", []):
        kinds.setdefault(c["module"], []).append(c["layer"])
    print("auto chose: " + ("; ".join(f"{m} in layers {sorted(l)}" for m, l in kinds.items()) or "nothing") +
          "; rule of thumb (>15% of a layer's activations): " + (", ".join(rc.get("rule_of_thumb", [])) or "none"))
    for m in rc.get("modules", []):
        print(f"  one layer, {m['module']:<15} alone saves {gib(m['bytes_saved_alone']):>9} for "
              f"{m['flops_alone'] / 1e9:6.2f} GFLOP ({m['bytes_per_flop']:.4f} B/FLOP), holds {100 * m['share_of_layer']:.0f}%")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
