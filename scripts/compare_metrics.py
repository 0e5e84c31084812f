#!/usr/bin/env python3
"""The checks scripts/gpu-check.sh makes on runs' metrics.jsonl files, one JSON line each.

    compare_metrics.py losses GOT.jsonl WANT.jsonl --steps 50 (--exact | --rtol R --atol A) [--from S]
        the training losses of steps S+1 .. S+steps (default S = 0) of GOT against WANT: exactly
        (bit for bit as printed: repr of the float) or within atol + rtol |want| at every step.
    compare_metrics.py accuracy RUN.jsonl --min 0.9
        the last held-out evaluation's accuracy is at least MIN.
    compare_metrics.py throughput RUN.jsonl --skip 3 --flops-per-token F --peak-tflops P
        median tokens/s over the step records after the first SKIP (warm-up), and MFU against
        the measured peak P (TFLOP/s); peak bytes of the last record.

Each prints one JSON object (with "ok") and exits 0 when the check holds, 1 when it does not,
2 when a file is missing or holds too few records. Pure standard library: runs on the GPU
machine's python and in the CPU test (tests/test_gpu_check.cpp).
"""
import argparse
import json
import statistics
import sys


def records(path):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        print(json.dumps({"ok": False, "error": f"{path}: {e}"}))
        sys.exit(2)


def step_losses(path):
    """{step: loss} of the training step records (not evaluations or monitor lines)."""
    out = {}
    for r in records(path):
        if "loss" in r and "step" in r and not r.get("eval") and not r.get("monitor"):
            out[int(r["step"])] = float(r["loss"])
    return out


def losses(a):
    got, want = step_losses(a.got), step_losses(a.want)
    steps = list(range(a.start + 1, a.start + a.steps + 1))
    missing = [s for s in steps if s not in got or s not in want]
    if missing:
        print(json.dumps({"ok": False, "error": f"no loss for steps {missing[:5]} (of {len(missing)})",
                          "got_steps": len(got), "want_steps": len(want)}))
        sys.exit(2)
    worst_abs = worst_rel = 0.0
    first_bad = None
    for s in steps:
        g, w = got[s], want[s]
        d = abs(g - w)
        worst_abs = max(worst_abs, d)
        worst_rel = max(worst_rel, d / abs(w) if w else d)
        bad = (repr(g) != repr(w)) if a.exact else not (d <= a.atol + a.rtol * abs(w))
        if bad and first_bad is None:
            first_bad = {"step": s, "got": g, "want": w}
    out = {"ok": first_bad is None, "steps": [steps[0], steps[-1]], "exact": a.exact, "max_abs": worst_abs,
           "max_rel": worst_rel}
    if not a.exact:
        out.update(rtol=a.rtol, atol=a.atol)
    if first_bad:
        out["first_bad"] = first_bad
    print(json.dumps(out))
    return 0 if first_bad is None else 1


def accuracy(a):
    evals = [r for r in records(a.run) if r.get("eval") and "accuracy" in r]
    if not evals:
        print(json.dumps({"ok": False, "error": f"{a.run}: no evaluation with an accuracy"}))
        sys.exit(2)
    last = evals[-1]
    ok = float(last["accuracy"]) >= a.min
    print(json.dumps({"ok": ok, "step": last["step"], "accuracy": last["accuracy"], "min": a.min}))
    return 0 if ok else 1


def throughput(a):
    steps = [r for r in records(a.run) if "tokens_per_s" in r and "step" in r and not r.get("monitor")]
    timed = steps[a.skip:]
    if not timed:
        print(json.dumps({"ok": False, "error": f"{a.run}: {len(steps)} step records, none after the {a.skip} skipped"}))
        sys.exit(2)
    tps = statistics.median(float(r["tokens_per_s"]) for r in timed)
    out = {"ok": True, "steps_timed": len(timed), "tokens_per_s": tps,
           "step_ms": statistics.median(float(r["step_ms"]) for r in timed), "peak_bytes": timed[-1].get("peak_bytes")}
    if a.flops_per_token > 0 and a.peak_tflops > 0:
        out["mfu"] = tps * a.flops_per_token / (a.peak_tflops * 1e12)
    print(json.dumps(out))
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    lo = sub.add_parser("losses")
    lo.add_argument("got")
    lo.add_argument("want")
    lo.add_argument("--steps", type=int, default=50)
    lo.add_argument("--from", dest="start", type=int, default=0)
    lo.add_argument("--exact", action="store_true")
    lo.add_argument("--rtol", type=float, default=0.0)
    lo.add_argument("--atol", type=float, default=0.0)
    ac = sub.add_parser("accuracy")
    ac.add_argument("run")
    ac.add_argument("--min", type=float, default=0.9)
    th = sub.add_parser("throughput")
    th.add_argument("run")
    th.add_argument("--skip", type=int, default=3)
    th.add_argument("--flops-per-token", type=float, default=0.0)
    th.add_argument("--peak-tflops", type=float, default=0.0)
    a = p.parse_args()
    return {"losses": losses, "accuracy": accuracy, "throughput": throughput}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
