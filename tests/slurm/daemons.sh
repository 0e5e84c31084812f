# shellcheck shell=bash
# What the two test clusters (tests/slurm/cluster.sh: one node on loopback; cluster2.sh: two
# nodes in network namespaces) start and stop alike: munged with its key and socket under
# DIR/munge, the ports check, the slurm.conf lines both clusters use, and stopping a daemon by
# its PID. Sourced by the cluster scripts; each reports a failure with its own prefix.
#
#   slurm_ports_taken             -> true when 6817 or 6818 is already listened on
#   munge_start DIR               -> munged in the foreground as a background job; MUNGED_PID
#   munge_wait DIR                -> waits up to 5 s for its socket; non-zero with the reason on stdout
#   slurm_conf_common DIR         -> the slurm.conf lines both clusters share
#   slurm_cancel_all              -> cancels every job of this user, waits up to 10 s for them to end
#   stop_pid PID                  -> SIGTERM, up to 5 s, then SIGKILL; reaps it

# One such cluster per machine: both use Slurm's default ports.
slurm_ports_taken() { ss -ltn 2>/dev/null | grep -qE ':(6817|6818)\b'; }

munge_start() {
  local m=$1/munge
  chmod 0755 "$m"  # munged refuses a group/other-writable socket directory
  mungekey --create --keyfile="$m/munge.key" --force >/dev/null 2>&1 || dd if=/dev/urandom of="$m/munge.key" bs=1024 count=1 2>/dev/null
  chmod 0400 "$m/munge.key"
  munged -F --key-file="$m/munge.key" --socket="$m/munge.socket.2" --pid-file="$m/munged.pid" \
    --log-file="$m/munged.log" --seed-file="$m/munge.seed" >"$m/munged.out" 2>&1 &
  MUNGED_PID=$!
}

munge_wait() {
  local m=$1/munge i
  for i in $(seq 50); do [ -S "$m/munge.socket.2" ] && return 0; sleep 0.1; done
  echo "munged did not start: $(tail -q -n 5 "$m/munged.out" "$m/munged.log" 2>/dev/null)"
  return 1
}

# Root daemons authenticated by the munged above; the controller's state, pid and log files
# under DIR; cons_tres by core with PMIx; requeue on; short scheduler and backfill intervals
# (with cred_expire 5 s) so a requeued job starts again in seconds, not minutes. The node lines,
# the slurmd files and the timeouts differ per cluster and are written by each.
slurm_conf_common() {
  local d=$1
  cat <<CONF
SlurmctldPort=6817
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$d/munge/munge.socket.2,cred_expire=5
StateSaveLocation=$d/state
SlurmctldPidFile=$d/slurmctld.pid
SlurmctldLogFile=$d/log/slurmctld.log
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
MinJobAge=600
InactiveLimit=0
SlurmctldTimeout=10
CONF
}

slurm_cancel_all() {
  local i
  scancel --user="$(id -un)" >/dev/null 2>&1
  for i in $(seq 50); do
    [ -z "$(squeue -h -t running,completing 2>/dev/null)" ] && break
    sleep 0.2
  done
  return 0
}

stop_pid() {
  local p=$1 i
  [ -n "$p" ] || return 0
  kill "$p" 2>/dev/null
  for i in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$p" 2>/dev/null
  wait "$p" 2>/dev/null
  return 0
}
