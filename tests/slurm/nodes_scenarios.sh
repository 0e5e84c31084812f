# The scenarios of the two-node group (sourced by tests/slurm/nodes.sh, which defines the
# helpers, WORK, STEPS, EVERY, TIMEOUT and the seeds). Each reports through fail().

# A restart after a stop or loss at step AT continues from the last checkpoint written by then:
# at most EVERY steps back (the checkpoint at AT may have been cut off while being written). Before
# the first checkpoint the run starts over: resumed_from is -1, the state of step 0.
resumed_within_cadence() {  # resumed_within_cadence RESUMED_FROM AT
  local r=$1
  [ "$r" -eq -1 ] && r=0
  [ "$r" -ge 0 ] && [ "$r" -le "$2" ] && [ $(($2 - r)) -le "$EVERY" ]
}

# stop: a rank stopped with SIGSTOP, N_STOPS times. A stopped process holds its sockets open, so
# MPI on the other rank just waits: only the watchdog can notice. It must name the stopped rank
# and its node within train.collective_timeout + 10 s; the job then restarts by itself from the
# last checkpoint, on the same layout, and ends bit-identical to the reference.
stop_one() {  # stop_one JOB I SLOT_START SLOT
  local job=$1 i=$2 t rank node pid at t0 h st r
  t=$(target_after stop "$3" "$4")
  wait_until 120 step_at_least stop "$t" || { fail "stop: step $t never reached (stop $i)"; return 1; }
  rank=$(( RANDOM % 2 ))
  for node in 1 2; do pid=$(rank_pid "$job" "$rank" "$node"); [ -n "$pid" ] && break; done
  [ -n "$pid" ] || { fail "stop: rank $rank of job $job not found on either node"; return 1; }
  kill -STOP "$pid"
  t0=$(date +%s)
  at=$(last_step stop)
  wait_until $((TIMEOUT + 10)) eval '[ "$(count stop hang)" -ge '"$i"' ]' ||
    { fail "stop: no hang record $((TIMEOUT + 10)) s after rank $rank (n$node, pid $pid) was stopped at step $at; now at $(last_step stop); heartbeats: $(cat "$WORK"/stop/.ranks/*.json 2>/dev/null)"; kill -CONT "$pid"; return 1; }
  t0=$(( $(date +%s) - t0 ))
  h=$(nth_event stop hang "$i")
  [ "$(field "$h" not_arrived.0.rank)" = "$rank" ] && [ "$(field "$h" not_arrived.0.host)" = "n$node" ] ||
    fail "stop: the hang record does not name rank $rank on n$node: $h"
  wait_until 90 starts_at_least stop $((i + 1)) || { fail "stop: no restart after the hang at step $at"; return 1; }
  st=$(nth_event stop start $((i + 1)))
  r=$(field "$st" resumed_from)
  resumed_within_cadence "$r" "$at" || fail "stop: stopped at step $at, resumed from $r"
  log "stop $i: rank $rank on n$node stopped at step $at; named within $t0 s: $(field "$h" message); restarted from step $r"
}

scenario_stop() {
  RANDOM=$SEED_STOP
  local job i slot=$(( (STEPS - 200) / N_STOPS ))
  job=$(submit stop --export=ALL,RUNNER_FAULT_STEP_SLEEP_MS=20)
  for i in $(seq 1 "$N_STOPS"); do
    wait_until 120 starts_at_least stop "$i" || { fail "stop: start $i never came"; return; }
    stop_one "$job" "$i" $(( 40 + (i - 1) * slot )) "$slot" || return
  done
  wait_until 240 job_gone "$job" || fail "stop: job $job did not finish"
}

# repeat: rank 1 fails in the middle of step 30 every time it gets there. Each restart resumes
# from step 20 and fails at 30 again: the restarts must stop, with the reason recorded.
scenario_repeat() {
  local job starts
  job=$(submit repeat --export=ALL,RUNNER_FAULT_FAIL_RANK=1,RUNNER_FAULT_FAIL_STEP=30)
  wait_until 240 job_gone "$job" || { fail "repeat: job $job still there after 240 s: $(squeue -h -j "$job" -o '%T %r')"; scancel "$job"; return; }
  starts=$(count repeat start)
  [ "$starts" -ge 2 ] && [ "$starts" -le 4 ] || fail "repeat: $starts starts (max_restarts 3: 2 to 4 expected)"
  [ "$(grep -c '"step":31' "$WORK/repeat/metrics.jsonl")" = 0 ] || fail "repeat: step 31 ran although step 30 always fails"
  grep '"event":"no_restart"' "$WORK/repeat/events.jsonl" | grep -qiE '"reason":"same step"|train.max_restarts' ||
    fail "repeat: no record of why the restarts stopped in events.jsonl: $(tail -n 3 "$WORK/repeat/events.jsonl")"
  "$RUNNER" status "$WORK/repeat" >"$WORK/repeat.status" 2>&1
  grep -qiE 'same step|max_restarts' "$WORK/repeat.status" || fail "repeat: runner status does not say why the restarts stopped: $(cat "$WORK/repeat.status")"
  log "repeat: $starts starts, then stopped: $(grep -iE 'same step|max_restarts' "$WORK/repeat.status" | head -n 1)"
}

# nodeloss (--elastic): a node lost N_LOSSES times at random steps, by a kill (slurmd, step
# daemons and ranks, SIGKILL) or by cutting its link. The link of the node running the batch
# script is not cut: its step daemons cannot reach srun, the other node's step never ends and
# Slurm drains that node ("Kill task failed"): no node left (shared/notes/network-namespaces.md).
# The run's pace (ms per step, RUNNER_FAULT_STEP_SLEEP_FILE) is FAST on two nodes and while the
# test waits for the first steps on one, and SLOW while the lost node is away: how long Slurm takes
# to take a node back varies (8 s here, 47 s on CI), and at the fast pace a run on one node once
# used up its remaining steps before the node returned, so it never grew back. Slow, each away
# time costs a bounded number of steps; the numbers do not depend on the pace.
PACE_FAST=${LOSS_SLEEP_MS:-50}
PACE_SLOW=1500
pace() { echo "$1" >"$WORK/nodeloss.pace.tmp" && mv "$WORK/nodeloss.pace.tmp" "$WORK/nodeloss.pace"; }
latest_start() { grep '"event":"start"' "$WORK/nodeloss/events.jsonl" | tail -n 1; }
on_nodes() { [ "$(count nodeloss start)" -ge "$1" ] && [ "$(field "$(latest_start)" dp)" = "$2" ] && step_at_least nodeloss "$3"; }
lose_one() {  # lose_one I SLOT_START SLOT
  local i=$1 t node kind at n0 st r t0
  t=$(target_after nodeloss "$2" "$3")
  wait_until 120 step_at_least nodeloss "$t" || { fail "nodeloss: step $t never reached (loss $i)"; return 1; }
  kind=kill; node=$(( 1 + RANDOM % 2 ))
  if [ "$i" -eq 2 ] || { [ "$i" -gt 2 ] && [ $((RANDOM % 2)) = 1 ]; }; then kind=cut node=2; fi
  n0=$(count nodeloss start)
  at=$(last_step nodeloss)
  t0=$(date +%s)
  if [ "$kind" = kill ]; then node_kill "$node"; else node_cut "$node"; fi
  wait_until 120 on_nodes $((n0 + 1)) 1 0 ||
    { fail "nodeloss: no restart on one node within 120 s of losing n$node ($kind) at step $at: $(squeue -h -o '%i %T %r %N')"; return 1; }
  st=$(latest_start); r=$(field "$st" resumed_from)
  [ "$(field "$st" slurm.node_list)" = "n$((3 - node))" ] || fail "nodeloss: restarted on $(field "$st" slurm.node_list), not n$((3 - node))"
  resumed_within_cadence "$r" "$at" || fail "nodeloss: lost n$node at step $at, resumed from $r"
  log "nodeloss $i: n$node lost ($kind) at step $at; after $(( $(date +%s) - t0 )) s running on n$((3 - node)) alone (dp 1) from step $r"
  wait_until 60 step_at_least nodeloss $((r + 5)) || { fail "nodeloss: no progress on one node after loss $i"; return 1; }
  pace "$PACE_SLOW"
  if [ "$kind" = kill ]; then node_restart "$node"; else node_uncut "$node"; fi
  t0=$(date +%s)
  wait_until 150 on_nodes $((n0 + 2)) 2 0 || { fail "nodeloss: not back on 2 nodes within 150 s of n$node's return (at step $(last_step nodeloss) of $LOSS_STEPS): $(latest_start)"; pace "$PACE_FAST"; return 1; }
  pace "$PACE_FAST"
  log "nodeloss $i: n$node back; on 2 nodes again after $(( $(date +%s) - t0 )) s from step $(field "$(latest_start)" resumed_from)"
}

scenario_nodeloss() {
  RANDOM=$SEED_LOSS
  local job i s
  pace "$PACE_FAST"
  job=$(submit nodeloss --export=ALL,RUNNER_FAULT_STEP_SLEEP_FILE=$WORK/nodeloss.pace)
  for i in $(seq 1 "$N_LOSSES"); do
    wait_until 150 on_nodes $((2 * i - 1)) 2 1 || { fail "nodeloss: not running on 2 nodes before loss $i: $(latest_start)"; return; }
    # Each loss 5 to 44 steps into the run's time on two nodes (each return costs steps on one).
    s=$(last_step nodeloss)
    # Room for the loss, the steps redone and the time away (at most 150 s at the slow pace).
    [ $((LOSS_STEPS - ${s:-0})) -ge $((44 + EVERY + 10 + 150000 / PACE_SLOW)) ] ||
      { fail "nodeloss: only $((LOSS_STEPS - ${s:-0})) steps left before loss $i: too few for a loss and a return (LOSS_STEPS)"; return; }
    lose_one "$i" $(( ${s:-0} + 5 )) 40 || return
  done
  wait_until 300 job_gone "$job" || fail "nodeloss: job $job did not finish"
  log "nodeloss: $(count nodeloss start) starts for $N_LOSSES losses"
}
