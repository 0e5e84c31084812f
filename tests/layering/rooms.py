#!/usr/bin/python3
"""The rooms of runner/ hold: each room includes only the rooms it stands on.

    tests/layering/rooms.py [SOURCE_DIR]

The layers (ops <- parallel <- runner) are enforced by the build's include roots; inside
runner/ the rooms are folders of one library, so this walks every `#include "runner/..."` of
every file under runner/ and fails on an include the table below does not allow, naming the
file, the line and the room it climbed into. The table is the map of docs/architecture.md:
change both together. Files directly in runner/ are rooms of their own (errors, agree, atomic_output,
signals: the base every room may use; state: the training state), as is main.cpp. It also
checks that only the device room calls ops::cpu_backend() (docs/invariants.md, invariant 7).
"""
import os
import re
import sys

# room -> the rooms it may include (besides itself and BASE). A DAG: no room reaches a room
# above it, so each can be understood, tested and replaced from the rooms below.
BASE = {"errors", "agree", "signals", "atomic_output"}
ROOMS = {
    "hdf5": set(),
    "recipe": set(),
    "tokenize": set(),
    "device": {"recipe"},
    "model": {"recipe"},
    "plan": {"model", "recipe", "device"},
    # The performance model: hardware profiles, calibration, peaks, the cost model, the layout
    # search, its verification and the run's layout advice. Above the plan (it prices plans).
    "perf": {"plan", "model", "recipe", "device"},
    "data": {"recipe", "hdf5", "tokenize"},
    "state": {"data", "model"},
    "checkpoint": {"state", "plan", "model", "recipe", "data", "hdf5"},
    "run": {"checkpoint", "state", "plan", "model", "recipe", "data", "device", "hdf5"},
    "observe": {"perf", "state", "plan", "model", "recipe"},
    "train": {"perf", "observe", "run", "checkpoint", "state", "plan", "model", "recipe", "data", "device", "hdf5", "tokenize"},
    "trained": {"checkpoint", "run", "state", "plan", "model", "recipe", "data", "device", "tokenize"},
    "generate": {"trained", "checkpoint", "state", "plan", "model", "recipe", "data", "device", "tokenize"},
    "export": {"trained", "checkpoint", "state", "plan", "model", "recipe", "device", "hdf5", "tokenize"},
    "report": set(),
}
# The command line stands on everything.
TOP = {"cli", "main"}


def room_of(rel):
    """runner/train/trainer.cpp -> train; runner/state.h -> state; runner/main.cpp -> main."""
    parts = rel.split("/")
    if len(parts) == 2:
        return os.path.splitext(parts[1])[0]
    return parts[1]


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    inc = re.compile(r'^\s*#\s*include\s+"(runner/[^"]+)"')
    bad, files = [], 0
    for dirpath, _, names in os.walk(os.path.join(root, "runner")):
        for n in sorted(names):
            if not n.endswith((".h", ".cpp", ".cu", ".cuh")):
                continue
            path = os.path.join(dirpath, n)
            rel = os.path.relpath(path, root)
            room = room_of(rel)
            files += 1
            if room not in ROOMS and room not in BASE and room not in TOP:
                bad.append(f"{rel}: room '{room}' is not in tests/layering/rooms.py's table; add it there and "
                           "to docs/architecture.md")
                continue
            allowed = None if room in TOP else ROOMS.get(room, set()) | BASE | {room}
            with open(path, encoding="utf-8") as f:
                for i, line in enumerate(f, 1):
                    m = inc.match(line)
                    if not m or allowed is None:
                        continue
                    target = room_of(m.group(1))
                    if target not in allowed:
                        bad.append(f"{rel}:{i}: room '{room}' includes {m.group(1)} (room '{target}'), which it does "
                                   f"not stand on; allowed: {', '.join(sorted(allowed - {room}))}")
            if room != "device":
                with open(path, encoding="utf-8") as f:
                    for i, line in enumerate(f, 1):
                        if "cpu_backend()" in line and not line.lstrip().startswith("//"):
                            bad.append(f"{rel}:{i}: calls ops::cpu_backend(); the backend is chosen once "
                                       "(runner/device/) and passed down (docs/invariants.md, invariant 7)")
    for b in bad:
        print(b)
    print(f"{files} files under runner/, {len(bad)} include(s) that climb a room")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
