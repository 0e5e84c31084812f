#!/usr/bin/env python3
"""The hardening soak: tries the runner from outside, as a careless user and a
hostile machine would, and prints a pass table. Exit 1 when any trial fails.

  kill     kill -9 at a random instant (half of them within 30 ms of a checkpoint's temporary
           file appearing), then `runner resume` (or `runner train` again when no checkpoint
           was published); the final checkpoint's datasets (crc32c of every one, as `runner
           inspect` prints them) and every step's loss must equal an uninterrupted run's, with
           no step recorded twice in metrics.jsonl.
  corrupt  random byte flips, truncations and zeroed blocks in the newest checkpoint, against
           `runner inspect` and (every --resume-every'th) `runner resume`: no crash (exit >= 128),
           and no silent acceptance (inspect OK, or a resume from that file, while its contents
           differ from the original's).
  recipe   mutations of recipes/*.yaml (deleted keys, swapped types, huge and negative
           numbers, random bytes, aliases, deep nesting, long strings) against `runner plan`:
           exit 0 or 2, within 5 s.
  data     bad data files (random bytes, empty, truncated, odd sizes, a directory) against
           `runner train`: exit 0 or 2 naming the file.
  cli      random command lines from a pool of words: exit 0 or 2.

Short form (CI, a few minutes): --trials 3. Long form: --trials 200 (the kill trials take
~6 s each on 2 cores; the others scale as 5x, 25x, 1x and 5x the trials).
"""
import argparse
import json
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUICK = os.path.join(ROOT, "recipes", "quickstart.yaml")
BASE = ["--quiet", "--set", "train.eval_every=0", "--set", "hardware.peak_tflops=1", "--set", "model.dropout=0.1"]
KILL_ARGS = BASE + ["--set", "train.steps=30", "--set", "checkpoint.every_steps=10", "--set", "checkpoint.keep_last=10"]
ENV = dict(os.environ, OMP_NUM_THREADS="2", OMP_WAIT_POLICY="PASSIVE")


class Tally:
    def __init__(self):
        self.rows = {}

    def add(self, cat, ok, crash=False, silent=False, timeout=False, note=None, contained=False):
        r = self.rows.setdefault(cat, dict(trials=0, passed=0, crashes=0, silent=0, timeouts=0, contained=0, notes=[]))
        r["trials"] += 1
        r["contained"] += bool(contained)
        r["passed"] += bool(ok)
        r["crashes"] += bool(crash)
        r["silent"] += bool(silent)
        r["timeouts"] += bool(timeout)
        if not ok and note and len(r["notes"]) < 5:
            r["notes"].append(note)

    def table(self):
        # contained: HDF5 crashed in the runner's forked reader child and the runner reported the
        # file as corrupt (a pass, but what reading by name is meant to bring to 0).
        lines = ["%-36s %7s %7s %8s %7s %9s %9s" % ("category", "trials", "passed", "crashes", "silent", "past 5 s",
                                                      "contained")]
        for cat, r in self.rows.items():
            lines.append("%-36s %7d %7d %8d %7d %9d %9d" % (cat, r["trials"], r["passed"], r["crashes"], r["silent"],
                                                             r["timeouts"], r["contained"]))
        for cat, r in self.rows.items():
            for n in r["notes"]:
                lines.append("  FAIL %s: %s" % (cat, n))
        return "\n".join(lines)

    def ok(self):
        return all(r["passed"] == r["trials"] for r in self.rows.values())


def cpu_children():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run(runner, args, cwd=None, timeout=120, env=None):
    """(exit code or None on timeout, output, CPU seconds of the run: what "past 5 s" counts,
    since a loaded CI machine stretches the wall clock)."""
    t0 = time.time()
    c0 = cpu_children()
    try:
        p = subprocess.run([runner] + args, cwd=cwd, env=env or ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=timeout)
        rc = p.returncode if p.returncode >= 0 else 128 - p.returncode
        return rc, p.stdout.decode("utf-8", "replace"), cpu_children() - c0
    except subprocess.TimeoutExpired as e:
        return None, (e.stdout or b"").decode("utf-8", "replace"), time.time() - t0


def crashed(rc, out):
    return rc is not None and (rc >= 128 or rc < 0 or "terminate called" in out or "free(): " in out or
                               "infinite loop closing" in out)


def fingerprint(runner, path):
    """What `runner inspect` says of a file, without its path line: every dataset's crc32c and
    /state; None when it does not verify."""
    rc, out, _ = run(runner, ["inspect", path], timeout=60)
    if rc != 0 or "verdict: OK" not in out:
        return None
    # The stored recipe (and so the total bytes) differs with checkpoint.async: not state.
    keep = [l for l in out.splitlines()[1:] if not l.strip().startswith(("/recipe ", "recipe:", "verdict:"))]
    return "\n".join(keep)


def losses(metrics):
    steps = []
    with open(metrics) as f:
        for line in f:
            j = json.loads(line)
            if "loss" in j and "step" in j and not j.get("eval"):
                steps.append((j["step"], j["loss"]))
    return steps


# ---------------------------------------------------------------------------------------
def kill_trials(runner, work, n, rng, tally):
    ref = os.path.join(work, "kill_ref")
    w0 = time.time()
    rc, out, _ = run(runner, ["train", QUICK] + KILL_ARGS + ["--run-dir", ref])
    ref_s = time.time() - w0
    if rc != 0:
        tally.add("kill -9 + resume", False, note="reference run failed: " + out[-300:])
        return
    ref_fp = fingerprint(runner, os.path.join(ref, "checkpoints", "step_00000030.h5"))
    ref_loss = losses(os.path.join(ref, "metrics.jsonl"))
    for t in range(n):
        d = os.path.join(work, "kill_%d" % t)
        shutil.rmtree(d, ignore_errors=True)
        ck = os.path.join(d, "checkpoints")
        args = ["train", QUICK] + KILL_ARGS + ["--set", "checkpoint.async=%s" % ("true" if t % 4 >= 2 else "false"),
                                               "--run-dir", d]
        p = subprocess.Popen([runner] + args, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        biased = t % 2 == 0
        t0 = time.time()
        if biased:  # wait for a checkpoint's temporary file, then kill within 30 ms
            want = rng.choice([10, 20, 30])
            tmp = re.compile(r"\.step_%08d\.h5\.tmp\." % want)
            while p.poll() is None and time.time() - t0 < 120:
                if os.path.isdir(ck) and any(tmp.match(f) for f in os.listdir(ck)):
                    time.sleep(rng.uniform(0, 0.03))
                    break
                time.sleep(0.002)
        else:
            time.sleep(rng.uniform(0.05, ref_s))
        finished = p.poll() is not None
        if not finished:
            p.send_signal(signal.SIGKILL)
        p.wait()
        latest = os.path.exists(os.path.join(ck, "LATEST"))
        cmd = ["resume", d, "--quiet"] if latest else args
        rc, out, _ = run(runner, cmd)
        fp = fingerprint(runner, os.path.join(ck, "step_00000030.h5")) if rc == 0 else None
        got = losses(os.path.join(d, "metrics.jsonl")) if os.path.exists(os.path.join(d, "metrics.jsonl")) else []
        ok = rc == 0 and fp is not None and fp == ref_fp and got == ref_loss
        why = "rc %s, tensors %s, losses %s (%d records)%s" % (
            rc, "equal" if fp == ref_fp else "DIFFER", "equal" if got == ref_loss else "DIFFER", len(got),
            "" if rc == 0 else ": " + out[-300:])
        tally.add("kill -9 + resume" + (" (at a ckpt write)" if biased else " (at random)"), ok,
                  crash=crashed(rc, out), note="trial %d: %s" % (t, why))
        print("  kill trial %d: %s" % (t, "pass" if ok else "FAIL " + why), flush=True)
        shutil.rmtree(d, ignore_errors=True)


# ---------------------------------------------------------------------------------------
def corrupt(data, rng):
    b = bytearray(data)
    kind = rng.randrange(3)

    def pos():  # metadata sits mostly in the first and last 64 KiB
        r = rng.randrange(65536)
        if rng.random() < 0.25:
            return rng.randrange(len(b))
        return r % len(b) if rng.random() < 0.5 else len(b) - 1 - r % len(b)

    if kind == 0:
        for _ in range(rng.randint(1, 8)):
            i = pos()
            b[i] ^= rng.randint(1, 255)
        what = "flips"
    elif kind == 1:
        del b[rng.randrange(len(b)):]
        what = "truncation"
    else:
        i, n = pos(), rng.choice([8, 64, 512, 4096, 65536])
        b[i:i + n] = bytes(min(n, len(b) - i))
        what = "zeroed block"
    return bytes(b), what


def corrupt_trials(runner, work, n, rng, tally, resume_every):
    base = os.path.join(work, "corrupt_base")
    rc, out, _ = run(runner, ["train", QUICK] + BASE + ["--set", "train.steps=20", "--set", "checkpoint.every_steps=10",
                                                        "--set", "checkpoint.keep_last=5", "--run-dir", base])
    if rc != 0:
        tally.add("corrupt checkpoint: inspect", False, note="base run failed: " + out[-300:])
        return
    f20 = os.path.join(base, "checkpoints", "step_00000020.h5")
    good = open(f20, "rb").read()
    good_fp = fingerprint(runner, f20)
    for t in range(n):
        bad, what = corrupt(good, rng)
        d = os.path.join(work, "corrupt_%d" % t)
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(base, d)
        f = os.path.join(d, "checkpoints", "step_00000020.h5")
        with open(f, "wb") as o:
            o.write(bad)
        rc, out, _ = run(runner, ["inspect", f], timeout=60)
        same = fingerprint(runner, f) == good_fp if rc == 0 else False
        silent = rc == 0 and not same
        ok = rc in (0, 2) and not silent and not crashed(rc, out)
        tally.add("corrupt checkpoint: inspect", ok, crash=crashed(rc, out), silent=silent, timeout=rc is None,
                  note="trial %d (%s): rc %s %s" % (t, what, rc, out[-200:]), contained="crashed the reader" in out)
        if resume_every and t % resume_every == 0:
            rc2, out2, _ = run(runner, ["resume", d, "--set", "train.steps=21"])
            log = open(os.path.join(d, "log.rank0.txt"), errors="replace").read()
            used_bad = "resumed from %s (step 20)" % f in log or ("resumed from step 20" in log and "does not verify" not in log)
            silent2 = used_bad and not (rc == 0 and same)
            ok2 = rc2 in (0, 2) and not crashed(rc2, out2) and not silent2
            tally.add("corrupt checkpoint: resume", ok2, crash=crashed(rc2, out2), silent=silent2, timeout=rc2 is None,
                      note="trial %d (%s): rc %s %s" % (t, what, rc2, out2[-200:]),
                      contained="crashed the reader" in out2 + log)
        shutil.rmtree(d, ignore_errors=True)


# ---------------------------------------------------------------------------------------
def mutate_recipe(text, rng):
    lines = text.splitlines()
    kinds = ["delete", "type", "number", "bytes", "alias", "nest", "long", "dup", "indent"]
    k = rng.choice(kinds)
    values = [i for i, l in enumerate(lines) if re.match(r"^\s+\w+:\s*\S", l) and not l.strip().startswith("#")]
    if k == "delete" and lines:
        for _ in range(rng.randint(1, 3)):
            del lines[rng.randrange(len(lines))]
    elif k in ("type", "number", "long") and values:
        i = rng.choice(values)
        key = lines[i].split(":")[0]
        if k == "type":
            v = rng.choice(["abc", "[1, 2]", "{a: 1}", "true", "null", "''", "1.5", "0x10", "~", "[]", "{}", "!!binary aGk="])
        elif k == "number":
            v = rng.choice(["-1", "0", "1e308", "-1e308", "9223372036854775807", "9223372036854775808",
                            "-9223372036854775808", "99999999999999999999999", "1e-320", ".nan", ".inf", "-.inf",
                            str(rng.randint(-10**6, 10**12))])
        else:
            v = "x" * rng.choice([1000, 100000, 1000000])
        lines[i] = key + ": " + v
    elif k == "bytes":
        s = "\n".join(lines)
        i = rng.randrange(len(s) + 1)
        s = s[:i] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 16))).decode("latin-1") + s[i:]
        return s
    elif k == "alias":
        depth = rng.randint(2, 12)
        bomb = ["bomb:", "  l0: &a0 [" + ", ".join(["lol"] * 10) + "]"]
        for j in range(1, depth):
            bomb.append("  l%d: &a%d [%s]" % (j, j, ", ".join(["*a%d" % (j - 1)] * 10)))
        at = rng.choice(["top", "model"])
        if at == "top":
            lines += bomb
        else:
            lines += ["model2: &m", "  d_model: 8", "model3: *m", "model4: *undefined"]
    elif k == "nest":
        depth = rng.choice([20, 100, 1000, 10000])
        lines.append("deep: " + "[" * depth + "]" * depth if rng.random() < 0.5 else "deep: " + "{a: " * depth + "1" + "}" * depth)
    elif k == "dup" and values:
        i = rng.choice(values)
        lines.insert(i, lines[i])
    elif k == "indent" and values:
        i = rng.choice(values)
        lines[i] = rng.choice(["\t", "   ", " "]) + lines[i]
    return "\n".join(lines) + "\n"


def recipe_trials(runner, work, n, rng, tally):
    recipes = sorted(os.path.join(ROOT, "recipes", f) for f in os.listdir(os.path.join(ROOT, "recipes")) if f.endswith(".yaml"))
    texts = [open(r).read() for r in recipes]
    f = os.path.join(work, "fuzz.yaml")
    for t in range(n):
        s = texts[t % len(texts)]
        for _ in range(rng.choice([1, 1, 2, 3])):
            s = mutate_recipe(s, rng)
        with open(f, "w", encoding="latin-1", errors="replace") as o:
            o.write(s)
        rc, out, secs = run(runner, ["plan", f] + (["--json"] if t % 5 == 0 else []), timeout=60)
        ok = rc in (0, 2) and not crashed(rc, out) and secs < 5
        tally.add("recipe fuzz: plan", ok, crash=crashed(rc, out), timeout=rc is None or secs >= 5,
                  note="trial %d: rc %s in %.1f s: %s" % (t, rc, secs, out[-200:]))
        if not ok:
            shutil.copy(f, os.path.join(work, "fuzz_fail_%d.yaml" % t))


# ---------------------------------------------------------------------------------------
def data_trials(runner, work, n, rng, tally):
    fixtures = [os.path.join(ROOT, "tests", "fixtures", x) for x in ("gpt_tiny.h5", "llama_tiny.h5")]
    for t in range(n):
        kind = rng.choice(["text", "hdf5", "bin"])
        f = os.path.join(work, "data_%d.%s" % (t, {"text": "txt", "hdf5": "h5", "bin": "bin"}[kind]))
        shape = rng.choice(["random", "empty", "short", "truncated_h5", "odd", "dir", "missing", "big_tokens"])
        if shape == "random":
            open(f, "wb").write(bytes(rng.randrange(256) for _ in range(rng.randint(1, 200000))))
        elif shape == "empty":
            open(f, "wb").close()
        elif shape == "short":
            open(f, "wb").write(b"ab")
        elif shape == "truncated_h5":
            src = open(rng.choice(fixtures), "rb").read()
            open(f, "wb").write(src[:rng.randrange(len(src))])
        elif shape == "odd":
            open(f, "wb").write(bytes(rng.randrange(256) for _ in range(2 * rng.randint(1, 5000) + 1)))
        elif shape == "dir":
            os.makedirs(f, exist_ok=True)
        elif shape == "big_tokens":
            open(f, "wb").write(b"\xff\xff" * 50000)
        rc, out, _ = run(runner, ["train", QUICK] + BASE + ["--set", "train.steps=1", "--set", "data.kind=" + kind,
                                                            "--set", "data.path=" + f, "--run-dir",
                                                            os.path.join(work, "data_run_%d" % t)], timeout=120)
        ok = rc in (0, 2) and not crashed(rc, out) and (rc == 0 or f in out or os.path.basename(f) in out)
        tally.add("bad data file: train", ok, crash=crashed(rc, out), timeout=rc is None,
                  note="trial %d (%s %s): rc %s %s" % (t, kind, shape, rc, out[-200:]))
        shutil.rmtree(os.path.join(work, "data_run_%d" % t), ignore_errors=True)
        if os.path.isdir(f):
            shutil.rmtree(f)
        elif os.path.exists(f):
            os.remove(f)


def cli_trials(runner, work, n, rng, tally):
    tiny = os.path.join(work, "tiny.yaml")
    with open(tiny, "w") as o:
        o.write(open(QUICK).read().replace("steps: 1500", "steps: 2").replace("every_steps: 500", "every_steps: 1"))
    words = ["plan", "train", "resume", "inspect", "data", "prepare", "--set", "--json", "--world", "--step", "--strict",
             "--quiet", "--run-dir", "--diagnose-precision", "--version", "--help", "-h", tiny, tiny, "/nonexistent",
             "/proc/x/y", "/etc/hostname", "runs/tiny", "runs/tiny/checkpoints/LATEST", "batch.micro=-1", "batch.micro=0",
             "train.steps=1", "=", "a.b.c=1", "parallel.tp=3", "0", "-1", "99999999999999999999", "abc", "", "--", "-x",
             "--set=model.d_model=7", "\x01", "é", "%s%s%n"]
    for t in range(n):
        argv = [rng.choice(words) for _ in range(rng.randint(0, 6))]
        if "train" in argv or "resume" in argv:
            argv += ["--set", "train.steps=2"]
        rc, out, secs = run(runner, argv, cwd=work, timeout=60)
        ok = rc in (0, 2) and not crashed(rc, out)
        tally.add("bad command line", ok, crash=crashed(rc, out), timeout=rc is None,
                  note="trial %d %r: rc %s %s" % (t, argv, rc, out[-200:]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runner", default=os.path.join(ROOT, "build", "runner"))
    ap.add_argument("--trials", type=int, default=3, help="kill trials; corruptions 5x, recipes 25x, data 1x, command lines 5x")
    ap.add_argument("--kill", type=int), ap.add_argument("--corrupt", type=int), ap.add_argument("--recipes", type=int)
    ap.add_argument("--data", type=int), ap.add_argument("--cli", type=int)
    ap.add_argument("--resume-every", type=int, default=5, help="resume against every Nth corrupted checkpoint")
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--work", help="scratch directory (default: a new temporary one, removed at the end)")
    a = ap.parse_args()
    n = a.trials
    counts = dict(kill=a.kill if a.kill is not None else n, corrupt=a.corrupt if a.corrupt is not None else 5 * n,
                  recipes=a.recipes if a.recipes is not None else 25 * n, data=a.data if a.data is not None else n,
                  cli=a.cli if a.cli is not None else 5 * n)
    work = a.work or tempfile.mkdtemp(prefix="runner_soak_")
    os.makedirs(work, exist_ok=True)
    rng = random.Random(a.seed)
    tally = Tally()
    t0 = time.time()

    def stop(sig, frame):  # a long soak cut short still reports what it tried
        print("\nstopped by signal %d after %.0f s\n%s" % (sig, time.time() - t0, tally.table()), flush=True)
        sys.exit(1)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for name, fn in (("recipes", recipe_trials), ("cli", cli_trials), ("data", data_trials), ("corrupt", None),
                     ("kill", kill_trials)):
        s = time.time()
        if name == "corrupt":
            corrupt_trials(a.runner, work, counts[name], rng, tally, a.resume_every)
        else:
            fn(a.runner, work, counts[name], rng, tally)
        print("%s: %d trials in %.0f s" % (name, counts[name], time.time() - s), flush=True)
        print(tally.table(), flush=True)
    print("\nsoak (seed %d, %.0f s)\n%s" % (a.seed, time.time() - t0, tally.table()))
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if tally.ok() else 1


if __name__ == "__main__":
    sys.exit(main())
