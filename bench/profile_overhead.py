#!/usr/bin/python3
"""What profiling costs: the quickstart model trained by `runner train` with the medium depth
off (the peer) and on (`--profile 2:STEPS`, every step but the first profiled), round-robin in
one run. The coarse breakdown and the monitor are always on, in both.

Prints each run's median step time (over every step but the first) as it goes, so the noise
between runs of one mode is visible beside the difference between modes; then per mode the
median over all those steps, the ratio on/off, and the range of the ratios of each off/on pair.
Runs alternate --repeats times so that both see the machine's load alike.

    /usr/bin/python3 bench/profile_overhead.py [--steps N] [--repeats R] [--runner build/runner]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def step_times(run_dir):
    out = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            if "breakdown" in j and j["step"] > 1:
                out.append(j["step_ms"])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--runner", default=os.path.join(ROOT, "build", "runner"))
    a = ap.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="2", OMP_WAIT_POLICY="PASSIVE")
    modes = {"off": [], "on": ["--profile", f"2:{a.steps}"]}
    times = {m: [] for m in modes}
    run_medians = {m: [] for m in modes}
    tmp = tempfile.mkdtemp(prefix="runner_profile_bench_")
    try:
        for rep in range(a.repeats):
            for m, extra in modes.items():
                d = os.path.join(tmp, f"{m}{rep}")
                cmd = [a.runner, "train", os.path.join(ROOT, "recipes", "quickstart.yaml"), "--quiet", "--run-dir", d,
                       "--set", f"train.steps={a.steps}", "--set", "train.eval_every=0", "--set", "train.threads=2",
                       "--set", "checkpoint.every_steps=100000"] + extra
                p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                if p.returncode != 0:
                    sys.exit(f"failed: {' '.join(cmd)}\n{p.stdout[-2000:]}")
                if m == "on" and not os.path.exists(os.path.join(d, "profile.json")):
                    sys.exit("--profile wrote no profile.json")
                t = step_times(d)
                times[m] += t
                run_medians[m].append(statistics.median(t))
                print(f"  run {rep + 1}/{a.repeats} profile {m:<3}  median {run_medians[m][-1]:8.2f} ms", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = {m: statistics.median(t) for m, t in times.items()}
    print(f"quickstart, {a.steps} steps x {a.repeats} runs per mode, 2 threads; median step ms over steps 2..N")
    for m in modes:
        print(f"  profile {m:<3}  {med[m]:8.2f} ms  ({len(times[m])} steps)")
    print(f"  on / off     {med['on'] / med['off']:8.3f}")
    pairs = [on / off for on, off in zip(run_medians["on"], run_medians["off"])]
    print(f"  per-pair on / off: {', '.join(f'{r:.3f}' for r in pairs)} (min {min(pairs):.3f}, max {max(pairs):.3f})")
    spread = {m: (max(v) - min(v)) / statistics.median(v) for m, v in run_medians.items()}
    print(f"  run-to-run spread of the medians: off {100 * spread['off']:.1f}%, on {100 * spread['on']:.1f}%")


if __name__ == "__main__":
    main()
