# A two-node Slurm cluster on this one machine, for tests (sourced by tests/slurm/nodes.sh).
# Each node is a network namespace with its own address on a bridge the harness makes
# (10.99.0.0/24: the bridge and slurmctld 10.99.0.1, node n1 10.99.0.2, n2 10.99.0.3), so
# traffic between the nodes really crosses a link that a test can cut (`ip link set rnrt-v2 down`).
# One munged and slurmctld on the host side, one slurmd per node started in its namespace with
# `nsenter --net` (`ip netns exec` remounts /sys and slurmd then finds no cgroup file system).
# Timeouts are short so that a lost node is noticed in seconds (SlurmdTimeout) and a returning
# one is used again at once (ReturnToService=2). Every name made here starts with "rnrt"
# (runner test); only those addresses and loopback are used. Notes on what was seen:
# ../shared/notes/network-namespaces.md (the project's notes, outside this tree).
#
#   cluster2_start DIR        -> exports SLURM_CONF; non-zero with the reason on stderr
#   cluster2_stop             -> cancels every job, stops the daemons by PID, removes the links
#   node_kill N               -> SIGKILL to node N's slurmd and every runner rank on it
#   node_cut N / node_uncut N -> node N's link down / up
#   node_restart N            -> starts node N's slurmd again (after node_kill)
#   node_state N              -> Slurm's state of node N (idle, allocated, down*, ...)

# shellcheck source=daemons.sh
source "$(dirname "${BASH_SOURCE[0]}")/daemons.sh"

C2_BR=rnrt-br
C2_NET=10.99.0
declare -A C2_SLURMD_PID=()

c2_fail() { echo "slurm cluster (2 nodes): $*" >&2; return 1; }
c2_ns() { echo "rnrt-n$1"; }   # node N's namespace
c2_veth() { echo "rnrt-v$1"; } # node N's host-side link
c2_addr() { echo "$C2_NET.$(( $1 + 1 ))"; }

# Removes what an earlier run of this harness may have left (only our own names).
c2_remove_links() {
  local n
  for n in 1 2; do
    ip netns del "$(c2_ns "$n")" 2>/dev/null
    ip link del "$(c2_veth "$n")" 2>/dev/null
  done
  ip link del "$C2_BR" 2>/dev/null
  return 0
}

c2_make_links() {
  ip link add "$C2_BR" type bridge || { c2_fail "cannot create a bridge (ip link add $C2_BR type bridge): no CAP_NET_ADMIN?"; return 1; }
  ip addr add "$C2_NET.1/24" dev "$C2_BR" && ip link set "$C2_BR" up || { c2_fail "cannot configure the bridge $C2_BR"; return 1; }
  local n ns v
  for n in 1 2; do
    ns=$(c2_ns "$n") v=$(c2_veth "$n")
    ip netns add "$ns" || { c2_fail "cannot create the network namespace $ns (ip netns add): no privileges for namespaces?"; return 1; }
    ip link add "$v" type veth peer name eth0 netns "$ns" || { c2_fail "cannot create the veth pair $v"; return 1; }
    ip link set "$v" master "$C2_BR" && ip link set "$v" up &&
      ip netns exec "$ns" ip addr add "$(c2_addr "$n")/24" dev eth0 &&
      ip netns exec "$ns" ip link set eth0 up && ip netns exec "$ns" ip link set lo up ||
      { c2_fail "cannot configure node $n's link ($v, $ns)"; return 1; }
  done
}

c2_write_conf() {
  local d=$1 host
  host=$(hostname -s)  # slurmctld starts only under this machine's own name
  {
    echo "ClusterName=runnertest2"
    echo "SlurmctldHost=$host($C2_NET.1)"
    slurm_conf_common "$d"
    cat <<CONF
SlurmdSpoolDir=$d/spool%n
SlurmdPidFile=$d/slurmd.%n.pid
SlurmdLogFile=$d/log/slurmd.%n.log
# PMIx makes its directory under TmpFS: one per node, or the second node's step finds it there.
TmpFS=$d/tmp%n
KillWait=3
# A lost node: slurmctld pings every SlurmdTimeout/3 s and marks it DOWN after SlurmdTimeout.
SlurmdTimeout=6
MessageTimeout=3
TCPTimeout=2
# Steps killed on a lost node are ended after this (Slurm's default is 60 s).
UnkillableStepTimeout=10
NodeName=n1 NodeAddr=$(c2_addr 1) CPUs=${SLURM_TEST_CPUS:-4} RealMemory=1024 State=UNKNOWN
NodeName=n2 NodeAddr=$(c2_addr 2) CPUs=${SLURM_TEST_CPUS:-4} RealMemory=1024 State=UNKNOWN
PartitionName=test Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
  } >"$d/slurm.conf"
}

c2_start_slurmd() {
  local n=$1
  # Its own host name too (a UTS namespace): the ranks, Open MPI and the watchdog's messages
  # then name the node (n1, n2), not this machine. exec keeps one PID, the daemon's.
  unshare --uts -- sh -c 'hostname "$1" && exec nsenter --net="$2" slurmd -D -N "$1" -f "$3"' \
    sh "n$n" "/run/netns/$(c2_ns "$n")" "$SLURM_CONF" >>"$SLURM_TEST_DIR/log/slurmd.n$n.out" 2>&1 &
  C2_SLURMD_PID[$n]=$!
}

cluster2_start() {
  SLURM_TEST_DIR=$1
  local bin
  for bin in ip nsenter munged mungekey slurmctld slurmd sbatch scontrol squeue scancel sinfo; do
    command -v "$bin" >/dev/null || { c2_fail "$bin not found: install iproute2, util-linux, slurm-wlm and munge (bash scripts/setup.sh)"; return 1; }
  done
  if slurm_ports_taken; then
    c2_fail "port 6817 or 6818 is taken (another slurmctld/slurmd on this machine?)"; return 1
  fi
  mkdir -p "$SLURM_TEST_DIR"/{state,spool,log,munge,tmpn1,tmpn2}
  chmod 0755 "$SLURM_TEST_DIR"
  c2_remove_links
  C2_LINKS=1
  c2_make_links || return 1
  munge_start "$SLURM_TEST_DIR"
  C2_MUNGED_PID=$MUNGED_PID
  c2_write_conf "$SLURM_TEST_DIR"
  export SLURM_CONF=$SLURM_TEST_DIR/slurm.conf
  local i why
  why=$(munge_wait "$SLURM_TEST_DIR") || { c2_fail "$why"; return 1; }
  slurmctld -D -i -f "$SLURM_CONF" >"$SLURM_TEST_DIR/log/slurmctld.out" 2>&1 &
  C2_SLURMCTLD_PID=$!
  c2_start_slurmd 1
  c2_start_slurmd 2
  for i in $(seq 150); do
    [ "$(sinfo -h -N -o %T 2>/dev/null | grep -c '^idle')" = 2 ] && return 0
    kill -0 "$C2_SLURMCTLD_PID" 2>/dev/null || { c2_fail "slurmctld exited: $(tail -q -n 5 "$SLURM_TEST_DIR"/log/slurmctld.{log,out} 2>/dev/null)"; return 1; }
    for n in 1 2; do
      kill -0 "${C2_SLURMD_PID[$n]}" 2>/dev/null || { c2_fail "slurmd of n$n exited: $(tail -q -n 5 "$SLURM_TEST_DIR"/log/slurmd.n$n.{log,out} 2>/dev/null)"; return 1; }
    done
    sleep 0.2
  done
  c2_fail "the nodes did not become idle in 30 s: $(sinfo -N 2>&1 | tail -n 3); $(tail -q -n 5 "$SLURM_TEST_DIR/log/slurmctld.log")"
}

cluster2_stop() {
  local n
  if [ -n "${SLURM_CONF:-}" ] && [ -n "${C2_SLURMCTLD_PID:-}" ]; then
    for n in 1 2; do ip link set "$(c2_veth "$n")" up; done 2>/dev/null  # a cut node cannot hear the cancel
    slurm_cancel_all
  fi
  # Ranks left on a node whose slurmd was killed have no one to end them.
  for n in 1 2; do c2_kill_ranks "$n"; done
  for n in 1 2; do stop_pid "${C2_SLURMD_PID[$n]:-}"; done
  stop_pid "${C2_SLURMCTLD_PID:-}"
  stop_pid "${C2_MUNGED_PID:-}"
  C2_SLURMD_PID=() C2_SLURMCTLD_PID= C2_MUNGED_PID=
  [ -n "${C2_LINKS:-}" ] && c2_remove_links
  C2_LINKS=
  return 0
}

# The PIDs of the processes in node N's namespace (its slurmd, slurmstepd, the ranks).
c2_ns_pids() { ip netns pids "$(c2_ns "$1")" 2>/dev/null; }
c2_kill_ranks() {
  local p
  for p in $(c2_ns_pids "$1"); do
    [ "$(cat /proc/"$p"/comm 2>/dev/null)" = runner ] && kill -9 "$p" 2>/dev/null
  done
  return 0
}
# node_kill N: the node dies: its slurmd, its step daemons and its ranks, without warning.
node_kill() {
  local p
  for p in $(c2_ns_pids "$1"); do kill -9 "$p" 2>/dev/null; done
  wait "${C2_SLURMD_PID[$1]}" 2>/dev/null
  C2_SLURMD_PID[$1]=
  return 0
}
# node_restart N: the node boots again: its /tmp (TmpFS) is empty, and the PMIx plugin's socket
# of the killed step is gone from its spool directory (left there, it blocks the requeued job's
# step of the same id on this node: "Cannot bind() UNIX socket ... Address already in use").
node_restart() {
  rm -rf "${SLURM_TEST_DIR:?}/tmpn$1"/* "$SLURM_TEST_DIR/spooln$1"/stepd.slurm.pmix.* "$SLURM_TEST_DIR/spooln$1"/pmix.*
  c2_start_slurmd "$1"
}
node_cut() { ip link set "$(c2_veth "$1")" down; }
# node_uncut N: the link comes back, the node's old step gone first. Left alone, the rank on the
# cut node waits in MPI for ever (seen for 20 s and more), and its step daemon, once it can talk
# again, reports step J.0 over, which may be the requeued job's new step J.0 (same ids) on the
# other node: it was seen cancelled then. So the node's ranks and step daemons end while the link
# is still down (as if it had rebooted; slurmd keeps running), with the stale PMIx socket.
node_uncut() {
  local p
  for p in $(c2_ns_pids "$1"); do
    case "$(cat /proc/"$p"/comm 2>/dev/null)" in runner | slurmstepd) kill -9 "$p" 2>/dev/null ;; esac
  done
  sleep 0.5
  rm -rf "${SLURM_TEST_DIR:?}/tmpn$1"/* "$SLURM_TEST_DIR/spooln$1"/stepd.slurm.pmix.* "$SLURM_TEST_DIR/spooln$1"/pmix.*
  ip link set "$(c2_veth "$1")" up
}
node_state() { sinfo -h -N -n "n$1" -o %T 2>/dev/null | head -n 1; }
# The world ranks' PIDs on node N (for SIGSTOP).
node_rank_pids() {
  local p
  for p in $(c2_ns_pids "$1"); do [ "$(cat /proc/"$p"/comm 2>/dev/null)" = runner ] && echo "$p"; done
}
