#!/usr/bin/python3
"""Ranks vs threads on one machine: the same global batch trained as 1 rank x 2 threads and as
2 ranks x 1 thread (data parallel), plus tp2 (with and without sequence parallelism) and pp2
(1F1B, and interleaved with 3 chunks per stage) for reference.

Prints tokens/s of each layout, its ratio to 1 rank x 2 threads (the peer, measured in the
same run), and for data parallelism the fraction of gradient all-reduce time that was hidden
behind the backward pass (from the runner's own step records).

    /usr/bin/python3 bench/parallel_layouts.py [--steps N] [--layouts 1x2,dp2,tp2,tp2sp,pp2,pp2i]
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

from common import omp_env, run_summary, write_bench_recipe, write_tokens

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MPIRUN = shutil.which("mpirun") or "mpirun"
# The "small" model of bench/train_vs_torch.py; global batch 8 sequences of 256 tokens, micro-batch 4 on every layout.
MODEL = dict(vocab=256, seq=256, d_model=384, layers=6, heads=6)
GLOBAL, MICRO = 8, 4
LAYOUTS = {
    # name: (ranks, threads per rank, recipe overrides)
    "1x2": (1, 2, []),
    "dp2": (2, 1, ["parallel.dp=2"]),
    "tp2": (2, 1, ["parallel.tp=2"]),
    "pp2": (2, 1, ["parallel.pp=2"]),
    "pp2i": (2, 1, ["parallel.pp=2", "parallel.schedule=interleaved", "parallel.virtual_stages=3"]),
    "tp2sp": (2, 1, ["parallel.tp=2", "parallel.sequence_parallel=true"]),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--layouts", default="1x2,dp2,tp2,tp2sp,pp2,pp2i")
    ap.add_argument("--bucket-mb", type=float, default=25.0)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="runner_bench_parallel_")
    data = write_tokens(os.path.join(work, "tokens.bin"), MODEL["vocab"])
    recipe = write_bench_recipe(os.path.join(work, "bench.yaml"), "bench_parallel", MODEL, data,
                                batch=f"global: {GLOBAL}, micro: {MICRO}",
                                train=f"steps: {args.steps}, log_every: 1000, eval_every: 0, eval_batches: 1",
                                extra=[f"parallel: {{bucket_mb: {args.bucket_mb}}}"])
    env = omp_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    results = {}
    for name in args.layouts.split(","):
        ranks, threads, sets = LAYOUTS[name]
        run_dir = os.path.join(work, name)
        cmd = [os.path.join(ROOT, "build", "runner"), "train", recipe, "--quiet", "--run-dir", run_dir,
               "--set", f"train.threads={threads}"]
        for s in sets:
            cmd += ["--set", s]
        if ranks > 1:
            cmd = [MPIRUN, "-np", str(ranks), "--bind-to", "core", "-x", f"OMP_NUM_THREADS={threads}"] + cmd
        subprocess.run(cmd, check=True, env=dict(env, OMP_NUM_THREADS=str(threads)))
        results[name] = run_summary(run_dir)
    base = results.get("1x2", {}).get("tokens_per_s")
    print(f"global batch {GLOBAL} x {MODEL['seq']} tokens, micro {MICRO}, {args.steps} steps "
          f"(model: vocab {MODEL['vocab']}, d {MODEL['d_model']}, {MODEL['layers']} layers)")
    print(f"{'layout':<8} {'ranks x threads':>16} {'tok/s':>9} {'vs 1x2':>8} {'dp comm hidden':>15} {'pipeline idle':>14}")
    for name, s in results.items():
        ranks, threads, _ = LAYOUTS[name]
        tps = s["tokens_per_s"]
        ratio = f"{tps / base:.2f}x" if base else "-"
        hidden = f"{100 * s['comm_hidden_fraction']:.0f}%" if s["layout"]["dp"] > 1 else "-"
        idle = ("/".join(f"{100 * f:.0f}%" for f in s["pipeline_idle_fraction"]) +
                f" (plan {100 * s['plan_bubble']:.0f}%)") if s["layout"]["pp"] > 1 else "-"
        print(f"{name:<8} {f'{ranks} x {threads}':>16} {tps:>9.0f} {ratio:>8} {hidden:>15} {idle:>14}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
