#!/usr/bin/env bash
# slurm-down.sh DIR — stops the cluster that slurm-up.sh DIR started: cancels its jobs, stops
# its slurmd's, slurmctld and munged (by the pid files in DIR, each checked to be that daemon
# of this DIR), then ends any process left from it (slurmstepd, job tasks: found by the marks
# in their environment, JDT_INFRA_STATE=DIR or SLURM_CLUSTER_NAME=<this cluster>), and, in
# --hosts mode, removes the hosts (netns-down.sh DIR/net). Logs stay in DIR/log.
# Idempotent: with nothing running it does nothing and succeeds. Needs root (exit 1 without).
set -uo pipefail
. "$(dirname "$0")/lib.sh"
ME=slurm-down
DIR=${1:-}
[ -n "$DIR" ] || { echo "usage: $0 DIR" >&2; exit 2; }
[ "$(cat "$DIR/fixture" 2>/dev/null)" = slurm ] || exit 0
[ "$(id -u)" = 0 ] || infra_die $ME "needs root"
DIR=$(cd "$DIR" && pwd -P)
CONF=$DIR/slurm.conf
CLUSTER=$(sed -n 's/^ClusterName=//p' "$CONF" 2>/dev/null)
client() {
  if [ -f "$DIR/net/namespaces" ]; then SLURM_CONF=$CONF timeout 10 bash "$INFRA_DIR/netns-exec.sh" "$DIR/net" 1 "$@"
  else SLURM_CONF=$CONF timeout 10 "$@"; fi
}

queue_empty() { [ -z "$(client squeue -h -o %i 2>/dev/null)" ]; }

# 1. jobs: cancel, so their steps end with them (bounded: a sick controller must not hang us)
if infra_alive "$(cat "$DIR/slurmctld.pid" 2>/dev/null)"; then
  jobs=$(client squeue -h -o %i 2>/dev/null | tr '\n' ' ')
  if [ -n "${jobs// /}" ]; then
    client scancel $jobs >/dev/null 2>&1
    infra_wait 10 queue_empty || true
  fi
fi

# 2. daemons, by pid file; each must be the named daemon started with this DIR's config
for f in "$DIR"/slurmd-*.pid; do [ -e "$f" ] && infra_stop "$f" slurmd "$CONF"; done
infra_stop "$DIR/slurmctld.pid" slurmctld "$CONF"
infra_stop "$DIR/munged.pid" munged "$DIR/munge/munge.key"

# 3. sweep: anything still carrying this cluster's marks
ours() {
  local e p
  for e in /proc/[0-9]*/environ; do
    p=${e#/proc/}; p=${p%/environ}
    [ "$p" = $$ ] && continue
    { tr '\0' '\n' <"$e"; } 2>/dev/null | grep -qxF -e "JDT_INFRA_STATE=$DIR" -e "SLURM_CLUSTER_NAME=${CLUSTER:-none}" \
      && echo "$p"
  done
}
left=$(ours | tr '\n' ' ')
if [ -n "${left// /}" ]; then
  echo "$ME: ending leftover processes: $left"
  kill -TERM $left 2>/dev/null
  infra_wait 5 test -z "$(ours)" || kill -KILL $(ours) 2>/dev/null
fi

# 4. the hosts, the munge socket folder and the run-time state
[ -d "$DIR/net" ] && bash "$INFRA_DIR/netns-down.sh" "$DIR/net" >/dev/null
sd=$(cat "$DIR/munge/socket-dir" 2>/dev/null)
[[ "$sd" == /tmp/jdt-munge.* ]] && rm -rf "$sd"
rm -rf "$DIR/ctld" "$DIR"/spool-* "$DIR/munge" "$DIR/up" "$DIR/env"
echo "$ME: cluster ${CLUSTER:-?} in $DIR stopped"
exit 0
