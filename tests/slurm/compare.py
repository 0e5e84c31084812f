#!/usr/bin/env python3
"""Compares two run directories of the Slurm tests.

  compare.py exact REF RUN     every step's loss and grad_norm equal (metrics.jsonl), and every
                               dataset of the final checkpoints equal bit for bit
  compare.py close REF RUN TOL every step's loss within relative TOL (layout equivalence)
  compare.py elastic REF RUN TOL FIRST HORIZON
                               a run whose layout changed at step FIRST and later: steps up to
                               FIRST equal, the next HORIZON steps within relative TOL (layout
                               equivalence; beyond that the different summation orders of two
                               layouts grow apart as any two training runs do: seen 1e-8 at 30
                               steps, 1e-5 at 160, 2e-1 at 600 on tests/slurm/nodes.yaml); the
                               mean loss of the last 100 steps is printed, not judged

Exits 1 with what differs. Each step must appear exactly once in RUN's metrics.jsonl (a
requeued run truncates it after the step it resumed from)."""
import json
import os
import sys

import h5py
import numpy as np


def steps(run):
    out = {}
    with open(os.path.join(run, "metrics.jsonl")) as f:
        for line in f:
            try:
                j = json.loads(line)
            except ValueError:
                continue
            if "summary" in j or "loss" not in j or "step" not in j or "step_ms" not in j:
                continue
            if j["step"] in out:
                sys.exit(f"{run}: step {j['step']} recorded twice in metrics.jsonl")
            out[j["step"]] = j
    return out


def final_checkpoint(run):
    d = os.path.join(run, "checkpoints")
    with open(os.path.join(d, "LATEST")) as f:
        return os.path.join(d, f.read().strip())


def datasets(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return out


def main():
    mode, ref, run = sys.argv[1], sys.argv[2], sys.argv[3]
    a, b = steps(ref), steps(run)
    if sorted(a) != sorted(b):
        sys.exit(f"steps differ: {ref} has {len(a)} ({min(a, default=0)}..{max(a, default=0)}), "
                 f"{run} has {len(b)} ({min(b, default=0)}..{max(b, default=0)})")
    if mode == "exact":
        for s in sorted(a):
            for key in ("loss", "grad_norm", "lr", "tokens"):
                if a[s][key] != b[s][key]:
                    sys.exit(f"step {s}: {key} {a[s][key]!r} != {b[s][key]!r}")
        ca, cb = final_checkpoint(ref), final_checkpoint(run)
        if os.path.basename(ca) != os.path.basename(cb):
            sys.exit(f"final checkpoints differ: {ca} vs {cb}")
        da, db = datasets(ca), datasets(cb)
        if sorted(da) != sorted(db):
            sys.exit(f"checkpoint datasets differ: {sorted(set(da) ^ set(db))}")
        for name in sorted(da):
            x, y = np.asarray(da[name]), np.asarray(db[name])
            if x.shape != y.shape or x.dtype != y.dtype or x.tobytes() != y.tobytes():
                sys.exit(f"{os.path.basename(ca)}: dataset {name} differs")
        print(f"bit-identical: {len(a)} steps (loss, grad_norm, lr, tokens) and {len(da)} datasets of {os.path.basename(ca)}")
    elif mode == "elastic":
        tol, first, horizon = float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
        for s in sorted(a):
            if s <= first and a[s]["loss"] != b[s]["loss"]:
                sys.exit(f"step {s} (before the first layout change at {first}): loss {b[s]['loss']!r} != {a[s]['loss']!r}")
            if first < s <= first + horizon and abs(a[s]["loss"] - b[s]["loss"]) > tol * abs(a[s]["loss"]):
                sys.exit(f"step {s}: loss {b[s]['loss']} vs {a[s]['loss']}: relative difference above {tol:g} "
                         f"within {horizon} steps of the layout change at {first}")
        last = sorted(a)[-100:]
        ma, mb = (sum(x[s]["loss"] for s in last) / len(last) for x in (a, b))
        print(f"{len(a)} steps: equal up to step {first}, within {tol:g} for {horizon} steps after it, "
              f"last {len(last)} steps' mean loss {mb:.4f} vs {ma:.4f}")
    else:
        tol = float(sys.argv[4])
        worst = max(abs(a[s]["loss"] - b[s]["loss"]) / abs(a[s]["loss"]) for s in a)
        if worst > tol:
            s = max(a, key=lambda s: abs(a[s]["loss"] - b[s]["loss"]) / abs(a[s]["loss"]))
            sys.exit(f"step {s}: loss {b[s]['loss']} vs {a[s]['loss']}: relative {worst:.2e} > {tol:g}")
        print(f"within {tol:g}: {len(a)} steps, largest relative loss difference {worst:.2e}")


main()
