#!/usr/bin/env bash
# The Slurm test group (ctest test_slurm, its own step in .ci/run): a real single-node Slurm
# cluster on loopback (tests/slurm/cluster.sh), jobs written by `runner launch --slurm`:
#   reference   a 2-rank run, uninterrupted
#   preempt     the same run, SIGUSR1 (scancel --signal=USR1, what --signal=USR1@N sends) at
#               N_SIGNALS random moments, some while a checkpoint is being written: each time a
#               checkpoint at a step boundary, exit 3, the script requeues, the job continues;
#               losses and the final checkpoint bit-identical to the reference
#   hardkill    SIGKILL to the ranks without warning (as at a time limit past KillWait), then
#               resubmitted: it resumes from the last published checkpoint (at most the steps
#               since it lost) and ends bit-identical to the reference
#   small       a 1-task allocation for the 2-rank recipe: refused, exit 2, nothing trained
#   elastic     --elastic: 2 ranks, preempted, resubmitted on 1 rank (dp 1, accum re-derived),
#               preempted, resubmitted on 2: losses within the layout-equivalence tolerance
# If the cluster cannot start, the group FAILS with the reason.
#
# Usage: run.sh RUNNER_BINARY   (env: RUNNER_SLURM_SEED, N_SIGNALS, RUNNER_SLURM_KEEP=1 keeps the temp dir)
set -uo pipefail
RUNNER=$(readlink -f "$1")
HERE=$(cd "$(dirname "$0")" && pwd)
RECIPE=$HERE/tiny.yaml
SEED=${RUNNER_SLURM_SEED:-$(( $(date +%s) % 100000 ))}
N_SIGNALS=${N_SIGNALS:-10}
RANDOM=$SEED
WORK=$(mktemp -d /tmp/runner_slurm.XXXXXX)
T0=$(date +%s)
STEPS=240
EVERY=10  # checkpoint.every_steps of tiny.yaml
FAILURES=0

# shellcheck source=cluster.sh
source "$HERE/cluster.sh"
finish() {
  cluster_stop
  if [ "$FAILURES" -ne 0 ] || [ "${RUNNER_SLURM_KEEP:-0}" = 1 ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi
}
trap finish EXIT

log() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
fail() { echo "FAIL: $*"; FAILURES=$((FAILURES + 1)); }
die() { echo "FAIL: $*"; FAILURES=$((FAILURES + 1)); exit 1; }

log "seed $SEED (RUNNER_SLURM_SEED=$SEED reproduces the signal moments), work dir $WORK"
cluster_start "$WORK/cluster" || die "cannot start the Slurm cluster (see above); tests/slurm/cluster.sh says why"
log "cluster up: $(sinfo -h -o '%P %T %c CPUs %N')"

# ---- helpers ----
script_for() {  # script_for NAME [launch flags...] -> writes $WORK/NAME/slurm.sbatch
  local name=$1; shift
  "$RUNNER" launch "$RECIPE" --slurm --run-dir "$WORK/$name" --time 00:15:00 --warn 60 "$@" >/dev/null ||
    die "runner launch failed for $name"
}
submit() {  # submit NAME [sbatch flags...] -> job id
  local name=$1; shift
  sbatch --parsable "$@" "$WORK/$name/slurm.sbatch" | cut -d';' -f1
}
last_step() { grep -o '"step":[0-9]*' "$WORK/$1/metrics.jsonl" 2>/dev/null | tail -n 1 | cut -d: -f2; }
count() { local c; c=$(grep -c "\"event\":\"$2\"" "$WORK/$1/events.jsonl" 2>/dev/null); echo "${c:-0}"; }
nth_event() {  # nth_event NAME start|end N -> that record's JSON line
  grep "\"event\":\"$2\"" "$WORK/$1/events.jsonl" | sed -n "${3}p"
}
field() { python3 -c 'import json,sys; j=json.loads(sys.argv[1]); v=j
for k in sys.argv[2].split("."): v=v[k]
print(v)' "$1" "$2"; }
job_state() { squeue -h -j "$1" -o %T 2>/dev/null; }
wait_until() {  # wait_until SECONDS CMD...: polls CMD every 0.05 s
  local limit=$1; shift
  local end=$(( $(date +%s) + limit ))
  while ! "$@"; do [ "$(date +%s)" -ge "$end" ] && return 1; sleep 0.05; done
}
starts_at_least() { [ "$(count "$1" start)" -ge "$2" ]; }
ends_at_least() { [ "$(count "$1" end)" -ge "$2" ]; }
step_at_least() { local s; s=$(last_step "$1"); [ -n "$s" ] && [ "$s" -ge "$2" ]; }
job_gone() { [ -z "$(job_state "$1")" ]; }
stop_job_gone() { scancel "$1" 2>/dev/null; wait_until 30 job_gone "$1"; }

# ---- submit everything that can run side by side (the node has more CPUs than cores) ----
for n in reference preempt hardkill small; do script_for $n; done
script_for elastic --elastic
REF_JOB=$(submit reference)
PRE_JOB=$(submit preempt)
KILL_JOB=$(submit hardkill)
SMALL_JOB=$(submit small --ntasks=1 --ntasks-per-node=1)
ELA_JOB=$(submit elastic)
log "submitted: reference $REF_JOB, preempt $PRE_JOB, hardkill $KILL_JOB, small $SMALL_JOB, elastic $ELA_JOB"

# ---- small: refused with exit 2 before anything is trained ----
if wait_until 60 job_gone "$SMALL_JOB"; then
  out=$(cat "$WORK/small"/slurm-*.out 2>/dev/null)
  grep -q "allocation is too small for the recipe: Slurm job $SMALL_JOB has 1 task, but the recipe's layout needs 2 ranks" <<<"$out" ||
    fail "small: no clear refusal in the job output: $out"
  grep -q "runner exited 2" <<<"$out" || fail "small: the runner did not exit 2: $out"
  [ ! -e "$WORK/small/checkpoints" ] && [ ! -e "$WORK/small/events.jsonl" ] || fail "small: a refused job wrote run files"
  log "small: refused, exit 2"
else
  fail "small: job $SMALL_JOB still there after 60 s"
fi

# ---- preempt: SIGUSR1 at N random moments ----
# Distinct target steps spread over the run, at least 3 apart; every third one waits for a
# checkpoint write in progress (its temporary file) and signals then.
targets=()
span=$(( (STEPS - 20) / N_SIGNALS ))
for i in $(seq 0 $((N_SIGNALS - 1))); do targets+=( $(( 5 + i * span + RANDOM % (span - 2) )) ); done
log "preempt: signal targets (steps) ${targets[*]}"
during_write=0
for i in $(seq 1 "$N_SIGNALS"); do
  t=${targets[$((i - 1))]}
  wait_until 90 starts_at_least preempt "$i" || { fail "preempt: start $i never came"; break; }
  wait_until 90 step_at_least preempt "$t" || { fail "preempt: step $t never reached (signal $i)"; break; }
  hit=""
  if [ $((i % 3)) -eq 0 ]; then  # catch a checkpoint write: signal while its temporary exists
    end=$(( $(date +%s) + 20 ))
    while [ "$(date +%s)" -lt "$end" ]; do
      if compgen -G "$WORK/preempt/checkpoints/.*tmp*" >/dev/null; then hit=" (during a checkpoint write)"; break; fi
    done
    [ -n "$hit" ] && during_write=$((during_write + 1))
  fi
  scancel --signal=USR1 "$PRE_JOB"
  at=$(last_step preempt)
  wait_until 60 ends_at_least preempt "$i" || { fail "preempt: no stop record after signal $i"; break; }
  e=$(nth_event preempt end "$i")
  [ "$(field "$e" cause)" = preempted ] || { fail "preempt: stop $i is not a preemption: $e"; break; }
  s=$(field "$e" step)
  latest=$(cat "$WORK/preempt/checkpoints/LATEST")
  [ "$latest" = "$(printf 'step_%08d.h5' "$s")" ] || fail "preempt: stop $i at step $s but LATEST is $latest"
  wait_until 90 starts_at_least preempt $((i + 1)) || { fail "preempt: not requeued after signal $i"; break; }
  st=$(nth_event preempt start $((i + 1)))
  [ "$(field "$st" resumed_from)" = "$s" ] || fail "preempt: restart $i resumed from $(field "$st" resumed_from), not $s"
  [ "$(field "$st" slurm.restart_count)" = "$i" ] || fail "preempt: restart $i has SLURM_RESTART_COUNT $(field "$st" slurm.restart_count)"
  [ "$(field "$st" slurm.job_id)" = "$PRE_JOB" ] || fail "preempt: restart $i is another job"
  log "preempt: signal $i at step ~$at$hit -> checkpoint at step $s, requeued, resumed from $s"
done
[ "$during_write" -ge 1 ] || fail "preempt: no signal landed during a checkpoint write"

# ---- hardkill: SIGKILL without warning, resubmitted, at most the steps since the last checkpoint lost ----
kt=$(( 40 + RANDOM % 150 ))
[ $((kt % EVERY)) -eq 0 ] && kt=$((kt + 3))
if wait_until 120 step_at_least hardkill "$kt"; then
  scancel --signal=KILL "$KILL_JOB"
  wait_until 60 job_gone "$KILL_JOB" || stop_job_gone "$KILL_JOB"
  killed_at=$(last_step hardkill)
  ck=$(sed 's/step_0*\([0-9]*\)\.h5/\1/' "$WORK/hardkill/checkpoints/LATEST")
  [ "$(count hardkill end)" = 0 ] || fail "hardkill: a stop record after SIGKILL"
  KILL_JOB2=$(submit hardkill)
  wait_until 90 starts_at_least hardkill 2 || fail "hardkill: the resubmitted job did not start"
  st=$(nth_event hardkill start 2)
  [ "$(field "$st" resumed_from)" = "$ck" ] || fail "hardkill: resumed from $(field "$st" resumed_from), not the last checkpoint $ck"
  lost=$((killed_at - ck))
  [ "$lost" -ge 0 ] && [ "$lost" -le "$EVERY" ] || fail "hardkill: lost $lost steps (killed at $killed_at, checkpoint $ck)"
  log "hardkill: SIGKILL at step $killed_at, resubmitted as job $KILL_JOB2, resumed from checkpoint $ck ($lost steps redone)"
else
  fail "hardkill: step $kt never reached"
  KILL_JOB2=$KILL_JOB
fi

# ---- elastic: 2 ranks -> preempted -> 1 rank -> preempted -> 2 ranks ----
elastic_stop() {  # elastic_stop JOB STEP N: SIGUSR1 at STEP, wait for the N-th stop record, cancel the requeue
  wait_until 120 step_at_least elastic "$2" || { fail "elastic: step $2 never reached"; return 1; }
  scancel --signal=USR1 "$1"
  wait_until 60 ends_at_least elastic "$3" || { fail "elastic: no stop record"; return 1; }
  stop_job_gone "$1"
}
if elastic_stop "$ELA_JOB" 60 1; then
  ELA_JOB2=$(submit elastic --ntasks=1 --ntasks-per-node=1)
  if elastic_stop "$ELA_JOB2" 150 2; then
    ELA_JOB3=$(submit elastic)
    wait_until 120 starts_at_least elastic 3 || fail "elastic: the third job did not start"
  fi
fi

# ---- completion ----
for j in "$REF_JOB" "$PRE_JOB" "$KILL_JOB2" "${ELA_JOB3:-}"; do
  [ -n "$j" ] && { wait_until 240 job_gone "$j" || fail "job $j did not finish in time"; }
done
for n in reference preempt hardkill elastic; do
  e=$(grep '"event":"end"' "$WORK/$n/events.jsonl" 2>/dev/null | tail -1)
  [ -n "$e" ] && [ "$(field "$e" cause)" = done ] && [ "$(field "$e" step)" = "$STEPS" ] ||
    fail "$n: did not complete (last stop record: ${e:-none}); $(tail -3 "$WORK/$n"/slurm-*.out 2>/dev/null)"
done
r=$(python3 "$HERE/compare.py" exact "$WORK/reference" "$WORK/preempt") && log "preempt vs reference: $r" ||
  fail "preempt is not bit-identical to the reference: $r"
r=$(python3 "$HERE/compare.py" exact "$WORK/reference" "$WORK/hardkill") && log "hardkill vs reference: $r" ||
  fail "hardkill is not bit-identical to the reference: $r"
# Elastic: the layouts of its three starts, the change recorded, losses close to the reference.
layouts=$(grep '"event":"start"' "$WORK/elastic/events.jsonl" | while read -r l; do echo "$(field "$l" dp)x$(field "$l" accum)"; done | tr '\n' ' ')
[ "$layouts" = "2x2 1x4 2x2 " ] || fail "elastic: starts at dp x accum '$layouts', expected '2x2 1x4 2x2 '"
grep -q 'elastic: Slurm job [0-9]* has 1 task, the recipe.s layout 2: dp 2 -> 1, accum 2 -> 4, global batch 16 kept' \
  "$WORK/elastic/events.jsonl" || fail "elastic: the layout change is not recorded in events.jsonl"
r=$(python3 "$HERE/compare.py" close "$WORK/reference" "$WORK/elastic" 1e-5) && log "elastic vs reference: $r" ||
  fail "elastic: $r"
"$RUNNER" status "$WORK/preempt" | sed 's/^/  status: /'
"$RUNNER" status "$WORK/preempt" --json | python3 -c "import json,sys; s=json.load(sys.stdin); assert len(s['restarts'])==$N_SIGNALS and s['state']=='done', s" ||
  fail "runner status does not show $N_SIGNALS restarts and done"

log "done: $FAILURES failure(s)"
[ "$FAILURES" -eq 0 ]
