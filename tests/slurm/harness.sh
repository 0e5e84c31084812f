# shellcheck shell=bash
# What the two Slurm test groups (tests/slurm/run.sh on one node, nodes.sh on two) share: the
# machine-wide lock, the work directory and the failure log, and the helpers that read a run's
# files and Slurm's queue. Sourced by both after `set -uo pipefail`; the group defines
# script_for and job_gone itself (they differ per cluster).
#
#   slurm_group_start NAME "$@" -> slurm_group_lock, then slurm_group_init NAME with the script's $1
#   slurm_group_lock "$@"      -> re-runs the calling script under /tmp/runner-slurm.lock
#   slurm_group_init NAME BIN  -> RUNNER (BIN), HERE, SEED, RANDOM, WORK (runner_NAME.XXXXXX), T0, PY
#   slurm_group_finish         -> keeps WORK when anything failed (or RUNNER_SLURM_KEEP=1), else removes it

# One Slurm test cluster per machine (ports 6817/6818): every cluster start holds this lock.
slurm_group_lock() {
  if [ -z "${RUNNER_SLURM_LOCKED:-}" ]; then
    exec env RUNNER_SLURM_LOCKED=1 flock /tmp/runner-slurm.lock bash "$0" "$@"
  fi
}

# slurm_group_init NAME RUNNER_BINARY
slurm_group_init() {
  RUNNER=$(readlink -f "$2")
  HERE=$(cd "$(dirname "$0")" && pwd)
  SEED=${RUNNER_SLURM_SEED:-$(( $(date +%s) % 100000 ))}
  RANDOM=$SEED
  # On tmpfs when there is one: fsync there costs nothing (on a busy disk a 1.4 MB checkpoint took seconds).
  WORK=$(mktemp -d "$( [ -d /dev/shm ] && [ -w /dev/shm ] && echo /dev/shm || echo /tmp )/runner_$1.XXXXXX")
  : >"$WORK/failures"
  chmod 0755 "$WORK"  # munged needs every directory above its socket searchable by all
  T0=$(date +%s)
  # Debian's python3 (python3-h5py, python3-numpy from scripts/setup.sh), not one earlier on PATH without them.
  PY=$( [ -x /usr/bin/python3 ] && echo /usr/bin/python3 || command -v python3 )
}

slurm_group_start() {
  local name=$1; shift
  slurm_group_lock "$@"
  slurm_group_init "$name" "$1"
}

failure_count() { wc -l <"$WORK/failures" 2>/dev/null || echo 0; }

slurm_group_finish() {
  if [ "$(failure_count)" -ne 0 ] || [ "${RUNNER_SLURM_KEEP:-0}" = 1 ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}

log() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
# Failures go to a file: scenarios run in the background report through it too.
fail() { echo "FAIL: $*"; echo "$*" >>"$WORK/failures"; }
die() { fail "$@"; exit 1; }

submit() {  # submit NAME [sbatch flags...] -> job id
  local name=$1; shift
  sbatch --parsable "$@" "$WORK/$name/slurm.sbatch" | cut -d';' -f1
}
last_step() { grep -o '"step":[0-9]*' "$WORK/$1/metrics.jsonl" 2>/dev/null | tail -n 1 | cut -d: -f2; }
count() { local c; c=$(grep -c "\"event\":\"$2\"" "$WORK/$1/events.jsonl" 2>/dev/null); echo "${c:-0}"; }
nth_event() {  # nth_event NAME start|end|... N -> that record's JSON line
  grep "\"event\":\"$2\"" "$WORK/$1/events.jsonl" | sed -n "${3}p"
}
field() {  # field JSON a.b.0.c -> that value (list elements by index); empty when absent
  "$PY" -c 'import json,sys; v=json.loads(sys.argv[1])
for k in sys.argv[2].split("."): v=v[int(k)] if isinstance(v, list) else v[k]
print(v)' "$1" "$2" 2>/dev/null
}
job_state() { squeue -h -j "$1" -o %T 2>/dev/null; }
wait_until() {  # wait_until SECONDS CMD...: polls CMD every WAIT_POLL_S (0.05) seconds
  local end=$(( $(date +%s) + $1 )); shift
  while ! "$@"; do [ "$(date +%s)" -ge "$end" ] && return 1; sleep "${WAIT_POLL_S:-0.05}"; done
}
starts_at_least() { [ "$(count "$1" start)" -ge "$2" ]; }
ends_at_least() { [ "$(count "$1" end)" -ge "$2" ]; }
step_at_least() { local s; s=$(last_step "$1"); [ -n "$s" ] && [ "$s" -ge "$2" ]; }
