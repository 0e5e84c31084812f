#!/usr/bin/python3
"""The layout search's own speed: recipes/llama-70b-64gpu.yaml with its layout left to the
search (`parallel: auto`, the global batch of 1024 kept, recompute searched) on H100 nodes of 8,
searched by `runner plan --search` at 64, 256 and 1,024 GPUs.

Prints per world size the search's own seconds (as it reports them, and the process's wall
and CPU time: on a loaded machine the CPU time is the steadier figure), the layouts searched and how many fit, layouts per second, the winner, and the ratio to
the search's speed goal (a 70B recipe on 1,024 GPUs in under 30 s on this machine). Each world size
runs --repeats times and the median is shown (the machine's load drifts).

    /usr/bin/python3 bench/search_speed.py [--worlds 64,256,1024] [--repeats 1] [--runner build/runner]

--published: instead, every recipe in bench/published/ searched free on its own hardware's world
(parallel, batch.micro/accum and recompute removed, as bench/search_published.py's free search
does; a published uneven stage_layers split is kept with its pp, the search splitting layers
evenly only), against that goal: each under 10 s on 2 cores. Prints the search's seconds, wall and
CPU seconds, the counts (searched, planned that fit, skipped by the bound) and the ratio to 10 s.

    /usr/bin/python3 bench/search_speed.py --published [--only SUBSTR] [--runner build/runner]
"""
import argparse
import glob
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
PUBLISHED_GOAL_S = 10.0


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


def free_published(path, dst):
    """A published recipe with its layout fields removed (its uneven stage_layers and pp kept)."""
    import yaml
    r = yaml.safe_load(open(path))
    par = r.pop("parallel", {}) or {}
    if "stage_layers" in par:
        r["parallel"] = {k: par[k] for k in ("pp", "stage_layers") if k in par}
    r.pop("recompute", None)
    for k in ("micro", "accum"):
        r.get("batch", {}).pop(k, None)
    out = os.path.join(dst, os.path.basename(path))
    with open(out, "w") as f:
        yaml.safe_dump(r, f, sort_keys=False)
    return out


def published(args):
    paths = sorted(glob.glob(os.path.join(ROOT, "bench", "published", "*.yaml")))
    paths = [p for p in paths if args.only in os.path.basename(p)]
    print(f"cores: {os.cpu_count()} | load average: {os.getloadavg()[0]:.1f} (others' work slows the search)")
    print(f"{'recipe':<28} {'GPUs':>6} {'search s':>9} {'wall s':>8} {'cpu s':>7} {'searched':>9} {'fit':>6} "
          f"{'bounded':>8} {'goal ratio':>10}")
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for path in paths:
            free = free_published(path, tmp)
            cmd = [args.runner, "plan", free, "--search", "--json", "--top", "1", "--no-data-check",
                   "--set", "parallel.auto=true"]
            t0, cpu0 = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
            p = subprocess.run(cmd, capture_output=True, text=True)
            wall, cpu1 = time.monotonic() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
            name = os.path.splitext(os.path.basename(path))[0]
            if p.returncode != 0:
                print(f"{name:<28} failed: {(p.stderr or p.stdout).strip().splitlines()[-1:]}")
                continue
            s = json.loads(p.stdout)["search"]
            worst = max(worst, s["seconds"])
            print(f"{name:<28} {s['world']:>6} {s['seconds']:>9.2f} {wall:>8.2f} {cpu:>7.2f} {s['searched']:>9} "
                  f"{s['feasible']:>6} {s.get('skipped_by_bound', 0):>8} {s['seconds'] / PUBLISHED_GOAL_S:>10.2f}")
    print(f"goal ratio: the search's seconds / {PUBLISHED_GOAL_S:.0f} s (the goal: under 1 for every recipe); "
          f"worst {worst:.2f} s")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worlds", default="64,256,1024")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--runner", default=os.path.join(ROOT, "build", "runner"))
    ap.add_argument("--published", action="store_true", help="every bench/published recipe, against 10 s")
    ap.add_argument("--only", default="", help="--published: recipes whose file name has this")
    args = ap.parse_args()
    if args.published:
        return published(args)
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
