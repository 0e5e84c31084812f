# A single-node Slurm cluster on loopback for tests (sourced by tests/slurm/run.sh).
# slurmctld, slurmd and munged from Debian's packages (scripts/setup.sh), run in the foreground
# as background jobs with every state, spool, pid and log file under $SLURM_TEST_DIR; stopped
# by their PIDs. Ports 6817/6818: one such cluster per machine. Timers are short (cred_expire,
# scheduler and backfill intervals) so a requeued job restarts in seconds, not minutes.
#
#   cluster_start DIR   -> exports SLURM_CONF; returns non-zero with the reason on stderr
#   cluster_stop        -> cancels every job, stops the daemons by PID

# shellcheck source=daemons.sh
source "$(dirname "${BASH_SOURCE[0]}")/daemons.sh"

cluster_fail() { echo "slurm cluster: $*" >&2; return 1; }

cluster_start() {
  SLURM_TEST_DIR=$1
  mkdir -p "$SLURM_TEST_DIR"/{state,spool,log,munge}
  chmod 0755 "$SLURM_TEST_DIR"
  for bin in munged mungekey slurmctld slurmd sbatch scontrol squeue scancel; do
    command -v "$bin" >/dev/null || cluster_fail "$bin not found: install slurm-wlm and munge (bash scripts/setup.sh)" || return 1
  done
  if slurm_ports_taken; then
    cluster_fail "port 6817 or 6818 is taken (another slurmctld/slurmd on this machine?)"; return 1
  fi
  munge_start "$SLURM_TEST_DIR"
  local cpus mem
  cpus=${SLURM_TEST_CPUS:-8}  # more than the cores (config_overrides): several 2-rank jobs at once
  mem=1024
  {
    echo "ClusterName=runnertest"
    echo "SlurmctldHost=localhost"
    slurm_conf_common "$SLURM_TEST_DIR"
    cat <<CONF
SlurmdSpoolDir=$SLURM_TEST_DIR/spool
SlurmdPidFile=$SLURM_TEST_DIR/slurmd.pid
SlurmdLogFile=$SLURM_TEST_DIR/log/slurmd.log
KillWait=5
SlurmdTimeout=30
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=test Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
  } >"$SLURM_TEST_DIR/slurm.conf"
  export SLURM_CONF=$SLURM_TEST_DIR/slurm.conf
  local i why
  why=$(munge_wait "$SLURM_TEST_DIR") || { cluster_fail "$why"; return 1; }
  slurmctld -D -i -f "$SLURM_CONF" >"$SLURM_TEST_DIR/log/slurmctld.out" 2>&1 &
  SLURMCTLD_PID=$!
  slurmd -D -N localhost -f "$SLURM_CONF" >"$SLURM_TEST_DIR/log/slurmd.out" 2>&1 &
  SLURMD_PID=$!
  for i in $(seq 150); do
    if sinfo -h -o %T 2>/dev/null | grep -qE '^idle'; then return 0; fi
    kill -0 "$SLURMCTLD_PID" 2>/dev/null || { cluster_fail "slurmctld exited: $(tail -q -n 5 "$SLURM_TEST_DIR/log/slurmctld.log" "$SLURM_TEST_DIR/log/slurmctld.out" 2>/dev/null)"; return 1; }
    kill -0 "$SLURMD_PID" 2>/dev/null || { cluster_fail "slurmd exited: $(tail -q -n 5 "$SLURM_TEST_DIR/log/slurmd.log" "$SLURM_TEST_DIR/log/slurmd.out" 2>/dev/null)"; return 1; }
    sleep 0.2
  done
  cluster_fail "the node did not become idle in 30 s: $(sinfo 2>&1 | tail -n 3); $(tail -q -n 5 "$SLURM_TEST_DIR/log/slurmctld.log")"
}

cluster_stop() {
  [ -n "${SLURM_CONF:-}" ] && slurm_cancel_all
  local p
  for p in ${SLURMD_PID:-} ${SLURMCTLD_PID:-} ${MUNGED_PID:-}; do stop_pid "$p"; done
  SLURMD_PID= SLURMCTLD_PID= MUNGED_PID=
  return 0
}
