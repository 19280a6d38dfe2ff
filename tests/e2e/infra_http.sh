#!/usr/bin/env bash
# infra_http.sh — the HTTP fixture the remote-data tests rely on (tests/infra/http-up.sh):
# it prints one URL on 127.0.0.1; a second up of the same folder gives the same URL; a byte
# range comes back as 206 with exactly those bytes, several ranges as multipart/byteranges,
# If-Range with a stale validator as the whole file (200); /slow/ is rate-limited (a transfer
# cut after 1 s holds only part of a 2 MB file); teardown.sh finds and stops a server left up
# (exit 3); http-down.sh stops it and is idempotent. Needs nginx and curl (make deps).
set -uo pipefail
TMP=${JDT_TMP:?}; ROOT=${JDT_ROOT:?}
fail() { echo "FAIL: $*"; exit 1; }
. "$ROOT/tests/infra/lib.sh"
command -v curl >/dev/null || infra_skip "curl is not installed (make deps)"
W=$TMP/www; mkdir -p "$W"
trap 'bash "$INFRA_DIR/http-down.sh" "$W" >/dev/null 2>&1' EXIT
head -c 2000000 /dev/urandom >"$W/blob.bin"
URL=$(bash "$INFRA_DIR/http-up.sh" "$W" 2>"$TMP/up.err"); rc=$?
[ $rc = 77 ] && infra_skip "$(tail -1 "$TMP/up.err")"
[ $rc = 0 ] || { cat "$TMP/up.err"; fail "http-up.sh exited $rc"; }
[[ "$URL" =~ ^http://127\.0\.0\.1:[0-9]+/$ ]] || fail "http-up.sh printed '$URL', not one URL"
[ "$(bash "$INFRA_DIR/http-up.sh" "$W" 2>/dev/null)" = "$URL" ] || fail "second up gave another URL"

code=$(curl -s -r 1000-1999 -o "$TMP/part" -w '%{http_code}' "${URL}blob.bin")
[ "$code" = 206 ] || fail "range request: HTTP $code, expected 206"
cmp -s "$TMP/part" <(tail -c +1001 "$W/blob.bin" | head -c 1000) || fail "range request: wrong bytes"
type=$(curl -s -r 0-9,100-109 -o /dev/null -w '%{http_code} %{content_type}' "${URL}blob.bin")
[[ "$type" == "206 multipart/byteranges"* ]] || fail "two ranges: got '$type'"
code=$(curl -s -r 0-9 -H 'If-Range: "stale"' -o "$TMP/whole" -w '%{http_code}' "${URL}blob.bin")
[ "$code" = 200 ] && cmp -s "$TMP/whole" "$W/blob.bin" || fail "If-Range with a stale ETag: HTTP $code, expected the whole file"
echo "ok: Range, multi-range, If-Range at $URL"

curl -s --max-time 1 -o "$TMP/slow" "${URL}slow/blob.bin"
got=$(stat -c %s "$TMP/slow" 2>/dev/null || echo 0)
[ "$got" -gt 0 ] && [ "$got" -lt 2000000 ] || fail "slow path: $got bytes after 1 s, expected part of the file"
echo "ok: slow path sent $got of 2000000 bytes in 1 s"

bash "$INFRA_DIR/teardown.sh" "$TMP" >"$TMP/td.out"; rc=$?
[ $rc = 3 ] || { cat "$TMP/td.out"; fail "teardown.sh exited $rc for a server left up, expected 3"; }
curl -s --max-time 2 -o /dev/null "$URL" && fail "server still answers after teardown"
bash "$INFRA_DIR/http-down.sh" "$W" || fail "http-down.sh with nothing up"
echo ok
