"""What the bench scripts (and tests/python/hf_reference.py) share: the environment a PyTorch
peer re-executes itself with, the arguments that size its GPT, a reader of safetensors files
without the safetensors package, and the runner recipe of a training benchmark on random tokens.

Nothing here imports numpy or torch at import time: OpenBLAS (which numpy and torch load) reads
OPENBLAS_CORETYPE when it loads, so a script imports this before it re-executes itself.
"""
import json
import os
import struct
import sys

from torch_env import openblas_coretype


def reexec_with_torch_env(threads, marker):
    """Re-executes this script, once, with OMP_WAIT_POLICY=PASSIVE (idle OpenMP workers sleep
    instead of spinning on cores others need), OMP_NUM_THREADS=`threads` and OPENBLAS_CORETYPE
    (openblas_coretype()) unless the caller set them; `marker` names the environment variable
    that says it was done (a parent that sets it skips the coretype probe). Returns when nothing
    needs to change."""
    env = dict(os.environ)
    if env.get("OMP_WAIT_POLICY", "").upper() != "PASSIVE":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    env.setdefault("OMP_NUM_THREADS", str(threads))
    if "OPENBLAS_CORETYPE" not in env and not env.get(marker):
        ct = openblas_coretype()
        if ct:
            env["OPENBLAS_CORETYPE"] = ct
    if env != dict(os.environ):
        env[marker] = "1"
        os.execve(sys.executable, [sys.executable] + sys.argv, env)


def add_model_args(p, vocab, seq, d_model, layers, heads, batch):
    """The GPT's sizes and the micro-batch as options of argparse parser `p`, with these defaults."""
    p.add_argument("--vocab", type=int, default=vocab)
    p.add_argument("--seq", type=int, default=seq)
    p.add_argument("--d-model", type=int, default=d_model)
    p.add_argument("--layers", type=int, default=layers)
    p.add_argument("--heads", type=int, default=heads)
    p.add_argument("--batch", type=int, default=batch)


def read_safetensors(path, dtypes=("F32", "BF16", "F16")):
    """Every tensor of a safetensors file (an 8-byte little-endian header length, the JSON
    header, raw little-endian data) as a float32 numpy array of its shape; a tensor stored in a
    type outside `dtypes` is an error."""
    import numpy as np

    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] in dtypes, f"{path}: {name} is {info['dtype']}, expected one of {dtypes}"
        b, e = info["data_offsets"]
        if info["dtype"] == "BF16":  # numpy has no bfloat16: the upper half of an fp32
            arr = (np.frombuffer(data[b:e], dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(data[b:e], dtype={"F32": "<f4", "F16": "<f2"}[info["dtype"]]).astype(np.float32)
        out[name] = arr.reshape(info["shape"]).copy()
    return out


def omp_env(threads=None, **extra):
    """This process's environment for a runner or PyTorch child: OMP_WAIT_POLICY=PASSIVE,
    OMP_NUM_THREADS=`threads` when given, and `extra`."""
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE", **extra)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def write_tokens(path, vocab, n=2_000_000):
    """`n` random tokens below `vocab` (seed 0) in nanoGPT's raw uint16 format; a file already
    at `path` is kept (same arguments, same tokens)."""
    import numpy as np

    if not os.path.exists(path):
        np.random.default_rng(0).integers(0, vocab, size=n, dtype=np.uint16).tofile(path)
    return path


def write_bench_recipe(path, name, cfg, data, batch, train, extra=()):
    """A training recipe at `path` for the GPT `cfg` (vocab, seq, d_model, layers, heads; no
    dropout) on the token file `data`, lr 3e-4, no checkpoints. `batch` and `train` are the
    insides of those flow mappings ("micro: 8, accum: 1"); `extra` are whole lines (a precision
    or parallel section) placed before train."""
    lines = [f"name: {name}",
             f"model: {{vocab_size: {cfg['vocab']}, seq_len: {cfg['seq']}, d_model: {cfg['d_model']}, "
             f"n_layers: {cfg['layers']}, n_heads: {cfg['heads']}, dropout: 0.0}}",
             f"data: {{kind: bin, path: {data}}}",
             f"batch: {{{batch}}}",
             "optimizer: {lr: 3.0e-4}",
             *extra,
             f"train: {{{train}}}",
             "checkpoint: {cadence: never}"]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def metrics_records(run_dir):
    """The records of a run's metrics.jsonl, one JSON object a line."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def run_summary(run_dir):
    """The end-of-run summary record of a run's metrics.jsonl (the last one)."""
    return [r for r in metrics_records(run_dir) if r.get("summary")][-1]
