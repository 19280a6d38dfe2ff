#!/usr/bin/env bash
# http-down.sh [DIR] — stops the server that http-up.sh DIR started (its nginx, found by the pid
# file in its state folder and checked to run that folder's config) and removes the state.
# Without DIR: every server http-up.sh started under $JDT_TMP (in an e2e test: that test's),
# or $TMPDIR or /tmp. DIR may also be a state folder itself (tests/infra/teardown.sh passes
# those). Idempotent: with nothing served it does nothing and succeeds.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
states=()
if [ $# = 0 ]; then
  for s in "${JDT_TMP:-${TMPDIR:-/tmp}}"/jdt-http.*; do [ -f "$s/fixture" ] && states+=("$s"); done
elif [ "$(cat "$1/fixture" 2>/dev/null)" = http ]; then
  states=("$1")
elif [ -d "$1" ]; then
  states=("$(infra_http_state "$(cd "$1" && pwd -P)")")
else
  echo "http-down: no such folder: $1" >&2; exit 2
fi
gone() { ! infra_alive "$1"; }
for st in "${states[@]}"; do
  [ -f "$st/fixture" ] || continue
  p=$(cat "$st/nginx.pid" 2>/dev/null)
  if infra_alive "$p" && [ "$(cat "/proc/$p/comm" 2>/dev/null)" = nginx ] \
     && { tr '\0' ' ' <"/proc/$p/cmdline"; } 2>/dev/null | grep -qF -- "$st/nginx.conf"; then
    workers=$(pgrep -P "$p" | tr '\n' ' ')
    kill -QUIT "$p"                                  # graceful: the master ends its worker
    infra_wait 5 gone "$p" || kill -KILL "$p" $workers 2>/dev/null
    echo "http-down: stopped nginx (pid $p) serving $(cat "$st/dir" 2>/dev/null)"
  fi
  rm -rf "$st"
done
exit 0
