# A single-node Slurm cluster on loopback for tests (sourced by tests/slurm/run.sh).
# slurmctld, slurmd and munged from Debian's packages (scripts/setup.sh), run in the foreground
# as background jobs with every state, spool, pid and log file under $SLURM_TEST_DIR; stopped
# by their PIDs. Ports 6817/6818: one such cluster per machine. Timers are short (cred_expire,
# scheduler and backfill intervals) so a requeued job restarts in seconds, not minutes.
#
#   cluster_start DIR   -> exports SLURM_CONF; returns non-zero with the reason on stderr
#   cluster_stop        -> cancels every job, stops the daemons by PID

cluster_fail() { echo "slurm cluster: $*" >&2; return 1; }

cluster_start() {
  SLURM_TEST_DIR=$1
  mkdir -p "$SLURM_TEST_DIR"/{state,spool,log,munge}
  chmod 0755 "$SLURM_TEST_DIR"
  for bin in munged mungekey slurmctld slurmd sbatch scontrol squeue scancel; do
    command -v "$bin" >/dev/null || cluster_fail "$bin not found: install slurm-wlm and munge (bash scripts/setup.sh)" || return 1
  done
  if ss -ltn 2>/dev/null | grep -qE ':(6817|6818)\b'; then
    cluster_fail "port 6817 or 6818 is taken (another slurmctld/slurmd on this machine?)"; return 1
  fi
  local m=$SLURM_TEST_DIR/munge
  chmod 0755 "$m"  # munged refuses a group/other-writable socket directory
  mungekey --create --keyfile="$m/munge.key" --force >/dev/null 2>&1 || dd if=/dev/urandom of="$m/munge.key" bs=1024 count=1 2>/dev/null
  chmod 0400 "$m/munge.key"
  munged -F --key-file="$m/munge.key" --socket="$m/munge.socket.2" --pid-file="$m/munged.pid" \
    --log-file="$m/munged.log" --seed-file="$m/munge.seed" >"$m/munged.out" 2>&1 &
  MUNGED_PID=$!
  local cpus mem
  cpus=${SLURM_TEST_CPUS:-8}  # more than the cores (config_overrides): several 2-rank jobs at once
  mem=1024
  cat >"$SLURM_TEST_DIR/slurm.conf" <<CONF
ClusterName=runnertest
SlurmctldHost=localhost
SlurmctldPort=6817
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$m/munge.socket.2,cred_expire=5
StateSaveLocation=$SLURM_TEST_DIR/state
SlurmdSpoolDir=$SLURM_TEST_DIR/spool
SlurmctldPidFile=$SLURM_TEST_DIR/slurmctld.pid
SlurmdPidFile=$SLURM_TEST_DIR/slurmd.pid
SlurmctldLogFile=$SLURM_TEST_DIR/log/slurmctld.log
SlurmdLogFile=$SLURM_TEST_DIR/log/slurmd.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=pmix
JobRequeue=1
ReturnToService=2
MailProg=/bin/true
SchedulerParameters=bf_interval=1,sched_interval=2
SchedulerType=sched/backfill
KillWait=5
MinJobAge=600
InactiveLimit=0
SlurmctldTimeout=10
SlurmdTimeout=30
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=test Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
  export SLURM_CONF=$SLURM_TEST_DIR/slurm.conf
  local i
  for i in $(seq 50); do [ -S "$m/munge.socket.2" ] && break; sleep 0.1; done
  [ -S "$m/munge.socket.2" ] || { cluster_fail "munged did not start: $(cat "$m/munged.out" "$m/munged.log" 2>/dev/null | tail -n 5)"; return 1; }
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
  [ -n "${SLURM_CONF:-}" ] && scancel --user="$(id -un)" >/dev/null 2>&1
  local i
  for i in $(seq 50); do
    [ -z "$(squeue -h -t running,completing 2>/dev/null)" ] && break
    sleep 0.2
  done
  local p
  for p in ${SLURMD_PID:-} ${SLURMCTLD_PID:-} ${MUNGED_PID:-}; do
    kill "$p" 2>/dev/null
    for i in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  SLURMD_PID= SLURMCTLD_PID= MUNGED_PID=
  return 0
}
