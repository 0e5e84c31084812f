#!/usr/bin/env bash
# The two-node Slurm group (ctest test_slurm_nodes, its own step in .ci/run): a real two-node
# cluster in network namespaces (tests/slurm/cluster2.sh), one rank per node (nodes.yaml), MPI
# over TCP across the bridge. Scenarios, each checked against an uninterrupted run:
#   reference  2 ranks on 2 nodes, uninterrupted
#   stop       (exact) a rank stopped with SIGSTOP at N_STOPS random moments: the watchdog of
#              the other rank names it (rank, host) within train.collective_timeout + 10 s,
#              exit 5, the job restarts by itself from the last checkpoint; bit-identical
#   repeat     a rank fails at the same step every time (RUNNER_FAULT_FAIL_RANK/STEP): the
#              restarts stop (train.max_restarts or the same-step rule) and say why
#   nodeloss   (--elastic) a node lost at N_LOSSES random moments, its slurmd and ranks killed
#              or its link cut (mixed): the job restarts by itself on the remaining node (dp 1),
#              continues, and grows back to 2 nodes when the node returns; at most the steps
#              since the last checkpoint are redone; losses within the layout-equivalence tolerance
# reference, stop and repeat run side by side; nodeloss alone (a lost node takes every rank on it).
# If the cluster cannot start (no privileges for namespaces, ...), the group FAILS with the reason.
#
# Usage: nodes.sh RUNNER_BINARY
#   env: RUNNER_SLURM_SEED, N_LOSSES, N_STOPS, NODES_PARTS (e.g. "stop"), RUNNER_SLURM_KEEP=1 keeps the work dir
set -uo pipefail
# shellcheck source=harness.sh
source "$(dirname "$0")/harness.sh"
slurm_group_start nodes "$@"
RECIPE=$HERE/nodes.yaml
N_LOSSES=${N_LOSSES:-5}
N_STOPS=${N_STOPS:-3}
PARTS=${NODES_PARTS:-stop repeat nodeloss}  # a subset, to look at one scenario
STEPS=600   # train.steps of nodes.yaml
LOSS_STEPS=900   # the node-loss run's: 5 losses use up to 200 steps each (nodes_scenarios.sh)
EVERY=20    # checkpoint.every_steps of nodes.yaml
TIMEOUT=5   # train.collective_timeout of the stop scenario
WAIT_POLL_S=0.1  # wait_until's polling (rank_pid and the scenarios' checks read /proc)

# shellcheck source=cluster2.sh
source "$HERE/cluster2.sh"
finish() {
  local p
  for p in ${SCENARIOS:-}; do kill "$p" 2>/dev/null; done
  for p in $(pgrep -f "$WORK/stop" 2>/dev/null); do kill -CONT "$p" 2>/dev/null; done
  cluster2_stop
  slurm_group_finish
}
trap finish EXIT

log "seed $SEED (RUNNER_SLURM_SEED=$SEED reproduces the moments and the kinds of loss), work dir $WORK"
cluster2_start "$WORK/cluster" || die "cannot start the two-node Slurm cluster (see above); tests/slurm/cluster2.sh says why"
log "cluster up: $(sinfo -h -N -o '%N %T %c' | tr '\n' ' ')"

# MPI over TCP between the namespaces, on the bridge's addresses only (out-of-band too).
export OMPI_MCA_btl=tcp,self OMPI_MCA_btl_tcp_if_include=$C2_NET.0/24 OMPI_MCA_oob_tcp_if_include=$C2_NET.0/24
export OMPI_MCA_mpi_yield_when_idle=1
# The elastic job looks for idle nodes to grow back onto every second (the default is 60 s).
export RUNNER_GROW_POLL=1

# ---- helpers (the shared ones are harness.sh's) ----
script_for() {  # script_for NAME [launch flags...] -> $WORK/NAME/slurm.sbatch
  local name=$1; shift
  "$RUNNER" launch "$RECIPE" --slurm --run-dir "$WORK/$name" --time 00:15:00 --warn 60 --node-cpus 4 "$@" >"$WORK/$name.launch" 2>&1 ||
    die "runner launch failed for $name: $(cat "$WORK/$name.launch")"
}
# Over for good: a final state (MinJobAge keeps the record); squeue can come back empty for a
# moment while a job is being requeued.
job_gone() {
  scontrol show job "$1" 2>/dev/null | grep -qE 'JobState=(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|DEADLINE|BOOT_FAIL)'
}
# The PID of world rank R of job J (SLURM_PROCID in its environment) on node N, if it is there.
rank_pid() {
  local p
  for p in $(node_rank_pids "$3"); do
    tr '\0' '\n' 2>/dev/null <"/proc/$p/environ" | grep -qx "SLURM_JOB_ID=$1" &&
      tr '\0' '\n' 2>/dev/null <"/proc/$p/environ" | grep -qx "SLURM_PROCID=$2" && echo "$p"
  done
}
target_after() {  # target_after NAME SLOT_START SLOT_LEN: a random step in the slot, past the run's step
  local t=$(( $2 + RANDOM % $3 )) s
  s=$(last_step "$1"); s=${s:-0}
  [ "$t" -le $((s + 3)) ] && t=$((s + 3))
  echo "$t"
}
# Every run's last stop record says done at STEPS.
completed() {
  local e
  e=$(grep '"event":"end"' "$WORK/$1/events.jsonl" 2>/dev/null | tail -n 1)
  [ -n "$e" ] && [ "$(field "$e" cause)" = done ] && [ "$(field "$e" step)" = "$2" ]
}

# shellcheck source=nodes_scenarios.sh
source "$HERE/nodes_scenarios.sh"

# The reference has the stop run's recipe (the checkpoints hold it): the keys change no numbers.
STOP_SETS=(--set train.collective_timeout=$TIMEOUT --set train.max_restarts=$((N_STOPS + 2)) --set train.restart_backoff=1)
script_for reference "${STOP_SETS[@]}"
script_for stop "${STOP_SETS[@]}"
script_for repeat --set train.max_restarts=3 --set train.restart_backoff=1
# The node-loss run is longer (each loss and return costs steps on one node): its own reference.
script_for refloss --set train.steps=$LOSS_STEPS
script_for nodeloss --set train.steps=$LOSS_STEPS --elastic --set train.max_restarts=$((3 * N_LOSSES + 2)) --set train.restart_backoff=1
echo "$RANDOM $RANDOM $RANDOM" >"$WORK/seeds"
read -r SEED_STOP SEED_LOSS _ <"$WORK/seeds"

REF_JOB=$(submit reference)
REFLOSS_JOB=$(submit refloss)
if [[ " $PARTS " == *" repeat "* ]]; then scenario_repeat & SCENARIOS=$!; fi
[[ " $PARTS " == *" stop "* ]] && scenario_stop
wait_until 120 job_gone "$REF_JOB" || fail "reference: job $REF_JOB did not finish"
wait_until 120 job_gone "$REFLOSS_JOB" || fail "refloss: job $REFLOSS_JOB did not finish"
[ -n "${SCENARIOS:-}" ] && wait "$SCENARIOS"
SCENARIOS=
log "first part done; nodes: $(sinfo -h -N -o '%N %T' | tr '\n' ' ')"
[[ " $PARTS " == *" nodeloss "* ]] && scenario_nodeloss

for n in reference refloss $(sed 's/repeat//' <<<"$PARTS"); do
  steps=$STEPS; [[ $n == *loss ]] && steps=$LOSS_STEPS
  completed "$n" "$steps" || fail "$n: did not complete (last stop record: $(grep '"event":"end"' "$WORK/$n/events.jsonl" 2>/dev/null | tail -n 1)); $(tail -q -n 3 "$WORK/$n"/slurm-*.out 2>/dev/null)"
done
if [[ " $PARTS " == *" stop "* ]]; then
  r=$("$PY" "$HERE/compare.py" exact "$WORK/reference" "$WORK/stop" 2>&1) && log "stop vs reference: $r" ||
    fail "stop is not bit-identical to the reference: $r"
fi
if [[ " $PARTS " == *" nodeloss "* ]]; then
  first=$(grep '"event":"start"' "$WORK/nodeloss/events.jsonl" | sed -n 2p)
  first=$(field "$first" resumed_from)
  r=$("$PY" "$HERE/compare.py" elastic "$WORK/refloss" "$WORK/nodeloss" 1e-5 "${first:-0}" 100 2>&1) && log "nodeloss vs reference: $r" ||
    fail "nodeloss: $r"
  "$RUNNER" status "$WORK/nodeloss" 2>&1 | sed 's/^/  status: /'
fi

n=$(failure_count)
log "done: $n failure(s)"
# The moments and kinds of every stop and loss follow from the seed: a failure names it, with
# the command that replays it.
[ "$n" -eq 0 ] || log "FAILED at seed $SEED: replay with RUNNER_SLURM_SEED=$SEED NODES_PARTS='$PARTS' bash $0 $RUNNER"
[ "$n" -eq 0 ]
