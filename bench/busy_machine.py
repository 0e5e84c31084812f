#!/usr/bin/python3
"""A run on a busy machine: the default OpenMP wait policy against the one before it, with busy
loops beside the run. Spinning OpenMP threads (libgomp's old default spins ~300,000 times before
it sleeps) fight whatever else runs; the runner now defaults to OMP_WAIT_POLICY=PASSIVE
(runner/train/startup.h, default_passive_waiting).

    /usr/bin/python3 bench/busy_machine.py [--busy N] [--steps 30] [--repeats 3] [--runner build/runner]

Starts N busy loops (default: 4 per core, as a machine with load 8 on 2 cores), then trains the
quickstart recipe for --steps steps with the default thread count (every core), alternately:
  default  OMP_WAIT_POLICY and GOMP_SPINCOUNT unset (the runner sets passive waiting itself)
  before   GOMP_SPINCOUNT=300000, libgomp's own default spin count, which the runner leaves alone
           (what a run got before the default changed)
and once on the idle machine with each. Prints each run's median step time (steps after the
first two) and the ratios before/default (> 1: the default is faster).
"""
import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def spin(stop_at):
    x = 0
    while time.time() < stop_at:
        x += 1


def median_step_ms(run_dir):
    ms = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            if isinstance(j.get("step_ms"), (int, float)) and "loss" in j and j.get("step", 0) > 2:
                ms.append(j["step_ms"])
    return statistics.median(ms)


def train(runner, work, name, extra_env, steps):
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")}
    env.update(extra_env)
    run_dir = os.path.join(work, name)
    cmd = [runner, "train", os.path.join(ROOT, "recipes", "quickstart.yaml"), "--quiet", "--run-dir", run_dir,
           "--set", f"train.steps={steps}", "train.eval_every=0", f"checkpoint.every_steps={steps}"]
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return median_step_ms(run_dir)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--runner", default=os.path.join(ROOT, "build", "runner"))
    p.add_argument("--busy", type=int, default=4 * (os.cpu_count() or 1))
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    modes = {"default": {}, "before": {"GOMP_SPINCOUNT": "300000"}}
    with tempfile.TemporaryDirectory() as work:
        idle = {m: train(a.runner, work, f"idle_{m}", env, a.steps) for m, env in modes.items()}
        print(f"idle machine: default {idle['default']:.1f} ms/step, before {idle['before']:.1f} ms/step, "
              f"before/default {idle['before'] / idle['default']:.2f}")
        loops = [multiprocessing.Process(target=spin, args=(time.time() + 3600,), daemon=True) for _ in range(a.busy)]
        for l in loops:
            l.start()
        busy = {m: [] for m in modes}
        try:
            for r in range(a.repeats):
                for m, env in modes.items():  # alternated, so that drift hits both alike
                    busy[m].append(train(a.runner, work, f"busy_{m}_{r}", env, a.steps))
                    print(f"  busy ({a.busy} loops), {m}: {busy[m][-1]:.1f} ms/step", flush=True)
        finally:
            for l in loops:
                l.terminate()
        d, b = statistics.median(busy["default"]), statistics.median(busy["before"])
        print(f"busy machine ({a.busy} busy loops on {os.cpu_count()} cores): default {d:.1f} ms/step, before {b:.1f} "
              f"ms/step, before/default {b / d:.2f}; default busy/idle {d / idle['default']:.2f}")


if __name__ == "__main__":
    sys.exit(main())
