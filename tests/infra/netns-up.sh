#!/usr/bin/env bash
# netns-up.sh DIR [N] — N separate "hosts" on this machine for multi-host tests: each is a
# network namespace with its own veth (eth0) and address; all veths plug into one bridge that
# lives in a namespace of its own. Nothing is created in the machine's own namespace and no
# route leads out, so the test range (default 198.18.77.0/24, from 198.18.0.0/15, which RFC 2544
# reserves for benchmark tests) never meets a real network. N defaults to 2 (1..200).
#
# Writes into DIR (the state folder; created if missing):
#   env          shell lines to source: NETNS_N, NETNS_ADDR_I and NETNS_NAME_I for I = 1..N
#   hosts        the /etc/hosts that tests/infra/netns-exec.sh shows on every host:
#                localhost plus "ADDR hostI" for each host
#   namespaces   the namespace names, for netns-down.sh
# Namespace names are "jdt" + random hex + "hI" (and "br" for the bridge), so concurrent runs
# never collide. Run commands on host I with `tests/infra/netns-exec.sh DIR I CMD...`; stop with
# `tests/infra/netns-down.sh DIR`. Idempotent: re-running with the same N while the hosts are up
# only checks them; another N rebuilds them. A failure part-way removes what was created.
#
# Exit: 0 up (and every host reaches every other one: ping), 77 a prerequisite is missing (not
# root, no ip/ping/nsenter: `make deps` installs them), 1 failed. Env: NETNS_SUBNET (first three
# octets of the /24, default 198.18.77).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
ME=netns-up
DIR=${1:-}; N=${2:-2}; SUBNET=${NETNS_SUBNET:-198.18.77}
[ -n "$DIR" ] || { echo "usage: $0 DIR [N]" >&2; exit 2; }
[[ "$N" =~ ^[0-9]+$ ]] && [ "$N" -ge 1 ] && [ "$N" -le 200 ] || { echo "$ME: N must be 1..200, got '$N'" >&2; exit 2; }
[[ "$SUBNET" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "$ME: NETNS_SUBNET must be three octets, got '$SUBNET'" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "$ME: network namespaces need root"; exit 77; }
for c in ip ping nsenter unshare; do
  command -v "$c" >/dev/null || { echo "$ME: '$c' is not installed (make deps)"; exit 77; }
done
DIR=$(infra_state_dir netns "$DIR") || exit 1

# all hosts up, same N, same subnet, every pair reachable?
healthy() {
  [ -f "$DIR/namespaces" ] && [ "$(cat "$DIR/n" 2>/dev/null)" = "$N $SUBNET" ] || return 1
  local ns
  while read -r ns; do [ -e "/run/netns/$ns" ] || return 1; done <"$DIR/namespaces"
  check
}
check() {
  local i j
  for i in $(seq 1 "$N"); do
    for j in $(seq 1 "$N"); do
      [ "$i" = "$j" ] && continue
      ip netns exec "$(sed -n "$((i + 1))p" "$DIR/namespaces")" ping -q -c 1 -W 2 "$SUBNET.$j" >/dev/null 2>&1 \
        || { echo "$ME: host$i cannot reach host$j ($SUBNET.$j)" >&2; return 1; }
    done
  done
}

if [ -f "$DIR/namespaces" ]; then
  if healthy; then echo "$ME: already up: $N hosts in $DIR"; exit 0; fi
  bash "$INFRA_DIR/netns-down.sh" "$DIR" >/dev/null
fi

echo netns >"$DIR/fixture"
tag=jdt$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')
done_ok=0
trap '[ $done_ok = 1 ] || bash "$INFRA_DIR/netns-down.sh" "$DIR" >/dev/null 2>&1' EXIT
br=${tag}br
for ns in "$br" $(seq -f "${tag}h%g" 1 "$N"); do
  [ ! -e "/run/netns/$ns" ] || infra_die $ME "namespace $ns exists already"
done
echo "$br" >"$DIR/namespaces"     # recorded before it exists: down removes whatever was made
ip netns add "$br"
ip -n "$br" link set lo up
ip -n "$br" link add br0 type bridge
ip -n "$br" link set br0 up
{ echo "127.0.0.1 localhost"; echo "::1 localhost"; } >"$DIR/hosts"
{ echo "NETNS_N=$N"; echo "NETNS_DIR=$DIR"; } >"$DIR/env.tmp"
for i in $(seq 1 "$N"); do
  ns=${tag}h$i
  echo "$ns" >>"$DIR/namespaces"
  ip netns add "$ns"
  # both ends are created inside their namespaces: no interface name is taken in ours
  ip link add eth0 netns "$ns" type veth peer name "p$i" netns "$br"
  ip -n "$br" link set "p$i" master br0 up
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "$SUBNET.$i/24" dev eth0
  ip -n "$ns" link set eth0 up
  echo "$SUBNET.$i host$i" >>"$DIR/hosts"
  { echo "NETNS_ADDR_$i=$SUBNET.$i"; echo "NETNS_NAME_$i=$ns"; } >>"$DIR/env.tmp"
done
mv "$DIR/env.tmp" "$DIR/env"
echo "$N $SUBNET" >"$DIR/n"
# a new link may take a moment to pass traffic: retry the full check for up to 10 s
infra_wait 10 check || { check || true; infra_die $ME "hosts cannot reach each other"; }
done_ok=1
echo "$ME: $N hosts up: host1..host$N = $SUBNET.1..$SUBNET.$N (namespaces ${tag}h1..${tag}h$N) in $DIR"
