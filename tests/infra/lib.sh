# lib.sh — helpers shared by the test fixtures in tests/infra/ and the e2e tests that use them.
# Source it (`. tests/infra/lib.sh`); it defines functions only and changes no shell options.
#
# Every fixture keeps all it creates under one state folder it is given (or makes), writes a
# `fixture` file there naming its kind, and records each daemon's pid file there, so that its
# down script (and tests/infra/teardown.sh, the safety net run-all.sh calls after each test)
# stops exactly what it started and nothing else.

INFRA_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# infra_die WHO MESSAGE: one line on stderr, exit 1
infra_die() { echo "$1: $2" >&2; exit 1; }

# infra_skip MESSAGE: an e2e test cannot run here for the reason given. Exit 77 (skip), except
# under CI (CI=true), where a missing fixture is a broken machine, not a reason: exit 1.
infra_skip() {
  if [ "${CI:-}" = true ]; then
    echo "FAIL: would skip under CI: $*"; exit 1
  fi
  echo "SKIP: $*"; exit 77
}

# infra_alive PID: true when PID names a live process (not a zombie awaiting its reaper)
infra_alive() {
  local p=${1:-} st
  [[ "$p" =~ ^[0-9]+$ ]] && [ -r "/proc/$p/stat" ] || return 1
  st=$(sed -E 's/^[0-9]+ \(.*\) ([A-Za-z]).*/\1/' "/proc/$p/stat" 2>/dev/null) || return 1
  [ "$st" != Z ] && [ "$st" != X ]
}

# infra_stop PIDFILE COMM MARK: stops the process in PIDFILE if it is alive, its command name is
# COMM and its command line contains MARK (the fixture's state folder), so a stale pid file never
# kills a stranger. TERM, then KILL after 5 s. Removes PIDFILE. Prints what it stopped.
infra_stop() {
  local f=$1 comm=$2 mark=$3 p i
  [ -f "$f" ] || return 0
  p=$(head -c 32 "$f" 2>/dev/null | tr -dc 0-9)
  if infra_alive "$p" && [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$comm" ] \
     && { tr '\0' ' ' <"/proc/$p/cmdline"; } 2>/dev/null | grep -qF -- "$mark"; then
    kill -TERM "$p" 2>/dev/null
    for i in $(seq 1 50); do infra_alive "$p" || break; sleep 0.1; done
    infra_alive "$p" && kill -KILL "$p" 2>/dev/null
    echo "stopped $comm (pid $p)"
  fi
  rm -f "$f"
}

# infra_wait SECONDS COMMAND...: runs COMMAND every 0.1 s until it succeeds (0) or SECONDS pass (1)
infra_wait() {
  local limit=$1 t0=$SECONDS; shift
  while ! "$@" >/dev/null 2>&1; do
    [ $((SECONDS - t0)) -lt "$limit" ] || return 1
    sleep 0.1
  done
}

# infra_free_port: prints a TCP port in 20000..59999 that nothing on this network namespace
# listens on now. A fixture that binds it must still handle losing a race (retry).
infra_free_port() {
  local p i
  for i in $(seq 1 100); do
    p=$(( 20000 + (RANDOM * 32768 + RANDOM) % 40000 ))
    [ -z "$(ss -Htan "( sport = :$p )" 2>/dev/null)" ] && { echo "$p"; return 0; }
  done
  return 1
}

# infra_state_dir KIND [DIR]: prints the state folder to use: DIR if given (created, must be
# empty or already a KIND fixture's), else a new one under $JDT_TMP (the e2e test's temp
# folder) or $TMPDIR or /tmp. Exits 1 with a message when DIR holds something else.
infra_state_dir() {
  local kind=$1 d=${2:-}
  if [ -z "$d" ]; then
    d=$(mktemp -d "${JDT_TMP:-${TMPDIR:-/tmp}}/jdt-$kind.XXXXXX") || return 1
  else
    mkdir -p "$d" || return 1
    if [ -n "$(ls -A "$d")" ] && [ "$(cat "$d/fixture" 2>/dev/null)" != "$kind" ]; then
      echo "infra: $d is not empty and not a $kind fixture's state folder" >&2; return 1
    fi
  fi
  (cd "$d" && pwd -P)
}

# infra_http_state DIR: the state folder in which http-up.sh keeps the server of the folder DIR
# (an absolute path without symlinks): one per DIR, under $JDT_TMP, $TMPDIR or /tmp
infra_http_state() {
  echo "${JDT_TMP:-${TMPDIR:-/tmp}}/jdt-http.$(printf %s "$1" | md5sum | cut -c1-12)"
}

# infra_pyvenv BUILD_DIR TMP: sets PY to the python of BUILD_DIR/pyvenv, a venv with the
# packages the e2e tests' Python side uses (from PyPI), made on first use. e2e tests run two at
# a time: a lock keeps a second test from clearing the venv while the first installs into it.
# Skips (infra_skip) when it cannot be made.
infra_pyvenv() {
  local venv=$1/pyvenv log=$2/pip.log
  PY=$venv/bin/python
  (
    flock 9
    "$PY" -c "import safetensors, numpy, tokenizers, tiktoken, h5py" 2>/dev/null && exit 0
    # --clear: a venv left half-made by an interrupted run (no pip) is made afresh
    python3 -m venv --clear "$venv" >/dev/null 2>&1 || exit 2
    "$venv/bin/pip" install -q tokenizers tiktoken safetensors numpy h5py >"$log" 2>&1 || exit 3
  ) 9>"$1/pyvenv.lock"
  case $? in
    0) ;;
    2) infra_skip "python3 -m venv failed" ;;
    *) infra_skip "PyPI unreachable (pip install of the test packages failed: $(tail -1 "$log"))" ;;
  esac
}
