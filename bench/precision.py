#!/usr/bin/python3
"""Training precision side by side: runner fp32, bf16 and fp16 against PyTorch fp32 and bf16 autocast.

For each config (the "small" model of bench/train_vs_torch.py and GPT-2 124M's shape with a
short sequence), in one invocation and on the same machine state:

  runner fp32            `runner train` on a synthetic uint16 token file
  runner bf16            ... --set precision.compute=bf16
  runner bf16-lg         ... and --set precision.logits_grad=compute (autocast's rule for the
                         output layer's backward: d(logits) read in bf16)
  runner fp16            ... --set precision.compute=fp16 --set precision.loss_scale.init=1024
  torch fp32             bench/torch_gpt.py's model and loop (same setup: threads, OMP_WAIT_POLICY,
                         OPENBLAS_CORETYPE), imported by this script in a child process
  torch bf16 autocast    the same, forward and loss under torch.autocast('cpu', dtype=torch.bfloat16)

Prints per variant the tokens/s (the median step time over the steps after warm-up), the ratio
to runner fp32, the peak of each memory account (runner: the measured ledger of the run's
metrics.jsonl summary; torch: parameters, gradients and optimizer state counted from the
tensors, activations = the bytes saved for backward in one extra, untimed step, counted with
torch.autograd.graph.saved_tensors_hooks by storage, and the growth of the process's peak RSS
over the training loop), the activation ratio bf16/fp32, the GEMM path each dtype took (runner:
gemm_paths.json; torch: oneDNN's verbose log of that extra step), the CPU's flags, and the
memory goal (activations halved) and the speed goal (bf16 >= 1.3x fp32 without AMX, >= 2x
with AMX) with their verdicts.

    /usr/bin/python3 bench/precision.py [--quick] [--configs small,gpt2] [--steps N] [--warmup W]
                                        [--threads 2] [--runner build/runner]
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
BENCH = os.path.join(ROOT, "bench")

# name: vocab, seq, d_model, layers, heads, batch (micro-batch = global batch), timed steps, warm-up
CONFIGS = {
    "small": dict(vocab=256, seq=256, d_model=384, layers=6, heads=6, batch=8, steps=8, warmup=2),
    # recipes/gpt2-124m.yaml's model (vocab 50257, d 768, 12 layers, 12 heads, tied, biases)
    # at seq 64 and micro-batch 4, as bench/train_vs_torch.py runs it on 2 cores.
    "gpt2": dict(vocab=50257, seq=64, d_model=768, layers=12, heads=12, batch=4, steps=4, warmup=1),
}
QUICK = {
    "small": dict(seq=64, batch=4, steps=3, warmup=1),
    "gpt2": dict(seq=32, batch=2, steps=2, warmup=1),
}
RUNNER_VARIANTS = {
    "fp32": [],
    "bf16": ["precision.compute=bf16"],
    # PyTorch autocast's rule for the output layer's backward (docs/precision.md, "The logits'
    # gradient"): d(logits) rounded to bf16, so the lm_head's GEMMs read bf16 as stored.
    "bf16-lg": ["precision.compute=bf16", "precision.logits_grad=compute"],
    "fp16": ["precision.compute=fp16", "precision.loss_scale.init=1024"],
}
FLAGS = ["avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16"]
ACCOUNTS = ["parameters", "gradients", "optimizer", "activations", "workspace", "communication"]


def cpu_info():
    model, flags = "?", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model == "?":
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return model, flags


def openblas_coretype(flags):
    """bench/torch_gpt.py's rule (Debian's OpenBLAS 0.3.21 does not recognise newer CPUs)."""
    if {"avx512f", "avx512bw", "avx512vl", "avx512_bf16"} <= flags:
        return "Cooperlake"
    if {"avx512f", "avx512bw", "avx512vl"} <= flags:
        return "SkylakeX"
    if {"avx2", "fma"} <= flags:
        return "Haswell"
    return None


def mib(b):
    return "-" if b is None else f"{b / 2**20:.1f}"


# ----------------------------------------------------------------------------------------------
# runner


def run_runner(runner, cfg, variant, threads, work, data, core_env):
    recipe = os.path.join(work, "bench.yaml")
    with open(recipe, "w") as f:
        f.write(f"""name: bench_precision
model: {{vocab_size: {cfg['vocab']}, seq_len: {cfg['seq']}, d_model: {cfg['d_model']}, n_layers: {cfg['layers']}, n_heads: {cfg['heads']}, dropout: 0.0}}
data: {{kind: bin, path: {data}}}
batch: {{global: {cfg['batch']}, micro: {cfg['batch']}}}
optimizer: {{lr: 3.0e-4}}
train: {{steps: {cfg['warmup'] + cfg['steps']}, log_every: 1000, eval_every: 0, eval_batches: 1, threads: {threads}}}
checkpoint: {{cadence: never}}
""")
    run_dir = os.path.join(work, f"run_{variant}")
    cmd = [runner, "train", recipe, "--quiet", "--run-dir", run_dir]
    for s in RUNNER_VARIANTS[variant]:
        cmd += ["--set", s]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_WAIT_POLICY="PASSIVE", **core_env)
    subprocess.run(cmd, check=True, env=env)
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        recs = [json.loads(l) for l in f]
    # Per-step records only: the monitor's window records carry step_ms as statistics (a dict).
    steps = [r for r in recs if isinstance(r.get("step_ms"), (int, float)) and not r.get("summary")]
    timed = steps[cfg["warmup"]:]
    med_ms = statistics.median(r["step_ms"] for r in timed)
    summary = [r for r in recs if r.get("summary")][-1]
    paths = {}  # written by 16-bit runs only
    if os.path.exists(os.path.join(run_dir, "gemm_paths.json")):
        with open(os.path.join(run_dir, "gemm_paths.json")) as f:
            paths = json.load(f)
    with open(os.path.join(run_dir, "log.rank0.txt")) as f:
        log = f.read()
    if variant == "fp32":
        gemm = "fp32 sgemm (OpenBLAS)"
    else:
        p = paths["bf16" if variant.startswith("bf16") else "f16"]
        if p["path"] == "onednn-bf16":
            gemm = f"{p['path']} [{p.get('onednn_impl', '')}] {p['onednn_gflops']:.0f} vs sgemm {p['sgemm_gflops']:.0f} GF/s"
        elif p.get("why") == "measured":
            gemm = f"{p['path']} (widen) {p['sgemm_gflops']:.0f} vs onednn {p['onednn_gflops']:.0f} GF/s"
        else:
            gemm = f"{p['path']} (widen; {p.get('why', '')})"
    ledger = {k: summary["ledger"][k]["measured"] for k in ACCOUNTS}
    out = dict(impl=f"runner {variant}", tokens_per_s=cfg["batch"] * cfg["seq"] / (med_ms / 1e3), step_ms=med_ms,
               ledger=ledger, peak_total=max(r.get("peak_bytes", 0) for r in steps), gemm=gemm,
               skipped=sum(1 for r in steps if r.get("skipped")), final_loss=steps[-1]["loss"],
               top_ops=summary.get("top_ops", []),
               top_ops_text=log[log.find("top operators"):] if "top operators" in log else "")
    shutil.rmtree(run_dir, ignore_errors=True)  # GPT-2's final checkpoint is ~1.5 GB
    return out


# ----------------------------------------------------------------------------------------------
# PyTorch peer (runs as a child: `precision.py --torch-peer JSON`)


def torch_peer(spec):
    cfg, dtype, threads = spec["cfg"], spec["dtype"], spec["threads"]
    # bench/torch_gpt.py parses its arguments at import time; hand it the model's.
    sys.argv = [os.path.join(BENCH, "torch_gpt.py"), "--vocab", str(cfg["vocab"]), "--seq", str(cfg["seq"]),
                "--d-model", str(cfg["d_model"]), "--layers", str(cfg["layers"]), "--heads", str(cfg["heads"]),
                "--batch", str(cfg["batch"]), "--threads", str(threads)]
    sys.path.insert(0, BENCH)
    import resource
    import time

    import torch
    import torch_gpt  # the parent set the environment, so it does not re-exec

    a = torch_gpt.ARGS
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = torch_gpt.GPT(a.vocab, a.seq, a.d_model, a.layers, a.heads, a.attn)
    model.train()
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, foreach=bool(a.foreach))
    gen = torch.Generator().manual_seed(1)
    use_bf16 = dtype == "bf16"

    def rss_now():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def step():
        data = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=gen)
        tokens, targets = data[:, :-1].contiguous(), data[:, 1:].contiguous()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16):
            loss = model(tokens, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        lv = loss.item()
        return time.perf_counter() - t0, lv

    rss0 = rss_now()
    times = []
    for i in range(cfg["warmup"] + cfg["steps"]):
        dt, lv = step()
        if i >= cfg["warmup"]:
            times.append(dt)
    rss_delta = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss0

    # One extra, untimed step: bytes saved for backward, by storage (parameters excluded;
    # autocast's bf16 weight copies counted apart), and oneDNN's verbose log of its kernels.
    param_ptrs = {p.data_ptr() for p in params}
    saved, weight_copies = {}, {}

    def is_weight_copy(t):
        fn = t.grad_fn
        while fn is not None and type(fn).__name__ in ("TBackward0", "ViewBackward0", "TransposeBackward0",
                                                       "PermuteBackward0", "ExpandBackward0"):
            fn = fn.next_functions[0][0]
        return (fn is not None and type(fn).__name__ == "ToCopyBackward0"
                and type(fn.next_functions[0][0]).__name__ == "AccumulateGrad")

    def pack(t):
        s = t.storage()
        ptr = s.data_ptr()
        if ptr not in param_ptrs:
            (weight_copies if is_weight_copy(t) else saved)[ptr] = s.nbytes()
        return t

    verbose_path = spec["verbose_path"]
    sys.stdout.flush()
    fd = os.dup(1)
    with open(verbose_path, "w") as vf:
        os.dup2(vf.fileno(), 1)
        try:
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON), \
                    torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                step()
        finally:
            sys.stdout.flush()
            os.dup2(fd, 1)
            os.close(fd)
    kernels = {}
    with open(verbose_path) as f:
        for line in f:
            parts = line.split(",")
            if len(parts) > 5 and parts[0] in ("onednn_verbose", "dnnl_verbose") and parts[1] == "exec":
                key = f"{parts[3]}:{parts[4]}"
                kernels[key] = kernels.get(key, 0) + 1
    ledger = dict(parameters=sum(p.numel() * p.element_size() for p in params),
                  gradients=sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None),
                  optimizer=sum(v.numel() * v.element_size() for st in opt.state.values()
                                for v in st.values() if torch.is_tensor(v)),
                  activations=sum(saved.values()), workspace=None, communication=None)
    med = statistics.median(times)
    print(json.dumps(dict(impl=f"torch {'bf16 autocast' if use_bf16 else 'fp32'}", tokens_per_s=a.batch * a.seq / med,
                          step_ms=med * 1e3, ledger=ledger, weight_copies=sum(weight_copies.values()),
                          rss_delta=rss_delta, kernels=kernels, final_loss=lv, torch=torch.__version__,
                          openblas_coretype=os.environ.get("OPENBLAS_CORETYPE", "auto"))))


def run_torch(cfg, dtype, threads, work, core_env):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_WAIT_POLICY="PASSIVE", TORCH_GPT_REEXECED="1", **core_env)
    spec = dict(cfg=cfg, dtype=dtype, threads=threads, verbose_path=os.path.join(work, f"onednn_{dtype}.log"))
    out = subprocess.run(["/usr/bin/python3", os.path.abspath(__file__), "--torch-peer", json.dumps(spec)],
                         check=True, env=env, capture_output=True, text=True)
    r = json.loads([l for l in out.stdout.splitlines() if l.startswith("{")][-1])
    mm = {k: n for k, n in r["kernels"].items() if k.startswith(("matmul", "inner_product"))}
    if mm:
        r["gemm"] = "oneDNN " + ", ".join(f"{k} x{n}" for k, n in sorted(mm.items(), key=lambda kv: -kv[1]))
    else:
        r["gemm"] = f"OpenBLAS sgemm (CORETYPE={r['openblas_coretype']}; no oneDNN matmul)"
    return r


# ----------------------------------------------------------------------------------------------


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--torch-peer":
        return torch_peer(json.loads(sys.argv[2]))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default="small,gpt2")
    ap.add_argument("--quick", action="store_true", help="smoke run: shorter sequences, smaller batches, 1+2-3 steps")
    ap.add_argument("--steps", type=int, default=0, help="timed steps (0: per-config default)")
    ap.add_argument("--warmup", type=int, default=-1, help="untimed steps first (-1: per-config default)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runner", default=os.path.join(ROOT, "build", "runner"))
    ap.add_argument("--openblas-core", default="best",
                    help="OPENBLAS_CORETYPE for both runner and torch: best (the CPU's best AVX-512/AVX2 kernels, "
                         "bench/torch_gpt.py's rule), env (keep the environment's), or a core name")
    args = ap.parse_args()

    import numpy as np

    model_name, flags = cpu_info()
    has_amx = "amx_bf16" in flags and "amx_tile" in flags
    if args.openblas_core == "env":
        coretype = os.environ.get("OPENBLAS_CORETYPE")
    else:
        coretype = openblas_coretype(flags) if args.openblas_core == "best" else args.openblas_core
    # Both peers get the same OpenBLAS kernels (an OPENBLAS_CORETYPE in the environment would
    # otherwise override the runner's own choice, and torch's).
    core_env = {"OPENBLAS_CORETYPE": coretype} if coretype else {}
    flag_line = "  ".join(f"{f} {'yes' if f in flags else 'no'}" for f in FLAGS)
    core_note = f"OPENBLAS_CORETYPE={coretype or 'unset'} for both (environment had {os.environ.get('OPENBLAS_CORETYPE', 'none')})"
    print(f"CPU: {model_name} | {flag_line} | {os.cpu_count()} cores, {args.threads} threads used | {core_note}",
          flush=True)

    results = {}
    for name in args.configs.split(","):
        cfg = dict(CONFIGS[name])
        if args.quick:
            cfg.update(QUICK[name])
        if args.steps:
            cfg["steps"] = args.steps
        if args.warmup >= 0:
            cfg["warmup"] = args.warmup
        work = tempfile.mkdtemp(prefix="runner_bench_precision_")
        data = os.path.join(work, "tokens.bin")
        np.random.default_rng(0).integers(0, cfg["vocab"], size=1_000_000, dtype=np.uint16).tofile(data)
        rows = []
        for variant in RUNNER_VARIANTS:
            r = run_runner(args.runner, cfg, variant, args.threads, work, data, core_env)
            print(f"  {name} {r['impl']:<20} {r['tokens_per_s']:9.1f} tok/s  step {r['step_ms']:8.1f} ms", flush=True)
            rows.append(r)
        for dtype in ("fp32", "bf16"):
            r = run_torch(cfg, dtype, args.threads, work, core_env)
            print(f"  {name} {r['impl']:<20} {r['tokens_per_s']:9.1f} tok/s  step {r['step_ms']:8.1f} ms", flush=True)
            rows.append(r)
        shutil.rmtree(work, ignore_errors=True)
        results[name] = (cfg, rows)

    print()
    print(f"CPU flags: {flag_line} | {core_note}")
    for name, (cfg, rows) in results.items():
        base = rows[0]
        print(f"\n{name}: vocab {cfg['vocab']}, seq {cfg['seq']}, d {cfg['d_model']}, {cfg['layers']} layers, "
              f"{cfg['heads']} heads, micro-batch {cfg['batch']}, {cfg['warmup']} warm-up + {cfg['steps']} timed steps, "
              f"{args.threads} threads; memory in MiB (runner: measured ledger peaks; torch: counted from tensors, "
              f"activations = saved for backward, + peak RSS growth)")
        print(f"{'impl':<19} {'tok/s':>8} {'vs fp32':>8} {'params':>7} {'grads':>7} {'optim':>7} {'activ.':>7} "
              f"{'wkspace':>7} {'RSS+':>7}  GEMM path")
        for r in rows:
            L = r["ledger"]
            print(f"{r['impl']:<19} {r['tokens_per_s']:>8.1f} {r['tokens_per_s'] / base['tokens_per_s']:>7.2f}x "
                  f"{mib(L['parameters']):>7} {mib(L['gradients']):>7} {mib(L['optimizer']):>7} "
                  f"{mib(L['activations']):>7} {mib(L['workspace']):>7} {mib(r.get('rss_delta')):>7}  {r['gemm']}")
        by = {r["impl"]: r for r in rows}
        rb, rh, tf, tb = by["runner bf16"], by["runner fp16"], by["torch fp32"], by["torch bf16 autocast"]
        act = lambda r: r["ledger"]["activations"]  # noqa: E731
        print(f"activation ratio bf16/fp32: runner {act(rb) / act(base):.3f}, fp16/fp32 {act(rh) / act(base):.3f}; "
              f"torch autocast {act(tb) / act(tf):.3f} (plus {mib(tb['weight_copies'])} MiB of bf16 weight copies "
              f"saved for backward)")
        print(f"runner total peak (allocator): fp32 {mib(base['peak_total'])}, bf16 {mib(rb['peak_total'])}, "
              f"fp16 {mib(rh['peak_total'])} MiB; fp16 skipped steps {rh['skipped']}; final loss fp32 "
              f"{base['final_loss']:.4f} bf16 {rb['final_loss']:.4f} fp16 {rh['final_loss']:.4f} torch fp32 "
              f"{tf['final_loss']:.4f} torch bf16 {tb['final_loss']:.4f}")
        act_ratio = act(rb) / act(base)
        ok_a = act_ratio <= 0.5
        print(f"memory goal: runner bf16 activations halved: {act_ratio:.3f} of fp32 -> {'met' if ok_a else 'NOT MET'}")
        # The speed goal: bf16 >= 1.3x runner fp32 on a CPU without AMX, >= 2x with AMX.
        goal = 2.0 if has_amx else 1.3
        for r in (rb, by.get("runner bf16-lg")):
            if r is None:
                continue
            sp = r["tokens_per_s"] / base["tokens_per_s"]
            print(f"speed goal ({'AMX present' if has_amx else 'no AMX'}): {r['impl']} >= {goal}x runner fp32: "
                  f"{sp:.2f}x -> {'MET' if sp >= goal else 'NOT MET'}")
        print(f"runner bf16 vs torch bf16 autocast: {rb['tokens_per_s'] / tb['tokens_per_s']:.2f}x; "
              f"runner fp32 vs torch fp32: {base['tokens_per_s'] / tf['tokens_per_s']:.2f}x")
        for r in rows[:4]:
            ops = sorted(r["top_ops"], key=lambda o: -(o["forward_ms"] + o["backward_ms"] + o["recompute_ms"]))[:4]
            tot = sum(o["forward_ms"] + o["backward_ms"] + o["recompute_ms"] for o in r["top_ops"]) or 1
            print(f"  {r['impl']} top operators (all steps): " + ", ".join(
                f"{o['op']} {o['forward_ms'] + o['backward_ms']:.0f} ms ({100 * (o['forward_ms'] + o['backward_ms']) / tot:.0f}%)"
                for o in ops))
        print(f"  torch bf16 oneDNN kernels in one step: {tb['kernels']}")


if __name__ == "__main__":
    sys.exit(main())
