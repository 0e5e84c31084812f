#!/usr/bin/python3
"""Interrupted outputs: export, import and data prepare stopped at random moments.

    tests/soak/outputs.py --runner build/runner [--seed S] [--budget 120] [--trials N]

Each trial replaces an existing output with --force and interrupts the command at a random
moment of its measured duration: SIGINT, SIGTERM, SIGKILL, or a full disk (a small tmpfs
holding the output when this process may mount one, else a file-size limit, whose EFBIG the
runner meets as it would ENOSPC). The two versions each surface alternates between (fp32 and
bf16 exports, imports of the two, two corpora) are deterministic, so after every trial the
output must be byte for byte the previous one or the new one whole; which one follows from the
exit code: 0 published the new one, 3 (a handled signal) and 2 (a clean error) kept the
previous one, a kill may have come before or after the swap. A command that ran to its end
leaves no temporary; a killed one's temporary is removed by the next command on that output.
Prints the seed first, so a failure replays with --seed; exits 1 on any broken rule.
"""
import argparse
import hashlib
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

SURFACES = ("export", "import", "prepare")
FAULTS = ("SIGINT", "SIGTERM", "SIGKILL", "ENOSPC")


def tree(path):
    """relative path -> sha256 of every file under `path` (None when it does not exist)."""
    if not os.path.isdir(path):
        return None
    out = {}
    for root, _, files in os.walk(path):
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, path)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def leftovers(parent, keep):
    return sorted(n for n in os.listdir(parent) if n not in keep)


class Soak:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.work = tempfile.mkdtemp(prefix="runner_soak_outputs_")
        self.failures = []
        self.tally = {s: {"cases": 0, "published": 0, "kept": 0, "clean_errors": 0, "killed": 0, "crashes": 0,
                          "wrong": 0, "damaged": 0} for s in SURFACES}
        self.mounts = []

    def sh(self, argv, **kw):
        return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)

    def runner(self, *a, check=True):
        r = self.sh([self.args.runner, *a])
        if check and r.returncode != 0:
            sys.exit(f"setup failed: runner {' '.join(a)}\n{r.stdout}")
        return r

    # ---- setup: the inputs, and the two versions of each output ----
    def setup(self):
        w = self.work
        q = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "recipes", "quickstart.yaml")
        # A model big enough that its export and import take a while (about 13 MB in fp32).
        self.runner("train", q, "--quiet", "--run-dir", f"{w}/run", "--set", "train.steps=1", "train.eval_every=0",
                    "checkpoint.every_steps=1", "model.d_model=256", "model.n_heads=4", "model.n_layers=4",
                    "model.seq_len=32", "batch.micro=1")
        rng = random.Random(1)
        words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]
        for name, n in (("a", 60000), ("b", 50000)):
            os.makedirs(f"{w}/corpus_{name}")
            with open(f"{w}/corpus_{name}/text.txt", "w") as f:
                for i in range(n):
                    f.write(" ".join(rng.choice(words) for _ in range(12)) + f" {i}\n")
        # The import's sources: the run exported in both types.
        self.runner("export", f"{w}/run", "--out", f"{w}/hf_fp32")
        self.runner("export", f"{w}/run", "--out", f"{w}/hf_bf16", "--dtype", "bf16")
        self.commands = {
            "export": [["export", f"{w}/run", "--dtype", "fp32"], ["export", f"{w}/run", "--dtype", "bf16"]],
            "import": [["import", f"{w}/hf_fp32"], ["import", f"{w}/hf_bf16"]],
            "prepare": [["data", "prepare", f"{w}/corpus_a"], ["data", "prepare", f"{w}/corpus_b"]],
        }
        # The reference of each version, and how long the command takes.
        self.ref, self.secs = {}, {}
        for s in SURFACES:
            self.ref[s] = []
            for v in (0, 1):
                out = f"{w}/ref_{s}_{v}/out"
                os.makedirs(os.path.dirname(out))
                t0 = time.monotonic()
                self.runner(*self.argv(s, v, out))
                self.secs[s] = max(self.secs.get(s, 0), time.monotonic() - t0)
                self.ref[s].append(tree(out))
            if self.ref[s][0] == self.ref[s][1]:
                sys.exit(f"setup: the two versions of {s} are the same bytes; the soak could not tell them apart")
        # Where each surface's output lives (the current version, v), on disk and on a small file system.
        self.out, self.cur = {}, {}
        for s in SURFACES:
            parent = f"{w}/{s}"
            os.makedirs(parent)
            self.out[s] = f"{parent}/out"
            self.runner(*self.argv(s, 0, self.out[s]))
            self.cur[s] = 0
        self.full, self.full_cur = {}, {}
        for s in SURFACES:
            parent = f"{w}/full_{s}"
            os.makedirs(parent)
            # Room for the larger version and half of the smaller one (plus pages' rounding): no
            # new version fits beside the previous one.
            sizes = [self.bytes_of(f"{w}/ref_{s}_{i}/out") for i in (0, 1)]
            big, small = max(sizes), min(sizes)
            kb = (big + small // 2) // 1024 + 256
            r = self.sh(["mount", "-t", "tmpfs", "-o", f"size={kb}k", "tmpfs", parent]) if os.geteuid() == 0 else None
            mounted = r is not None and r.returncode == 0
            if mounted:
                self.mounts.append(parent)
            self.full[s] = (f"{parent}/out", mounted)
            self.runner(*self.argv(s, 0, self.full[s][0]))
            self.full_cur[s] = 0
        print(f"setup: export {self.secs['export']:.2f} s, import {self.secs['import']:.2f} s, prepare "
              f"{self.secs['prepare']:.2f} s; full disk by {'tmpfs' if self.mounts else 'file-size limit'}", flush=True)

    @staticmethod
    def bytes_of(path):
        return sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs)

    def argv(self, surface, version, out):
        c = list(self.commands[surface][version])
        if surface == "prepare":
            return c + [out, "--force"]
        return c + ["--out", out, "--force"]

    # ---- one trial ----
    def trial(self, n):
        s = self.rng.choice(SURFACES)
        fault = self.rng.choice(FAULTS)
        t = self.tally[s]
        t["cases"] += 1
        full = fault == "ENOSPC"
        out, on_tmpfs = self.full[s] if full else (self.out[s], False)
        old = self.full_cur[s] if full else self.cur[s]
        new = 1 - old
        parent = os.path.dirname(out)
        delay = self.rng.uniform(0, self.secs[s] * 1.2)
        argv = [self.args.runner, *self.argv(s, new, out)]
        staged = False
        what = f"trial {n}: {s} {fault}" + ("" if full else f" after {delay:.3f} s")
        if full:
            limit = None if on_tmpfs else 65536  # every output has a larger file

            def pre():
                if limit:
                    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
            p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=pre)
        else:
            p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            time.sleep(delay)
            # Its temporary exists only once the command has installed its handlers: a signal
            # after that must be handled (exit 3, or 0 when it came after the swap).
            staged = os.path.exists(os.path.join(parent, f".out.tmp.{p.pid}"))
            p.send_signal(getattr(signal, fault))
        text, _ = p.communicate()
        rc = p.returncode
        got = tree(out)
        bad = lambda why: self.fail(f"{what}: {why} (exit {rc})\n{text[-1500:]}", s)
        if got is None:
            t["damaged"] += 1
            return bad("the output is gone")
        is_old, is_new = got == self.ref[s][old], got == self.ref[s][new]
        if not is_old and not is_new:
            t["damaged"] += 1
            return bad("the output is neither the previous one nor the new one whole")
        if rc == 0:
            if not is_new:
                t["wrong"] += 1
                return bad("exit 0 but the previous output is still there")
            t["published"] += 1
        elif rc in (2, 3):
            if not is_old:
                t["wrong"] += 1
                return bad("a failed command replaced the output")
            if rc == 2 and not full:
                t["wrong"] += 1
                return bad("a signal ended as a user error, not exit 3")
            if rc == 3 and full:
                t["wrong"] += 1
                return bad("exit 3 without a signal")
            if "Traceback" in text or "terminate called" in text:
                t["crashes"] += 1
                return bad("an unclean message")
            t["clean_errors" if rc == 2 else "kept"] += 1
        elif rc < 0 and fault in ("SIGINT", "SIGTERM") and -rc == getattr(signal, fault) and staged:
            t["wrong"] += 1
            return bad("the signal was not handled: the command died of it mid-write")
        elif rc < 0 and fault in ("SIGKILL", "SIGINT", "SIGTERM") and -rc == getattr(signal, fault):
            # SIGKILL, or a signal before the handlers were installed: either output, a temporary allowed.
            t["killed"] += 1
        else:
            t["crashes"] += 1
            return bad("the command crashed")
        (self.full_cur if full else self.cur)[s] = new if is_new else old
        if rc >= 0:  # ran to its end: its own temporary and lock are gone, a killed one's swept
            extra = leftovers(parent, {"out"})
            if extra:
                return bad(f"left behind: {extra}")

    def fail(self, msg, surface):
        self.failures.append(msg)
        print("FAIL " + msg, flush=True)

    def finish(self):
        # One clean command per output: whatever a kill left is swept.
        for s in SURFACES:
            for out in (self.out[s],):
                v = 1 - self.cur[s]
                r = self.runner(*self.argv(s, v, out), check=False)
                if r.returncode != 0 or tree(out) != self.ref[s][v]:
                    self.fail(f"final {s}: exit {r.returncode}, output {'whole' if tree(out) == self.ref[s][v] else 'wrong'}\n{r.stdout[-800:]}", s)
                extra = leftovers(os.path.dirname(out), {"out"})
                if extra:
                    self.fail(f"final {s}: left behind after the next command: {extra}", s)

    def cleanup(self):
        for m in self.mounts:
            subprocess.run(["umount", "-l", m])
        shutil.rmtree(self.work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runner", required=True)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--budget", type=float, default=100, help="seconds of trials after setup")
    ap.add_argument("--trials", type=int, default=0, help="stop after this many trials (0: the budget decides)")
    args = ap.parse_args()
    if args.seed is None:
        args.seed = int.from_bytes(os.urandom(4), "little")
    print(f"outputs soak: seed {args.seed} (replay: {sys.argv[0]} --runner {args.runner} --seed {args.seed})", flush=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    soak = Soak(args)
    try:
        soak.setup()
        t0, n = time.monotonic(), 0
        while time.monotonic() - t0 < args.budget and (args.trials == 0 or n < args.trials):
            n += 1
            soak.trial(n)
        soak.finish()
    finally:
        soak.cleanup()
    print(f"{n} trials, seed {args.seed}")
    for s, t in soak.tally.items():
        print(f"  {s}: " + ", ".join(f"{k} {v}" for k, v in t.items()))
    if soak.failures:
        print(f"FAILED: {len(soak.failures)} broken rule(s); replay with --seed {args.seed}")
        return 1
    print("PASS: every output was the previous one or the new one whole; no temporary outlived the next command")
    return 0


if __name__ == "__main__":
    sys.exit(main())
