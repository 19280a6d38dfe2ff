#!/usr/bin/env bash
# netns-down.sh DIR — removes the hosts that netns-up.sh DIR made: stops every process still
# inside one of its namespaces (TERM, then KILL after 5 s), then deletes the namespaces, which
# takes their veths and the bridge with them. Only the namespaces listed in DIR/namespaces are
# touched. Idempotent: with nothing up it does nothing and succeeds. Needs root (exit 1 without).
set -uo pipefail
. "$(dirname "$0")/lib.sh"
ME=netns-down
DIR=${1:-}
[ -n "$DIR" ] || { echo "usage: $0 DIR" >&2; exit 2; }
[ -f "$DIR/namespaces" ] || exit 0
[ "$(id -u)" = 0 ] || infra_die $ME "needs root"
mapfile -t spaces <"$DIR/namespaces"
pids() { local ns; for ns in "${spaces[@]}"; do [ -e "/run/netns/$ns" ] && ip netns pids "$ns" 2>/dev/null; done; }
p=$(pids | tr '\n' ' ')
if [ -n "${p// /}" ]; then
  kill -TERM $p 2>/dev/null
  infra_wait 5 test -z "$(pids)" || kill -KILL $(pids) 2>/dev/null
  infra_wait 5 test -z "$(pids)" || echo "$ME: processes still in the namespaces: $(pids | tr '\n' ' ')" >&2
fi
rc=0
for ns in "${spaces[@]}"; do
  [ -e "/run/netns/$ns" ] || continue
  ip netns del "$ns" || { echo "$ME: could not delete namespace $ns" >&2; rc=1; }
done
[ $rc = 0 ] && rm -f "$DIR/namespaces" "$DIR/n" "$DIR/env"
[ $rc = 0 ] && echo "$ME: removed ${#spaces[@]} namespaces of $DIR"
exit $rc
