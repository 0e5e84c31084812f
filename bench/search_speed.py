#!/usr/bin/python3
"""The layout search's own speed: recipes/llama-70b-64gpu.yaml with its layout left to the
search (`parallel: auto`, the global batch of 1024 kept, recompute searched) on H100 nodes of 8,
searched by `runner plan --search` at 64, 256 and 1,024 GPUs.

Prints per world size the search's own seconds (as it reports them, and the process's wall
and CPU time: on a loaded machine the CPU time is the steadier figure), the layouts searched and how many fit, layouts per second, the winner, and the ratio to
the search's speed goal (a 70B recipe on 1,024 GPUs in under 30 s on this machine). Each world size
runs --repeats times and the median is shown (the machine's load drifts).

    /usr/bin/python3 bench/search_speed.py [--worlds 64,256,1024] [--repeats 1] [--runner build/runner]
"""
import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOAL_S = 30.0


def auto_recipe(dst):
    """The 70B recipe with its parallel, batch and recompute sections replaced: layout searched."""
    with open(os.path.join(ROOT, "recipes", "llama-70b-64gpu.yaml")) as f:
        text = f.read()
    text = re.sub(r"\nparallel:\n(  .*\n)+", "\nparallel: auto\n", text)
    text = re.sub(r"\nbatch:\n(  .*\n)+", "\nbatch:\n  global: 1024\n", text)
    text = re.sub(r"\nrecompute:\n(  .*\n)+", "\n", text)
    path = os.path.join(dst, "llama-70b-auto.yaml")
    with open(path, "w") as f:
        f.write(text)
    return path


def search_once(runner, recipe, world):
    cmd = [runner, "plan", recipe, "--search", "--json", "--top", "1", "--no-data-check",
           "--set", f"hardware.nodes={world // 8}"]
    t0, cpu0 = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    wall, cpu1 = time.monotonic() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
    return wall, json.loads(out)["search"], cpu


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worlds", default="64,256,1024")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--runner", default=os.path.join(ROOT, "build", "runner"))
    args = ap.parse_args()
    print(f"cores: {os.cpu_count()} | load average: {os.getloadavg()[0]:.1f} (others' work slows the search)")
    print(f"{'GPUs':>6} {'search s':>9} {'wall s':>8} {'cpu s':>7} {'searched':>9} {'fit':>6} {'layouts/s':>10} {'goal ratio':>10}  winner")
    with tempfile.TemporaryDirectory() as tmp:
        recipe = auto_recipe(tmp)
        for world in [int(w) for w in args.worlds.split(",")]:
            runs = [search_once(args.runner, recipe, world) for _ in range(args.repeats)]
            secs = statistics.median(r[1]["seconds"] for r in runs)
            wall = statistics.median(r[0] for r in runs)
            cpu = statistics.median(r[2] for r in runs)
            s = runs[0][1]
            c = s["candidates"][0]
            winner = (f"dp {c['dp']} x tp {c['tp']} x pp {c['pp']} {c['schedule']}"
                      f"{' v' + str(c['virtual_stages']) if c['virtual_stages'] > 1 else ''}, micro {c['micro']}, "
                      f"zero {c['zero']}, sp {int(c['sequence_parallel'])}, recompute {c['recompute']}: "
                      f"{c['predicted']['step_s']:.2f} s/step, MFU {100 * c['predicted']['mfu']:.1f}%")
            print(f"{world:>6} {secs:>9.2f} {wall:>8.2f} {cpu:>7.2f} {s['searched']:>9} {s['feasible']:>6} "
                  f"{s['searched'] / secs:>10.0f} {secs / GOAL_S:>10.2f}  {winner}")
    print(f"goal ratio: the search's seconds / {GOAL_S:.0f} s (the goal: under 1 at 1,024 GPUs); cpu s: the process's "
          "CPU time over all its threads (what a quiet machine's cores share; the search uses every core)")


if __name__ == "__main__":
    main()
