#!/usr/bin/python3
"""The layout search's cost model against measurement on this machine: does it rank layouts as measurement does?

Every configuration below is predicted by the search itself, with every layout field fixed as a
constraint (`runner plan --search --world W --top 1 --json --set ...` must return exactly that
layout), and measured by `runner train` for a few steps (median step time after the warm-up,
from the run's own metrics.jsonl), all in one run; the 1-minute load average around each run is
printed beside it, with a warning when other work was running. Configurations: the "small" model of
bench/parallel_layouts.py (vocab 256, seq 256, d_model 384, 6 layers, 6 heads, global batch 8)
and GPT-2 124M's shape (recipes/gpt2-124m.yaml: vocab 50257, d_model 768, 12 layers, 12 heads)
shortened to seq_len 128 and global batch 4 in fp32 so that it runs in minutes on 2 cores, at
world sizes 1 and 2 (dp2, tp2, tp2 + sequence parallelism, pp2 with 1F1B, GPipe and
interleaved), crossed with micro-batch, recompute (none, selective, full) and ZeRO-1.

Prints a table (config, predicted, measured, error) and against the accuracy goals: Spearman rank
correlation of predicted against measured step time (>= 0.8), median absolute relative error
(<= 15%), and how far the predicted best layout's measured time is from the measured best
(<= 10%), per model and world size (the choice the search makes) and over all configurations.
Ranks share the machine's cores as `runner train` shares them (OMP_NUM_THREADS is unset), the
rule the cost model assumes. Timing is only honest on a quiet machine.

    /usr/bin/python3 bench/search_vs_measured.py [--profile FILE | --builtin-profile] [--configs NAME,...] [--steps N]
                                                  [--quick] [--list] [--json OUT]
Without --profile it runs `runner calibrate` first (into its work directory) and says so;
--builtin-profile uses the built-in CPU profile instead (what the search uses without one).
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPIRUN = shutil.which("mpirun") or "mpirun"
CORES = os.cpu_count() or 1
MODELS = {
    # name: (model fields, global batch)
    "small": (dict(vocab_size=256, seq_len=256, d_model=384, n_layers=6, n_heads=6), 8),
    "gpt2": (dict(vocab_size=50257, seq_len=128, d_model=768, n_layers=12, n_heads=12), 4),
}


def layouts():
    """name -> (model, world, --set overrides). Every layout field is fixed."""
    out = {}

    def add(model, world, dp=1, tp=1, pp=1, micro=1, recompute="none", zero=0, sp=False, schedule="1f1b", v=1):
        name = f"{model}-w{world}-dp{dp}tp{tp}pp{pp}"
        if sp:
            name += "-sp"
        if pp > 1:
            name += f"-{schedule}" + (f"{v}" if schedule == "interleaved" else "")
        name += f"-m{micro}-{recompute}" + ("-z1" if zero else "")
        global_batch = MODELS[model][1]
        sets = [f"parallel.dp={dp}", f"parallel.tp={tp}", f"parallel.pp={pp}", f"parallel.zero={zero}",
                f"parallel.sequence_parallel={'true' if sp else 'false'}", f"parallel.schedule={schedule}",
                f"parallel.virtual_stages={v}", f"batch.micro={micro}", f"batch.accum={global_batch // (dp * micro)}"]
        if recompute == "selective":
            sets += ["recompute.mode=selective", "recompute.modules=[attention_core]"]
        else:
            sets += [f"recompute.mode={recompute}"]
        out[name] = (model, world, sets)

    # small: one rank (2 threads), micro x recompute; two ranks, every layout kind.
    for micro in (2, 4, 8):
        for rc in ("none", "full"):
            add("small", 1, micro=micro, recompute=rc)
    add("small", 1, micro=4, recompute="selective")
    for micro in (2, 4):
        for zero in (0, 1):
            add("small", 2, dp=2, micro=micro, zero=zero)
    add("small", 2, dp=2, micro=4, recompute="full")
    add("small", 2, dp=2, micro=1)
    for micro in (2, 4):
        add("small", 2, tp=2, micro=micro)
    add("small", 2, tp=2, micro=4, sp=True)
    add("small", 2, tp=2, micro=4, recompute="selective")
    for micro in (1, 2):
        add("small", 2, pp=2, micro=micro)
    add("small", 2, pp=2, micro=2, schedule="gpipe")
    add("small", 2, pp=2, micro=2, schedule="interleaved", v=3)
    # GPT-2 124M's shape (seq 128, global 4: minutes on 2 cores).
    for micro in (2, 4):
        add("gpt2", 1, micro=micro)
    add("gpt2", 1, micro=2, recompute="full")
    add("gpt2", 1, micro=2, recompute="selective")
    for zero in (0, 1):
        add("gpt2", 2, dp=2, micro=2, zero=zero)
    add("gpt2", 2, tp=2, micro=2)
    add("gpt2", 2, tp=2, micro=2, sp=True)
    add("gpt2", 2, pp=2, micro=1)
    add("gpt2", 2, pp=2, micro=1, schedule="gpipe")
    add("gpt2", 2, pp=2, micro=1, schedule="interleaved", v=2)
    return out


QUICK = ["small-w1-dp1tp1pp1-m4-none", "small-w1-dp1tp1pp1-m4-full", "small-w2-dp2tp1pp1-m4-none",
         "small-w2-dp1tp2pp1-m4-none", "small-w2-dp1tp1pp2-1f1b-m2-none"]


def write_recipe(work, model, steps, data):
    fields, global_batch = MODELS[model]
    path = os.path.join(work, f"{model}.yaml")
    m = ", ".join(f"{k}: {v}" for k, v in fields.items())
    with open(path, "w") as f:
        f.write(f"""name: search_vs_measured_{model}
model: {{{m}, dropout: 0.0}}
data: {{kind: bin, path: {data}}}
batch: {{global: {global_batch}}}
optimizer: {{lr: 3.0e-4}}
train: {{steps: {steps}, log_every: 1000, eval_every: 0, eval_batches: 1}}
checkpoint: {{cadence: never}}
hardware: {{device: cpu}}
""")
    return path


def env():
    e = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
             OMPI_MCA_rmaps_base_oversubscribe="1")
    e.pop("OMP_NUM_THREADS", None)  # ranks share the cores as runner train shares them
    return e


def predict(runner, recipe, world, sets, profile):
    """The search's prediction for exactly this layout: (step_s, candidate) or (None, error)."""
    cmd = [runner, "plan", recipe, "--search", "--world", str(world), "--top", "1", "--json"]
    if profile:
        cmd += ["--profile", profile]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env())
    if p.returncode != 0:
        return None, (p.stderr or p.stdout).strip().splitlines()[-1:] or [f"exit {p.returncode}"]
    cands = json.loads(p.stdout)["search"]["candidates"]
    if not cands:
        return None, ["the search returned no candidate"]
    c = cands[0]
    want = {k.split(".")[1]: v for k, v in (s.split("=", 1) for s in sets) if k in
            ("parallel.dp", "parallel.tp", "parallel.pp", "batch.micro", "batch.accum", "parallel.zero")}
    got = {k: str(int(c.get(k, -1))) for k in ("dp", "tp", "pp", "micro", "accum", "zero")}
    if any(got[k] != v for k, v in want.items()):
        return None, [f"the search returned another layout: {got} for {want}"]
    return c["predicted"]["step_s"], c


def measure(runner, recipe, world, sets, run_dir, steps):
    """Median step time (s) after the warm-up, from metrics.jsonl: (seconds, None) or (None, error)."""
    cmd = [runner, "train", recipe, "--quiet", "--run-dir", run_dir]
    for s in sets:
        cmd += ["--set", s]
    if world > 1:
        cmd = [MPIRUN, "-np", str(world)] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, env=env())
    if p.returncode != 0:
        lines = [l for l in (p.stdout + p.stderr).splitlines() if l.strip() and not l.startswith("---")]
        return None, lines[:1] or [f"exit {p.returncode}"]
    warm = 2 if steps >= 4 else 1
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        recs = [json.loads(l) for l in f]
    ms = sorted(r["step_ms"] for r in recs if "breakdown" in r and "step" in r and r["step"] > warm)
    if not ms:
        return None, ["no timed steps"]
    return float(np.median(ms)) / 1e3, None


def ranks(xs):
    """Ranks 1..n, ties averaged."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    r = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r


def spearman(a, b):
    """Spearman's rank correlation: Pearson's on the ranks (ties averaged)."""
    if len(a) < 2:
        return float("nan")
    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = math.sqrt(sum((x - ma) ** 2 for x in ra))
    vb = math.sqrt(sum((y - mb) ** 2 for y in rb))
    return cov / (va * vb) if va > 0 and vb > 0 else float("nan")


def judge(rows):
    """Spearman, median |relative error|, and the predicted best's distance from the measured best (%)."""
    p = [r["predicted"] for r in rows]
    m = [r["measured"] for r in rows]
    rho = spearman(p, m)
    mare = float(np.median([abs(a - b) / b for a, b in zip(p, m)])) if rows else float("nan")
    best_pred = min(rows, key=lambda r: r["predicted"])
    best_meas = min(rows, key=lambda r: r["measured"])
    gap = 100 * (best_pred["measured"] / best_meas["measured"] - 1)
    return rho, mare, gap, best_pred["name"], best_meas["name"]


def verdict(ok):
    return "meets the goal" if ok else "MISSES the goal"


def report(rows, failed, profile_note):
    print(f"profile: {profile_note}")
    print(f"{'config':<44} {'predicted s':>11} {'measured s':>11} {'error':>8} {'load':>5}")
    for r in rows:
        err = 100 * (r["predicted"] - r["measured"]) / r["measured"]
        print(f"{r['name']:<44} {r['predicted']:>11.4f} {r['measured']:>11.4f} {err:>+7.1f}% {r['load']:>5.1f}")
    busy = [r["name"] for r in rows if r["load"] > CORES + 0.5]
    if busy:
        print(f"WARNING: {len(busy)} of {len(rows)} runs had a 1-minute load average above this machine's {CORES} cores "
              "(other work was running): their times, and the figures below, are not honest. Rerun on a quiet machine.")
    for name, why in failed:
        print(f"{name:<44} {'failed:':>11} {why}")
    if len(rows) < 2:
        print("fewer than 2 configurations with both figures: nothing to judge")
        return {}
    summary = {}
    groups = {}
    for r in rows:
        groups.setdefault((r["model"], r["world"]), []).append(r)
    print("\nper model and world size (the choice the search makes):")
    for (model, world), g in sorted(groups.items()):
        if len(g) < 2:
            continue
        rho, mare, gap, bp, bm = judge(g)
        summary[f"{model}-w{world}"] = dict(n=len(g), spearman=rho, median_abs_rel_error=mare, best_gap_pct=gap,
                                          predicted_best=bp, measured_best=bm)
        print(f"  {model} world {world}: {len(g)} configs, Spearman {rho:.3f}, median |error| {100 * mare:.1f}%, "
              f"predicted best {bp} measures {gap:.1f}% over the measured best {bm}")
    rho, mare, gap, bp, bm = judge(rows)
    summary["all"] = dict(n=len(rows), spearman=rho, median_abs_rel_error=mare)
    worst_gap = max((s["best_gap_pct"] for k, s in summary.items() if k != "all"), default=gap)
    summary["worst_best_gap_pct"] = worst_gap
    print(f"\nall {len(rows)} configurations ({len(failed)} failed):")
    print(f"  Spearman rank correlation     {rho:.3f}   (goal >= 0.8: {verdict(rho >= 0.8)})")
    print(f"  median absolute rel. error    {100 * mare:.1f}%   (goal <= 15%: {verdict(mare <= 0.15)})")
    print(f"  predicted best vs measured best, worst over the model x world groups: {worst_gap:.1f}% "
          f"(goal <= 10%: {verdict(worst_gap <= 10)})")
    return summary


def get_profile(args, runner, work):
    if args.builtin_profile:
        return None, "built in (the CPU's device-table profile, not calibrated: --builtin-profile)"
    if args.profile:
        return os.path.abspath(args.profile), f"{args.profile} (given)"
    out = os.path.join(work, "profile.json")
    print(f"no --profile: running `runner calibrate --out {out}` first", flush=True)
    t = time.time()
    p = subprocess.run([runner, "calibrate", "--out", out], capture_output=True, text=True, env=env())
    if p.returncode != 0 or not os.path.exists(out):
        sys.exit(f"runner calibrate failed (exit {p.returncode}): {(p.stderr or p.stdout).strip()[-400:]}\n"
                 "give a profile with --profile FILE, or use the built-in one with --builtin-profile")
    return out, f"calibrated now by `runner calibrate` ({time.time() - t:.0f} s), {out}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", help="a hardware profile from `runner calibrate` (default: calibrate first)")
    ap.add_argument("--builtin-profile", action="store_true", help="use the built-in CPU profile (no calibration)")
    ap.add_argument("--configs", help="comma-separated configuration names (see --list); default: all")
    ap.add_argument("--steps", type=int, default=5, help="steps per measured run (the first 2 not timed)")
    ap.add_argument("--quick", action="store_true", help=f"a handful for a smoke run: {', '.join(QUICK)}")
    ap.add_argument("--list", action="store_true", help="list the configurations and exit")
    ap.add_argument("--json", help="also write the rows and the summary to this file")
    ap.add_argument("--runner", default=os.path.join(ROOT, "build", "runner"))
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    all_layouts = layouts()
    if args.list:
        print("\n".join(all_layouts))
        return 0
    names = QUICK if args.quick else (args.configs.split(",") if args.configs else list(all_layouts))
    unknown = [n for n in names if n not in all_layouts]
    if unknown:
        sys.exit(f"unknown configurations: {', '.join(unknown)} (see --list)")
    work = tempfile.mkdtemp(prefix="runner_search_vs_measured_")
    runner = os.path.abspath(args.runner)
    profile, note = get_profile(args, runner, work)
    data = os.path.join(work, "tokens.bin")
    np.random.default_rng(0).integers(0, 50257, size=4_000_000, dtype=np.uint16).tofile(data)
    small_data = os.path.join(work, "tokens_small.bin")
    np.random.default_rng(0).integers(0, 256, size=2_000_000, dtype=np.uint16).tofile(small_data)
    recipes = {m: write_recipe(work, m, args.steps, small_data if m == "small" else data) for m in MODELS}
    rows, failed = [], []
    t0 = time.time()
    for i, name in enumerate(names):
        model, world, sets = all_layouts[name]
        pred, why = predict(runner, recipes[model], world, sets, profile)
        if pred is None:
            failed.append((name, f"prediction: {' '.join(why)}"))
            print(f"[{i + 1}/{len(names)}] {name}: prediction failed: {' '.join(why)}", flush=True)
            continue
        load0 = os.getloadavg()[0]
        meas, why = measure(runner, recipes[model], world, sets, os.path.join(work, name), args.steps)
        load = max(load0, os.getloadavg()[0])  # the 1-minute load average around the run
        if meas is None:
            failed.append((name, f"measurement: {' '.join(why)}"))
            print(f"[{i + 1}/{len(names)}] {name}: run failed: {' '.join(why)}", flush=True)
            continue
        rows.append(dict(name=name, model=model, world=world, predicted=pred, measured=meas, load=load))
        print(f"[{i + 1}/{len(names)}] {name}: predicted {pred:.4f} s, measured {meas:.4f} s, load {load:.1f} "
              f"({time.time() - t0:.0f} s so far)", flush=True)
    print()
    summary = report(rows, failed, note)
    print(f"\n{len(names)} configurations in {time.time() - t0:.0f} s, {args.steps} steps each")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(profile=note, rows=rows, failed=failed, summary=summary), f, indent=2)
    if args.keep:
        print(f"work directory kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
