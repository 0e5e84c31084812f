#!/usr/bin/python3
"""Snapshot what a runner binary does, to prove a refactor changed nothing.

    scripts/behaviour_snapshot.py BUILD_DIR OUT_DIR [--quick]

writes into OUT_DIR:
  plans/       `runner plan` text and --json for every shipped recipe and layout variants
  runs/NAME/   for short runs on one rank and under mpirun (dp2 ZeRO-1, tp2 x pp2 with
               sequence parallelism, interleaved pp2, asynchronous saves, resume on another
               layout): metrics.jsonl without its timing fields, and every dataset and
               attribute of every checkpoint (dtype, shape, SHA-256 of the bytes)
Run it for the binary before and after a change and `diff -r` the two folders: any
difference is a change of behaviour. Timing fields (ms, tokens/s, MFU, wall time) are left
out; everything else must be byte-identical. Needs python3-h5py.
"""
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys

import h5py
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The tests' small layout model (tests/support/recipes.h), with 4 layers for the interleaved
# schedule, 6 steps and checkpoints at 3.
LAYOUT_SETS = ["--set", "model.n_layers=4", "--set", "train.steps=6", "--set", "train.log_every=3", "--set",
               "train.eval_every=3", "--set", "checkpoint.every_steps=3"]


def layout_recipe():
    with open(os.path.join(ROOT, "tests", "support", "recipes.h")) as f:
        m = re.search(r'kLayoutRecipe = R"\((.*?)\)";', f.read(), re.S)
    return m.group(1)

PLAN_VARIANTS = [
    [],
    ["--set", "parallel.tp=2"],
    ["--set", "parallel.pp=2", "--set", "parallel.zero=1"],
    ["--set", "recompute.mode=full"],
    ["--set", "recompute.mode=selective", "--set", "recompute.modules=[attention_core]"],
    ["--set", "precision.compute=bf16"],
]

TIMING = ("_ms", "tokens_per_s", "mfu", "wall_s", "peak_flops", "comm_hidden_fraction",
          "pipeline_idle_fraction", "top_ops", "breakdown", "breakdown_per_rank", "alerts")


def run(cmd, cwd=ROOT, env=None, check=True):
    e = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE", OMPI_ALLOW_RUN_AS_ROOT="1",
             OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    if env:
        e.update(env)
    p = subprocess.run(cmd, cwd=cwd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if check and p.returncode != 0:
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout[-3000:]}")
    return p


def strip_timing(v):
    if isinstance(v, dict):
        return {k: strip_timing(x) for k, x in v.items() if not any(k.endswith(t) or k == t for t in TIMING)}
    if isinstance(v, list):
        return [strip_timing(x) for x in v]
    return v


def dump_h5(path):
    lines = []
    with h5py.File(path, "r") as f:
        def attrs(name, obj):
            for k in sorted(obj.attrs):
                a = obj.attrs[k]
                a = a.tobytes().hex() if isinstance(a, np.ndarray) else repr(a)
                lines.append(f"{name} @{k} = {a}")

        def visit(name, obj):
            attrs(name, obj)
            if isinstance(obj, h5py.Dataset):
                data = obj[()]
                raw = data.tobytes() if isinstance(data, np.ndarray) else repr(data).encode()
                lines.append(f"{name} {obj.dtype} {obj.shape} {hashlib.sha256(raw).hexdigest()}")

        attrs("/", f)
        f.visititems(visit)
    return "\n".join(lines) + "\n"


def snapshot_run(run_dir, out):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f, open(os.path.join(out, "metrics.jsonl"), "w") as o:
        for line in f:
            j = json.loads(line)
            if "monitor" in j or "alert" in j:  # measured timings and what they triggered
                continue
            o.write(json.dumps(strip_timing(j), sort_keys=True) + "\n")
    ck = os.path.join(run_dir, "checkpoints")
    for name in sorted(os.listdir(ck)):
        if name.endswith(".h5"):
            with open(os.path.join(out, name + ".txt"), "w") as o:
                o.write(dump_h5(os.path.join(ck, name)))
    shutil.copy(os.path.join(run_dir, "recipe.yaml"), os.path.join(out, "recipe.yaml"))
    shutil.copy(os.path.join(run_dir, "plan.json"), os.path.join(out, "plan.json"))


def main():
    build, out = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    quick = "--quick" in sys.argv
    runner = os.path.join(build, "runner")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(os.path.join(out, "plans"))
    for rec in sorted(os.listdir(os.path.join(ROOT, "recipes"))):
        for i, v in enumerate(PLAN_VARIANTS):
            for fmt in ([], ["--json"]):
                p = run([runner, "plan", os.path.join("recipes", rec)] + v + fmt, check=False)
                name = f"{rec}.{i}{'.json' if fmt else '.txt'}"
                with open(os.path.join(out, "plans", name), "w") as o:
                    o.write(f"exit {p.returncode}\n{p.stdout}")
    work = os.path.join(out, "work")
    os.makedirs(work)
    layout = os.path.join(work, "layout.yaml")
    with open(layout, "w") as f:
        f.write(layout_recipe())
    mpirun = ["mpirun", "--oversubscribe", "-x", "OMP_NUM_THREADS=1"]
    runs = [
        ("serial", [runner, "train", "recipes/quickstart.yaml", "--set", "train.steps=20", "--set",
                    "checkpoint.every_steps=10", "--set", "train.eval_every=10", "--set", "train.threads=1"]),
        ("layout1", [runner, "train", layout] + LAYOUT_SETS),
    ]
    if not quick:
        runs += [
            ("dp2_zero1", mpirun + ["-np", "2", runner, "train", layout, *LAYOUT_SETS, "--set", "parallel.zero=1"]),
            ("tp2pp2_sp", mpirun + ["-np", "4", runner, "train", layout, *LAYOUT_SETS, "--set", "parallel.tp=2", "--set",
                                    "parallel.pp=2", "--set", "parallel.sequence_parallel=true"]),
            ("pp2_interleaved", mpirun + ["-np", "2", runner, "train", layout, *LAYOUT_SETS, "--set", "parallel.pp=2", "--set",
                                          "parallel.schedule=interleaved", "--set", "parallel.virtual_stages=2"]),
            ("dp2tp2_async", mpirun + ["-np", "4", runner, "train", layout, *LAYOUT_SETS, "--set", "parallel.tp=2", "--set",
                                       "checkpoint.async=true"]),
        ]
    for name, cmd in runs:
        run(cmd + ["--run-dir", os.path.join(work, name), "--quiet"])
        snapshot_run(os.path.join(work, name), os.path.join(out, "runs", name))
    # Resume the one-rank run's step-3 checkpoint on another layout.
    if not quick:
        src = os.path.join(work, "layout1")
        dst = os.path.join(work, "resume_tp2")
        shutil.copytree(src, dst)
        run(mpirun + ["-np", "2", runner, "resume", dst, "--step", "3", "--set", "parallel.tp=2", "--quiet"])
        snapshot_run(dst, os.path.join(out, "runs", "resume_tp2"))
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
