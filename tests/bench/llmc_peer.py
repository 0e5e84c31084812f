#!/usr/bin/python3
"""The llm.c peer of bench/train_vs_torch.py reads what the bench writes.

bench/train_vs_torch.py writes a random-init GPT-2 checkpoint and a token file in llm.c's
formats and times llm.c's own trainer on them. A wrong header or parameter layout would make
llm.c refuse the files or train a different model, and the bench would time the wrong thing:
this builds the trainer from an llm.c checkout, feeds it a small model the same way and checks
that llm.c read the shape the bench wrote, the parameter count of that shape, and that its
first loss is a random model's (ln V) and finite steps follow. Seconds, not minutes.

    llmc_peer.py [--llmc DIR]      (default: $RUNNER_LLMC_DIR)

llm.c is not part of this repository: without a checkout this prints how to get one and exits
77, which ctest reports as skipped (SKIP_RETURN_CODE).
"""
import argparse
import math
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import train_vs_torch as bench  # noqa: E402


SKIP = 77  # ctest's SKIP_RETURN_CODE for this test (CMakeLists.txt)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llmc", metavar="DIR", default=None, help="a checkout of github.com/karpathy/llm.c")
    args = ap.parse_args()
    llmc_dir = bench.llmc_checkout(args.llmc)
    if llmc_dir is None:
        print(f"skipped: {bench.LLMC_HOWTO}")
        return SKIP
    cfg = dict(vocab=256, seq=16, d_model=64, layers=2, heads=4, batch=2)
    with tempfile.TemporaryDirectory() as work:
        exe = bench.build_llmc(work, llmc_dir)
        ckpt, data = bench.write_llmc_inputs(cfg, work)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        out = subprocess.run([exe, ckpt, data, str(cfg["batch"]), str(cfg["seq"]), "3"], env=env,
                             capture_output=True, text=True, timeout=120)
    print(out.stdout)
    print(out.stderr)
    assert out.returncode == 0, f"llm.c exited {out.returncode}"
    fields = dict(re.findall(r"^(\w+): (\d+)$", out.stdout, re.M))
    C, L, V = cfg["d_model"], cfg["layers"], cfg["vocab"]
    maxT = max(1024, cfg["seq"])
    expect = {"max_seq_len": maxT, "vocab_size": V, "padded_vocab_size": 256, "num_layers": L,
              "num_heads": cfg["heads"], "channels": C,
              "num_parameters": V * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C}
    for k, v in expect.items():
        assert int(fields.get(k, -1)) == v, f"llm.c read {k} = {fields.get(k)}, the bench wrote {v}"
    import json
    res = json.loads([l for l in out.stdout.splitlines() if l.startswith("{")][-1])
    # Weights N(0, 0.02), norms' weights 1: the logits are nearly uniform, the loss ln V.
    assert abs(res["first_loss"] - math.log(V)) < 0.05, f"first loss {res['first_loss']}, want ~{math.log(V):.3f}"
    assert math.isfinite(res["last_loss"]) and res["tokens_per_s"] > 0, res
    print("llm.c peer: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
