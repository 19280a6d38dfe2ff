#!/usr/bin/env bash
# netns-exec.sh DIR I CMD [ARG...] — runs CMD on host I of the hosts netns-up.sh DIR made, as a
# program there would see it: host I's network namespace (its address, only the test network),
# its own host name "hostI" (a private UTS namespace) and DIR/hosts as /etc/hosts (a private
# mount namespace), so host1..hostN resolve. Unlike `ip netns exec`, /sys is left as it is
# (slurmd reads its cgroup mount there). Daemons started this way stay in those namespaces.
# Exit: CMD's status; 1 when host I does not exist (with a message). Needs root.
set -euo pipefail
DIR=${1:-}; I=${2:-}
[ -n "$DIR" ] && [ -n "$I" ] && [ $# -ge 3 ] || { echo "usage: $0 DIR I CMD [ARG...]" >&2; exit 2; }
shift 2
ns=$(sed -n "$((I + 1))p" "$DIR/namespaces" 2>/dev/null || true)
[[ "$I" =~ ^[0-9]+$ ]] && [ "$I" -ge 1 ] && [ -n "$ns" ] && [ -e "/run/netns/$ns" ] \
  || { echo "netns-exec: no host $I in $DIR (netns-up.sh not run, or down)" >&2; exit 1; }
exec nsenter --net="/run/netns/$ns" -- unshare --mount --uts --propagation private -- \
  sh -c 'h=$1 n=$2; shift 2; mount --bind "$h" /etc/hosts && hostname "$n" && exec "$@"' \
  netns-exec "$DIR/hosts" "host$I" "$@"
