#!/usr/bin/env bash
# The Slurm test group (ctest test_slurm, its own step in .ci/run): a real single-node Slurm
# cluster on loopback (tests/slurm/cluster.sh), jobs written by `runner launch --slurm`:
#   reference   a 2-rank run, uninterrupted
#   preempt     the same run, SIGUSR1 (scancel --signal=USR1, what --signal=USR1@N sends) at
#               N_SIGNALS random moments, some while a checkpoint is being written: each time a
#               checkpoint at a step boundary, exit 3, the script requeues, the job continues;
#               losses and the final checkpoint bit-identical to the reference
#   hardkill    SIGKILL to the ranks without warning: the job restarts by itself (a restart
#               record, requeued after train.restart_backoff), resumes from the last published
#               checkpoint (at most the steps since it lost) and ends bit-identical to the reference
#   small       a 1-task allocation for the 2-rank recipe: refused, exit 2, nothing trained
#   elastic     --elastic: 2 ranks, preempted, resubmitted on 1 rank (dp 1, accum re-derived),
#               preempted, resubmitted on 2: losses within the layout-equivalence tolerance
# If the cluster cannot start, the group FAILS with the reason.
#
# Usage: run.sh RUNNER_BINARY   (env: RUNNER_SLURM_SEED, N_SIGNALS, RUNNER_SLURM_KEEP=1 keeps the work dir)
set -uo pipefail
# shellcheck source=harness.sh
source "$(dirname "$0")/harness.sh"
slurm_group_start slurm "$@"
RECIPE=$HERE/tiny.yaml
N_SIGNALS=${N_SIGNALS:-10}
STEPS=600  # train.steps of tiny.yaml
EVERY=20   # checkpoint.every_steps of tiny.yaml

# shellcheck source=cluster.sh
source "$HERE/cluster.sh"
finish() {
  local p
  for p in ${SCENARIOS:-}; do kill "$p" 2>/dev/null; done  # scenarios still running (a failure or a timeout)
  cluster_stop
  slurm_group_finish
}
trap finish EXIT

log "seed $SEED (RUNNER_SLURM_SEED=$SEED reproduces the signal moments), work dir $WORK"
cluster_start "$WORK/cluster" || die "cannot start the Slurm cluster (see above); tests/slurm/cluster.sh says why"
log "cluster up: $(sinfo -h -o '%P %T %c CPUs %N')"

# Ranks waiting in MPI yield their core (2 cores, several 2-rank jobs at once).
export OMPI_MCA_mpi_yield_when_idle=1

# ---- helpers (the shared ones are harness.sh's) ----
script_for() {  # script_for NAME [launch flags...] -> writes $WORK/NAME/slurm.sbatch
  local name=$1; shift
  # A 1 s restart backoff for every job (the recipes stay alike: the checkpoints compare bit for bit).
  "$RUNNER" launch "$RECIPE" --slurm --run-dir "$WORK/$name" --time 00:15:00 --warn 60 --set train.restart_backoff=1 "$@" >/dev/null ||
    die "runner launch failed for $name"
}
job_gone() { [ -z "$(job_state "$1")" ]; }
requeued() { grep -q "requeueing job $1" "$WORK"/*/slurm-"$1".out 2>/dev/null && [ "$(job_state "$1")" = PENDING ]; }
stop_job_gone() { scancel "$1" 2>/dev/null; wait_until 30 job_gone "$1"; }

# ---- the scenarios (they run side by side: the node has more CPUs than cores) ----
for n in reference preempt hardkill small; do script_for $n; done
script_for elastic --elastic
echo "$RANDOM $RANDOM $RANDOM" >"$WORK/seeds"  # one seed per background scenario, from the run's seed
read -r SEED_KILL SEED_ELASTIC _ <"$WORK/seeds"

# small: a 1-task allocation for the 2-rank recipe is refused with exit 2 before anything is trained.
scenario_small() {
  local job
  job=$(submit small --ntasks=1 --ntasks-per-node=1)
  wait_until 120 job_gone "$job" || { fail "small: job $job still there after 120 s"; return; }
  local out
  out=$(cat "$WORK/small"/slurm-*.out 2>/dev/null)
  grep -q "this allocation is too small for the recipe: Slurm job $job has 1 task, but the recipe's layout needs 2 ranks" <<<"$out" ||
    fail "small: no clear refusal in the job output: $out"
  grep -q "runner exited 2" <<<"$out" || fail "small: the runner did not exit 2: $out"
  [ ! -e "$WORK/small/checkpoints" ] && [ ! -e "$WORK/small/events.jsonl" ] || fail "small: a refused job wrote run files"
  log "small: job $job refused, exit 2, nothing written"
}

# hardkill: SIGKILL to the ranks without warning (as the OOM killer or a lost node would): the
# script asks `runner restart-check`, which records a restart; the job is requeued and starts
# again after the backoff by itself, from the last published checkpoint.
scenario_hardkill() {
  RANDOM=$SEED_KILL
  local job kt killed_at ck st lost rs
  job=$(submit hardkill --export=ALL,RUNNER_CKPT_FAULT_SLOW_MS=300)  # a longer run to aim at
  kt=$(( 60 + RANDOM % 200 ))
  [ $((kt % EVERY)) -eq 0 ] && kt=$((kt + 7))
  wait_until 240 step_at_least hardkill "$kt" || { fail "hardkill: step $kt never reached"; return; }
  # SIGKILL straight to the ranks (`scancel --signal=KILL` is a cancel: SIGTERM first).
  local pids
  pids=$(scontrol listpids "$job" 2>/dev/null | awk 'NR > 1 {print $1}' |
    while read -r p; do [ "$(cat /proc/"$p"/comm 2>/dev/null)" = runner ] && echo "$p"; done)
  [ -n "$pids" ] || { fail "hardkill: no runner processes in job $job"; return; }
  kill -9 $pids
  wait_until 60 grep -q '"event":"restart"' "$WORK/hardkill/events.jsonl" ||
    { fail "hardkill: no restart record after SIGKILL: $(tail -n 5 "$WORK"/hardkill/slurm-*.out)"; stop_job_gone "$job"; return; }
  rs=$(grep '"event":"restart"' "$WORK/hardkill/events.jsonl" | head -n 1)
  killed_at=$(field "$rs" step)
  ck=$(field "$rs" checkpoint)
  [ "$(count hardkill end)" = 0 ] || fail "hardkill: a stop record after SIGKILL"
  [ "$(field "$rs" attempt)" = 1 ] && grep -q 'killed by SIGKILL' <<<"$(field "$rs" cause)" ||
    fail "hardkill: the restart record is not restart 1 after SIGKILL: $rs"
  [ "$killed_at" -lt "$STEPS" ] || { fail "hardkill: the run ended before the kill"; return; }
  wait_until 120 starts_at_least hardkill 2 || { fail "hardkill: the job did not start again by itself"; return; }
  st=$(nth_event hardkill start 2)
  [ "$(field "$st" slurm.job_id)" = "$job" ] || fail "hardkill: the restart is another job"
  [ "$(field "$st" resumed_from)" = "$ck" ] || fail "hardkill: resumed from $(field "$st" resumed_from), not the last checkpoint $ck"
  lost=$((killed_at - ck))
  [ "$lost" -ge 0 ] && [ "$lost" -le "$EVERY" ] || fail "hardkill: lost $lost steps (killed at $killed_at, checkpoint $ck)"
  log "hardkill: SIGKILL at step $killed_at, restarted by itself (restart 1, $(field "$rs" backoff_s) s backoff), resumed from the last checkpoint $ck ($lost steps redone)"
  wait_until 300 job_gone "$job" || fail "hardkill: job $job did not finish"
}

# elastic (--elastic): 2 ranks, preempted; resubmitted on 1 rank (dp 1, accum derived again),
# preempted; resubmitted on 2 ranks, to the end.
scenario_elastic() {
  RANDOM=$SEED_ELASTIC
  elastic_stop() {  # elastic_stop JOB STEP N: SIGUSR1 at STEP, the N-th stop record, the requeued job cancelled
    wait_until 240 step_at_least elastic "$2" || { fail "elastic: step $2 never reached"; return 1; }
    scancel --signal=USR1 "$1"
    wait_until 60 ends_at_least elastic "$3" || { fail "elastic: no stop record after the signal at step $2"; return 1; }
    [ "$(field "$(nth_event elastic end "$3")" cause)" = preempted ] || { fail "elastic: stop $3 is no preemption"; return 1; }
    # Cancel the job once its script has requeued it (pending for cred_expire, 5 s): a cancel
    # before that would race the script's requeue (which then leaves a cancelled job alone).
    wait_until 60 requeued "$1" || { fail "elastic: job $1 was not requeued after its preemption"; return 1; }
    stop_job_gone "$1"
  }
  local j1 j2 j3 s1
  # One rank runs a step in ~10 ms: slower checkpoint writes keep the 1-rank leg long enough
  # for a signal to land in it (they change no numbers).
  local slow=--export=ALL,RUNNER_CKPT_FAULT_SLOW_MS=300
  j1=$(submit elastic $slow)
  elastic_stop "$j1" $(( 40 + RANDOM % 80 )) 1 || return
  s1=$(field "$(nth_event elastic end 1)" step)
  j2=$(submit elastic $slow --ntasks=1 --ntasks-per-node=1)
  elastic_stop "$j2" $(( s1 + 10 + RANDOM % 40 )) 2 || return
  j3=$(submit elastic $slow)
  log "elastic: jobs $j1 (2 ranks) -> $j2 (1 rank) -> $j3 (2 ranks)"
  wait_until 300 job_gone "$j3" || fail "elastic: job $j3 did not finish"
}

REF_JOB=$(submit reference)
# Slower steps and checkpoint writes (numbers unchanged): a signal takes ~1-2 s to arrive.
PRE_JOB=$(submit preempt --export=ALL,RUNNER_CKPT_FAULT_SLOW_MS=500,RUNNER_FAULT_STEP_SLEEP_MS=40)
scenario_small &
SCENARIOS=$!
scenario_hardkill &
SCENARIOS="$SCENARIOS $!"
scenario_elastic &
SCENARIOS="$SCENARIOS $!"
log "submitted: reference $REF_JOB, preempt $PRE_JOB; small, hardkill, elastic in the background"

# preempt: SIGUSR1 at N_SIGNALS random moments: signal i at a random step of the i-th of N
# equal slots of the run's first STEPS-150 steps (the last 150 leave room for the signal's
# latency, tens of steps on a busy machine); a target the run has already passed is signalled
# as soon as the job is back (during its start-up or resume). Every third signal waits for a checkpoint write in
# progress (its temporary file; RUNNER_CKPT_FAULT_SLOW_MS holds it 500 ms): it landed in the
# write when the ranks stop at that checkpoint's step (they agree at the next step boundary).
during_write=0
slot=$(( (STEPS - 150) / N_SIGNALS ))
for i in $(seq 1 "$N_SIGNALS"); do
  t=$(( 5 + (i - 1) * slot + RANDOM % (slot - 5) ))
  wait_until 120 starts_at_least preempt "$i" || { fail "preempt: start $i never came"; break; }
  wait_until 120 step_at_least preempt "$t" || { fail "preempt: step $t never reached (signal $i)"; break; }
  hit=""
  if [ $((i % 3)) -eq 0 ]; then
    wait_until 60 compgen -G "$WORK/preempt/checkpoints/.step_*.tmp.*" >/dev/null && hit=" (sent during a checkpoint write)"
  fi
  scancel --signal=USR1 "$PRE_JOB"
  at=$(last_step preempt)
  wait_until 60 ends_at_least preempt "$i" || { fail "preempt: no stop record after signal $i"; break; }
  e=$(nth_event preempt end "$i")
  [ "$(field "$e" cause)" = preempted ] || { fail "preempt: stop $i is not a preemption: $e"; break; }
  s=$(field "$e" step)
  [ -n "$hit" ] && [ $((s % EVERY)) -eq 0 ] && hit=" (landed in the checkpoint write of step $s)" &&
    during_write=$((during_write + 1))
  latest=$(cat "$WORK/preempt/checkpoints/LATEST")
  [ "$latest" = "$(printf 'step_%08d.h5' "$s")" ] || fail "preempt: stop $i at step $s but LATEST is $latest"
  wait_until 120 starts_at_least preempt $((i + 1)) || { fail "preempt: not requeued after signal $i"; break; }
  st=$(nth_event preempt start $((i + 1)))
  [ "$(field "$st" resumed_from)" = "$s" ] || fail "preempt: restart $i resumed from $(field "$st" resumed_from), not $s"
  [ "$(field "$st" slurm.restart_count)" = "$i" ] || fail "preempt: restart $i has SLURM_RESTART_COUNT $(field "$st" slurm.restart_count)"
  [ "$(field "$st" slurm.job_id)" = "$PRE_JOB" ] || fail "preempt: restart $i is another job"
  log "preempt: signal $i (target step $t) at step $at$hit -> checkpoint at step $s, exit 3, requeued, resumed from $s"
done
[ "$during_write" -ge 1 ] || fail "preempt: no signal landed in a checkpoint write"
log "preempt: $during_write of $((N_SIGNALS / 3)) signals aimed at a checkpoint write landed in one"

# ---- completion ----
for j in "$REF_JOB" "$PRE_JOB"; do wait_until 300 job_gone "$j" || fail "job $j did not finish in time"; done
wait $SCENARIOS  # the background scenarios (a bare wait would wait for the daemons too)
for n in reference preempt hardkill elastic; do
  e=$(grep '"event":"end"' "$WORK/$n/events.jsonl" 2>/dev/null | tail -1)
  [ -n "$e" ] && [ "$(field "$e" cause)" = done ] && [ "$(field "$e" step)" = "$STEPS" ] ||
    fail "$n: did not complete (last stop record: ${e:-none}); $(tail -q -n 3 "$WORK/$n"/slurm-*.out 2>/dev/null)"
done
r=$("$PY" "$HERE/compare.py" exact "$WORK/reference" "$WORK/preempt" 2>&1) && log "preempt vs reference: $r" ||
  fail "preempt is not bit-identical to the reference: $r"
r=$("$PY" "$HERE/compare.py" exact "$WORK/reference" "$WORK/hardkill" 2>&1) && log "hardkill vs reference: $r" ||
  fail "hardkill is not bit-identical to the reference: $r"
# Elastic: the layouts of its three starts, the change recorded, losses close to the reference.
layouts=$(grep '"event":"start"' "$WORK/elastic/events.jsonl" | while read -r l; do echo "$(field "$l" dp)x$(field "$l" accum)"; done | tr '\n' ' ')
[ "$layouts" = "2x2 1x4 2x2 " ] || fail "elastic: starts at dp x accum '$layouts', expected '2x2 1x4 2x2 '"
grep -q 'elastic: Slurm job [0-9]* has 1 task, the recipe.s layout 2 ranks: dp 2 -> 1, accum 2 -> 4, global batch 16 kept' \
  "$WORK/elastic/events.jsonl" || fail "elastic: the change to 1 rank is not recorded in events.jsonl"
r=$("$PY" "$HERE/compare.py" close "$WORK/reference" "$WORK/elastic" 1e-5 2>&1) && log "elastic vs reference: $r" ||
  fail "elastic: $r"
"$RUNNER" status "$WORK/preempt" | sed 's/^/  status: /'
"$RUNNER" status "$WORK/preempt" --json | "$PY" -c "import json,sys; s=json.load(sys.stdin); assert len(s['restarts'])==$N_SIGNALS and s['state']=='finished', s" ||
  fail "runner status does not show $N_SIGNALS restarts and finished"

n=$(failure_count)
log "done: $n failure(s)"
[ "$n" -eq 0 ]
