#!/usr/bin/env bash
# teardown.sh BASE — the safety net tests/run-all.sh runs after every e2e test: stops every
# fixture (SLURM cluster, network-namespace hosts, HTTP server) whose state folder lies under
# BASE (the test's $JDT_TMP) and is still up, whatever became of the test (a failed assertion,
# a timeout's SIGKILL). A test is expected to stop its own fixtures (trap ... EXIT); this catches
# the ones it could not.
# Exit: 0 nothing was left up; 3 something was left and has been stopped (run-all.sh reports
# the test as failed: it leaked); 1 something could not be stopped.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
BASE=${1:-}
[ -d "$BASE" ] || { echo "usage: $0 BASE (an existing folder)" >&2; exit 2; }
left=0; rc=0
# state folders sit at most a few levels down ($JDT_TMP/slurm, $JDT_TMP/slurm/net, ...);
# outermost first, so a cluster is stopped (with its hosts) before its hosts are examined
while read -r f; do
  st=$(dirname "$f")
  case "$(cat "$f" 2>/dev/null)" in
    slurm) [ -f "$st/up" ] || continue
           echo "teardown: a SLURM cluster was left running in $st"; left=1
           bash "$INFRA_DIR/slurm-down.sh" "$st" || rc=1 ;;
    netns) [ -f "$st/namespaces" ] || continue
           echo "teardown: network-namespace hosts were left in $st"; left=1
           bash "$INFRA_DIR/netns-down.sh" "$st" || rc=1 ;;
    http)  [ -f "$st/nginx.pid" ] || continue
           echo "teardown: an HTTP server was left running in $st"; left=1
           bash "$INFRA_DIR/http-down.sh" "$st" || rc=1 ;;
  esac
done < <(find "$BASE" -maxdepth 4 -name fixture -type f 2>/dev/null | awk '{ print gsub("/", "/"), $0 }' \
         | sort -k1,1n | cut -d' ' -f2-)
[ $rc = 0 ] || exit 1
[ $left = 0 ] || exit 3
exit 0
