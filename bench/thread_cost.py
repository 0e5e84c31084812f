#!/usr/bin/python3
"""What thread-count independence costs: step time of this build's runner against
another build (--base, e.g. one built from the commit before the fixed blocking), same recipes,
same threads, runs alternated so that machine noise hits both alike.

    /usr/bin/python3 bench/thread_cost.py --base /path/to/base/build/runner [--configs small,gpt2]
        [--precisions fp32,bf16] [--repeats 3] [--threads 2]

Prints, per config and precision, each run's median step time (steps after the first two), the
median over repeats for each binary, and the ratio this/base (> 1: slower). The configs are
bench/train_vs_torch.py's.

    /usr/bin/python3 bench/thread_cost.py --dweight [--configs small,gpt2] [--repeats 3]

needs no second build: the part of bf16's cost that lies in the weight gradient's fixed tiles
(ops/cpu/cpu_backend.cpp, dnnl_dweight_fixed; the rest of the fixed blocking was measured at
0.1% of a step, bench/README.md), from build/bench_kernels --dweight (each Linear's dW as the
runner computes it against one oneDNN call splitting as it likes, summed over a step) over
this runner's bf16 step time measured in the same run.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from common import metrics_records, omp_env, write_bench_recipe, write_tokens  # noqa: E402
from train_vs_torch import CONFIGS  # noqa: E402


def write_recipe(cfg, steps, threads, prec, work):
    data = write_tokens(os.path.join(work, f"tokens_{cfg['vocab']}.bin"), cfg["vocab"])
    return write_bench_recipe(os.path.join(work, "bench.yaml"), "bench", cfg, data,
                              batch=f"micro: {cfg['batch']}, accum: 1",
                              train=f"steps: {steps}, log_every: 1000, eval_batches: 1, eval_every: 0, threads: {threads}",
                              extra=[f"precision: {{compute: {prec}}}"])


def step_ms(binary, recipe, threads, work):
    run_dir = os.path.join(work, "run")
    subprocess.run(["rm", "-rf", run_dir], check=True)
    subprocess.run([binary, "train", recipe, "--quiet", "--run-dir", run_dir], check=True, env=omp_env(threads))
    recs = metrics_records(run_dir)
    ms = [r["step_ms"] for r in recs if isinstance(r.get("step_ms"), (int, float)) and not r.get("summary")
          and not r.get("eval") and r.get("step", 0) > 2]
    return statistics.median(ms)


def dweight_cost(a):
    env = omp_env(a.threads)
    this = os.path.join(ROOT, "build", "runner")
    with tempfile.TemporaryDirectory() as work:
        for name in a.configs.split(","):
            cfg = CONFIGS[name]
            recipe = write_recipe(cfg, a.steps or (12 if name == "small" else 8), a.threads, "bf16", work)
            extra, steps = [], []
            for _ in range(a.repeats):  # alternated: the machine's noise hits both alike
                out = subprocess.run([os.path.join(ROOT, "build", "bench_kernels"), "--dweight"], check=True,
                                     env=env, capture_output=True, text=True).stdout
                d = json.loads(out.split("DWEIGHT_JSON ", 1)[1])[name]
                extra.append(d["fixed_ms"] - d["split_ms"])
                steps.append(step_ms(this, recipe, a.threads, work))
            e, st = statistics.median(extra), statistics.median(steps)
            print(f"{name:6s} bf16  {a.threads} threads  dW fixed tiles - oneDNN's split: {e:+7.2f} ms a step "
                  f"(runs {', '.join(f'{x:+.1f}' for x in extra)}), step {st:7.1f} ms: {100 * e / st:+.2f}% of the step",
                  flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", help="the runner binary to compare with")
    ap.add_argument("--dweight", action="store_true", help="the 16-bit weight gradient's share, without --base")
    ap.add_argument("--configs", default="small,gpt2")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=0, help="steps per run (0: 12 small, 8 gpt2)")
    a = ap.parse_args()
    if a.dweight:
        return dweight_cost(a)
    if not a.base:
        ap.error("--base BINARY (or --dweight) is required")
    this = os.path.join(ROOT, "build", "runner")
    with tempfile.TemporaryDirectory() as work:
        for name in a.configs.split(","):
            cfg = CONFIGS[name]
            steps = a.steps or (12 if name == "small" else 8)
            for prec in a.precisions.split(","):
                recipe = write_recipe(cfg, steps, a.threads, prec, work)
                runs = {"base": [], "this": []}
                for _ in range(a.repeats):
                    for label, binary in (("base", a.base), ("this", this)):
                        runs[label].append(step_ms(binary, recipe, a.threads, work))
                b, t = statistics.median(runs["base"]), statistics.median(runs["this"])
                print(f"{name:6s} {prec:5s} {a.threads} threads  base {b:8.1f} ms  this {t:8.1f} ms  ratio {t / b:.3f}  "
                      f"(runs base {', '.join(f'{x:.0f}' for x in runs['base'])}; this {', '.join(f'{x:.0f}' for x in runs['this'])})",
                      flush=True)


if __name__ == "__main__":
    main()
