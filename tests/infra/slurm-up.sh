#!/usr/bin/env bash
# slurm-up.sh [--hosts] DIR [N] — a real SLURM cluster (Debian's slurmctld, slurmd, munge) of N
# nodes on this one machine, for the SLURM tests. Everything it runs and writes belongs to DIR
# (the state folder; created if missing): a generated slurm.conf, its own munge key and munged,
# the controller's state, pid files and logs (DIR/log). Nothing in /etc is read or changed, so
# it runs beside a real SLURM installation and beside other runs of itself.
#
#   slurm-up.sh DIR N          nodes node1..nodeN, one slurmd each, all on 127.0.0.1 (own ports);
#                              the daemons see a private /etc/hosts in which nodeI is 127.0.0.1,
#                              so a job resolves the node names SLURM gives it
#   slurm-up.sh --hosts DIR N  nodes host1..hostN on separate hosts (tests/infra/netns-up.sh
#                              DIR/net N: own network namespace, address and host name each);
#                              slurmctld runs on host1. Run client commands on a host:
#                              `tests/infra/netns-exec.sh DIR/net 1 sbatch ...`
#
# Source DIR/env before using the cluster: it sets SLURM_CONF (clients find the cluster by it)
# and SLURM_CLUSTER (the cluster's unique name, which SLURM puts in every job's environment as
# SLURM_CLUSTER_NAME). Stop with tests/infra/slurm-down.sh DIR. Idempotent: re-running with the
# same arguments while every node is idle says so and does nothing; other arguments restart.
# A failure part-way stops what was started.
#
# Exit: 0 up (every node idle), 77 a prerequisite is missing (not root, SLURM or munge not
# installed: `make deps`), 1 failed (the message names the log to read), 2 usage.
# Env: JDT_SLURM_CPUS  CPUs each node declares (default 4; more than the machine has is fine,
#                      tasks then share cores)
#      JDT_SLURM_TIMEOUT seconds to wait for idle nodes (default 60)
set -euo pipefail
. "$(dirname "$0")/lib.sh"
ME=slurm-up
HOSTS=0
[ "${1:-}" = --hosts ] && { HOSTS=1; shift; }
DIR=${1:-}; N=${2:-2}; CPUS=${JDT_SLURM_CPUS:-4}; TIMEOUT=${JDT_SLURM_TIMEOUT:-60}
[ -n "$DIR" ] || { echo "usage: $0 [--hosts] DIR [N]" >&2; exit 2; }
[[ "$N" =~ ^[0-9]+$ ]] && [ "$N" -ge 1 ] && [ "$N" -le 64 ] || { echo "$ME: N must be 1..64, got '$N'" >&2; exit 2; }
[[ "$CPUS" =~ ^[0-9]+$ ]] && [ "$CPUS" -ge 1 ] || { echo "$ME: JDT_SLURM_CPUS must be a positive integer" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "$ME: SLURM's daemons need root"; exit 77; }
for c in slurmctld slurmd sbatch srun squeue sinfo scancel munged munge unshare ss; do
  command -v "$c" >/dev/null || { echo "$ME: '$c' is not installed (make deps)"; exit 77; }
done
DIR=$(infra_state_dir slurm "$DIR") || exit 1
CONF=$DIR/slurm.conf
WANT="hosts=$HOSTS nodes=$N cpus=$CPUS"

# client command against this cluster (on host1 in --hosts mode)
client() {
  if [ $HOSTS = 1 ]; then SLURM_CONF=$CONF bash "$INFRA_DIR/netns-exec.sh" "$DIR/net" 1 "$@"
  else SLURM_CONF=$CONF "$@"; fi
}
all_idle() {
  local s
  s=$(client sinfo -h -N -o '%N %t' 2>/dev/null) || return 1
  [ "$(echo "$s" | grep -c ' idle$')" = "$N" ] && [ "$(echo "$s" | wc -l)" = "$N" ]
}

if [ -f "$DIR/up" ]; then
  if [ "$(cat "$DIR/up")" = "$WANT" ] && infra_alive "$(cat "$DIR/slurmctld.pid" 2>/dev/null)" && all_idle; then
    echo "$ME: already running ($WANT) in $DIR"; exit 0
  fi
fi
[ -f "$DIR/fixture" ] && bash "$INFRA_DIR/slurm-down.sh" "$DIR" >/dev/null

echo slurm >"$DIR/fixture"
echo "$WANT" >"$DIR/up"
done_ok=0
trap '[ $done_ok = 1 ] || bash "$INFRA_DIR/slurm-down.sh" "$DIR" >/dev/null 2>&1' EXIT
rm -rf "$DIR/ctld" "$DIR"/spool-* "$DIR/log"
mkdir -p "$DIR/ctld" "$DIR/log" "$DIR/munge"
CLUSTER=jdt$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')

# --- munge: our own key and daemon. munged wants a socket folder that everyone may traverse,
# which DIR (often inside a private temp folder) may not be: the socket gets its own folder.
dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
chmod 600 "$DIR/munge/munge.key"
MSOCKDIR=$(mktemp -d /tmp/jdt-munge.XXXXXX); chmod 755 "$MSOCKDIR"
echo "$MSOCKDIR" >"$DIR/munge/socket-dir"
MSOCK=$MSOCKDIR/socket
munged --socket="$MSOCK" --key-file="$DIR/munge/munge.key" --pid-file="$DIR/munged.pid" \
  --seed-file="$DIR/munge/munged.seed" --log-file="$DIR/log/munged.log" \
  || infra_die $ME "munged did not start (see $DIR/log/munged.log)"
infra_wait 10 sh -c 'munge -S "$0" -n | unmunge -S "$0"' "$MSOCK" \
  || infra_die $ME "munged does not answer on $MSOCK (see $DIR/log/munged.log)"

# --- nodes, addresses and ports
if [ $HOSTS = 1 ]; then
  bash "$INFRA_DIR/netns-up.sh" "$DIR/net" "$N" >"$DIR/log/netns-up.log" 2>&1 \
    || { cat "$DIR/log/netns-up.log" >&2; infra_die $ME "could not make $N hosts (netns-up.sh)"; }
  . "$DIR/net/env"
  CTLD_HOST="host1($NETNS_ADDR_1)"; CTLD_PORT=6817; NODE_PORT=6818   # each host has its own ports
  for i in $(seq 1 "$N"); do v=NETNS_ADDR_$i; NODES[$i]="NodeName=host$i NodeAddr=${!v}"; done
else
  CTLD_HOST=localhost
  CTLD_PORT=$(infra_free_port); NODE_PORT=$(infra_free_port)
  { grep -v '^[[:space:]]*#' /etc/hosts || true; echo "127.0.0.1 $(seq -f 'node%g' -s ' ' 1 "$N")"; } >"$DIR/hosts"
  used=" $CTLD_PORT $NODE_PORT "
  for i in $(seq 1 "$N"); do
    p=$(infra_free_port); while [[ "$used" == *" $p "* ]]; do p=$(infra_free_port); done; used+="$p "
    NODES[$i]="NodeName=node$i NodeHostname=localhost NodeAddr=127.0.0.1 Port=$p"
  done
fi

# --- slurm.conf (see slurm.conf(5)); a test cluster: no cgroups, no accounting, root daemons
{
  echo "# generated by tests/infra/slurm-up.sh ($WANT); state, pids and logs in $DIR"
  echo "ClusterName=$CLUSTER"
  echo "SlurmctldHost=$CTLD_HOST"
  echo "SlurmctldPort=$CTLD_PORT"
  echo "SlurmdPort=$NODE_PORT"
  echo "SlurmUser=root"
  echo "SlurmdUser=root"
  echo "AuthType=auth/munge"
  echo "CredType=cred/munge"
  echo "AuthInfo=socket=$MSOCK"
  echo "StateSaveLocation=$DIR/ctld"
  echo "SlurmdSpoolDir=$DIR/spool-%n"
  echo "SlurmctldPidFile=$DIR/slurmctld.pid"
  echo "SlurmdPidFile=$DIR/slurmd-%n.pid"
  echo "SlurmctldLogFile=$DIR/log/slurmctld.log"
  echo "SlurmdLogFile=$DIR/log/slurmd-%n.log"
  echo "SlurmdParameters=config_overrides"   # trust CPUs= below over the machine's count
  echo "ProctrackType=proctrack/linuxproc"   # track job processes by parent pid, not cgroups
  echo "TaskPlugin=task/none"
  echo "SelectType=select/cons_tres"
  echo "SelectTypeParameters=CR_CPU"         # allocate CPUs, so several tasks share a node
  echo "MpiDefault=none"
  echo "ReturnToService=2"                   # a node that (re)registers is usable at once
  echo "AccountingStorageType=accounting_storage/none"
  echo "JobAcctGatherType=jobacct_gather/none"
  echo "JobCompType=jobcomp/none"
  echo "InactiveLimit=0"
  echo "KillWait=5"                          # SIGTERM -> SIGKILL for cancelled jobs
  for i in $(seq 1 "$N"); do echo "${NODES[$i]} CPUs=$CPUS State=UNKNOWN"; done
  echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
} >"$CONF"
{ echo "export SLURM_CONF=$CONF"; echo "export SLURM_CLUSTER=$CLUSTER"; } >"$DIR/env"

# --- daemons. Each daemonizes and writes its pid file; JDT_INFRA_STATE marks every process
# they start (slurmstepd) for slurm-down.sh's sweep.
export JDT_INFRA_STATE=$DIR SLURM_CONF=$CONF
on_node() {  # I CMD...: run a daemon as node I sees the world
  local i=$1; shift
  if [ $HOSTS = 1 ]; then bash "$INFRA_DIR/netns-exec.sh" "$DIR/net" "$i" "$@"
  else unshare --mount --propagation private -- sh -c 'h=$1; shift; mount --bind "$h" /etc/hosts && exec "$@"' \
         slurm-up "$DIR/hosts" "$@"; fi
}
on_node 1 slurmctld -f "$CONF" || infra_die $ME "slurmctld did not start (see $DIR/log/slurmctld.log)"
for i in $(seq 1 "$N"); do
  name=node$i; [ $HOSTS = 1 ] && name=host$i
  on_node "$i" slurmd -f "$CONF" -N "$name" || infra_die $ME "slurmd $name did not start (see $DIR/log/slurmd-$name.log)"
done
unset JDT_INFRA_STATE
if ! infra_wait "$TIMEOUT" all_idle; then
  client sinfo -N >&2 || true
  tail -n 5 "$DIR"/log/*.log >&2
  infra_die $ME "nodes not idle after ${TIMEOUT}s (logs in $DIR/log)"
fi
done_ok=1
echo "$ME: cluster $CLUSTER up: $N nodes ($(client sinfo -h -o %N)), $CPUS CPUs each, partition debug; conf $CONF"
