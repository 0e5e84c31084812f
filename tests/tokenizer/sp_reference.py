#!/usr/bin/python3
"""The SentencePiece references for test_tokenizer_sp (Debian's python3-sentencepiece).

  sp_reference.py encode MODEL DOCS.json OUT        ids of each document, one line each
  sp_reference.py hf-json MODEL bpe|unigram OUT     the model as a Hugging Face tokenizer.json
  sp_reference.py bench MODEL DOCS.json             seconds to encode all documents

hf-json writes what transformers' LlamaConverter writes for a SentencePiece model (legacy
layout): the pieces with their scores, BPE merges derived from the vocabulary as its
SentencePieceExtractor does, the Prepend("▁") + Replace(" ", "▁") normalizer, the decoder
Replace("▁", " "), ByteFallback, Fuse, Strip(1 leading space), and <unk>, <s>, </s> as
special added tokens. For a Unigram model the spaces are replaced by a Metaspace
pre-tokenizer instead (prepend_scheme never, split false: the normalizer prepends) and the
decoder ends with a Metaspace decoder, so those two stages are exercised too; both layouts
give SentencePiece's ids for text without the special-token strings.
"""
import json
import sys
import time

import sentencepiece as spm


def load(path):
    sp = spm.SentencePieceProcessor()
    sp.Load(path)
    return sp


def merges_of(vocab, vocab_scores):
    # transformers' SentencePieceExtractor.extract(vocab_scores): every split of a piece into
    # two pieces, ordered by the piece's score (then by the parts' ids).
    merges = []
    for merge, piece_score in vocab_scores.items():
        local = []
        for index in range(1, len(merge)):
            piece_l, piece_r = merge[:index], merge[index:]
            if piece_l in vocab and piece_r in vocab:
                local.append((piece_l, piece_r, piece_score))
        local = sorted(local, key=lambda x: (vocab[x[0]], vocab[x[1]]))
        merges.extend(local)
    merges = sorted(merges, key=lambda val: val[2], reverse=True)
    return [[a, b] for a, b, _ in merges]


def hf_json(sp, kind):
    n = sp.GetPieceSize()
    pieces = [(sp.IdToPiece(i), sp.GetScore(i)) for i in range(n)]
    byte_fallback = any(sp.IsByte(i) for i in range(n))
    added = []
    for i in range(n):
        if sp.IsControl(i) or sp.IsUnknown(i):
            added.append({"id": i, "content": pieces[i][0], "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True})
    strip = {"type": "Strip", "content": " ", "start": 1, "stop": 0}
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "post_processor": None}
    if kind == "bpe":
        vocab = {p: i for i, (p, _) in enumerate(pieces)}
        tok["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
        tok["pre_tokenizer"] = None
        tok["model"] = {"type": "BPE", "dropout": None, "unk_token": sp.IdToPiece(sp.unk_id()),
                        "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True,
                        "byte_fallback": byte_fallback, "ignore_merges": False, "vocab": vocab,
                        "merges": merges_of(vocab, dict(pieces))}
        tok["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}, strip]}
    else:
        tok["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"}]}
        tok["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "never", "split": False}
        tok["model"] = {"type": "Unigram", "unk_id": sp.unk_id(), "vocab": [[p, s] for p, s in pieces],
                        "byte_fallback": byte_fallback}
        tok["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": False}]}
    return tok


def main():
    mode = sys.argv[1]
    sp = load(sys.argv[2])
    if mode == "encode":
        docs = json.load(open(sys.argv[3], encoding="utf-8"))
        with open(sys.argv[4], "w") as f:
            for ids in sp.EncodeAsIds(docs):
                f.write(" ".join(map(str, ids)) + "\n")
    elif mode == "hf-json":
        with open(sys.argv[4], "w", encoding="utf-8") as f:
            json.dump(hf_json(sp, sys.argv[3]), f, ensure_ascii=False)
    elif mode == "bench":
        docs = json.load(open(sys.argv[3], encoding="utf-8"))
        sp.EncodeAsIds(docs[:1])
        t0 = time.perf_counter()
        for d in docs:
            sp.EncodeAsIds(d)
        print(time.perf_counter() - t0)


if __name__ == "__main__":
    main()
