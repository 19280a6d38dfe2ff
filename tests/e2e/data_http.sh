#!/usr/bin/env bash
# data_http.sh — remote data end to end (docs/data.md "Remote data") against nginx on loopback
# (tests/infra/http-up.sh): a byte-level GPT trained from an http:// directory (its
# manifest.txt, written by prepare) has the same losses, bit for bit, as from the local files;
# two processes on one host (--nproc 2) download each shard once; a download killed half-way
# leaves a .part that the next run continues with a Range request (nginx logs a 206 for just
# the missing bytes); init_from takes a checkpoint folder URL; a 404, a server that goes away
# mid-file, a shard whose bytes do not match the manifest's sha256 and a listing with no
# shards each end with one line naming the URL and exit 1; over HTTPS a self-signed
# certificate is refused unless CURL_CA_BUNDLE names it.
# e2e: exclusive (rate-limited transfers interrupted on a clock)
set -uo pipefail
BIN=${JDT_BIN:?}; TMP=${JDT_TMP:?}; ROOT=${JDT_ROOT:?}
fail() { echo "FAIL: $*"; exit 1; }
. "$ROOT/tests/infra/lib.sh"
command -v curl >/dev/null || infra_skip "curl is not installed (make deps)"
W=$TMP/www; W2=$TMP/www2
mkdir -p "$W" "$W2/empty"
trap 'bash "$INFRA_DIR/http-down.sh" "$W" >/dev/null 2>&1; bash "$INFRA_DIR/http-down.sh" "$W2" >/dev/null 2>&1' EXIT
URL=$(bash "$INFRA_DIR/http-up.sh" "$W" 2>"$TMP/up.err"); rc=$?
[ $rc = 77 ] && infra_skip "$(tail -1 "$TMP/up.err")"
[ $rc = 0 ] || { cat "$TMP/up.err"; fail "http-up.sh exited $rc"; }
LOG=$(ls -d "$TMP"/jdt-http.*/ | head -1)access.log
export JDT_CACHE_DIR=$TMP/cache
CACHE=$JDT_CACHE_DIR/data/127.0.0.1_${URL##*:}; CACHE=${CACHE%/}

# a ~300 kB text (Debian's base-files licences), byte tokens, 3 train shards + val
cat /usr/share/common-licenses/* 2>/dev/null | head -c 300000 >"$TMP/corpus.txt"
[ "$(stat -c %s "$TMP/corpus.txt")" -ge 200000 ] || fail "could not build a test corpus"
cat >"$TMP/c.yaml" <<YAML
run: {name: local, out_dir: $TMP/runs, seed: 1, steps: 8, log_every: 1, eval_every: 8, eval_steps: 2}
model: {type: gpt, vocab_size: 256, seq_len: 32, n_layer: 1, n_embd: 32, n_head: 2}
data: {format: tokens, source: $TMP/corpus.txt, train_path: $W/data, val_path: $W/data,
       val_fraction: 0.1, n_shards: 3, batch_size: 8, shuffle: true,
       fetch_retries: 2, fetch_backoff_s: 0.2, fetch_timeout_s: 5}
optimizer: {lr: 0.001, warmup_steps: 2}
checkpoint: {every: 8, resume: none}
runtime: {threads: 1}
YAML
"$BIN" prepare "$TMP/c.yaml" >/dev/null 2>"$TMP/prep.log" || { cat "$TMP/prep.log"; fail "prepare"; }
[ -f "$W/data/manifest.txt" ] || fail "prepare wrote no manifest.txt"
grep -q '^train_002.h5 [0-9]* [0-9a-f]\{64\} [0-9]*$' "$W/data/manifest.txt" || fail "manifest line: $(cat "$W/data/manifest.txt")"
losses() { grep -o '"loss": [0-9.e+-]*' "$TMP/runs/$1/metrics.jsonl"; grep -o '"val_loss": [0-9.e+-]*' "$TMP/runs/$1/metrics.jsonl"; }
timeout 300 "$BIN" "$TMP/c.yaml" >/dev/null 2>"$TMP/local.log" || { tail -5 "$TMP/local.log"; fail "local run"; }

# 1. from the URL: the same losses, bit for bit
timeout 300 "$BIN" "$TMP/c.yaml" run.name=remote data.train_path="${URL}data/" data.val_path="${URL}data/" \
  >/dev/null 2>"$TMP/remote.log" || { tail -5 "$TMP/remote.log"; fail "run from ${URL}data/"; }
[ "$(losses local | wc -l)" -ge 9 ] || fail "too few losses in the local run"
diff <(losses local) <(losses remote) >/dev/null || fail "losses from the URL differ from the local run"
for s in train_000 train_001 train_002 val_000; do
  cmp -s "$CACHE/data/$s.h5" "$W/data/$s.h5" || fail "cached $s.h5 differs from the served one"
done
echo "ok: $(losses remote | wc -l) losses from ${URL}data/ equal the local run's"

# 2. two processes, one host: every shard is downloaded once
rm -rf "$CACHE"; : >"$LOG"
timeout 300 "$BIN" --nproc 2 "$TMP/c.yaml" mesh.data=2 run.name=dp data.train_path="${URL}data/" \
  data.val_path="${URL}data/" >/dev/null 2>"$TMP/dp.log" || { tail -5 "$TMP/dp.log"; fail "--nproc 2 from the URL"; }
for s in train_000 train_001 train_002 val_000; do
  n=$(grep -c "GET /data/$s.h5 " "$LOG")
  [ "$n" = 1 ] || fail "--nproc 2: $s.h5 was downloaded $n times, expected once"
done
echo "ok: --nproc 2 downloaded each shard once"

# 3. a download killed half-way resumes: through /slow/ (256 kB/s), kill -9 once a .part
# holds 60 kB, truncate it to 50 kB, and check the next run asks only for the rest (206)
rm -rf "$CACHE"; : >"$LOG"
P=$CACHE/slow/data/train_000.h5.part
"$BIN" "$TMP/c.yaml" run.name=cut data.train_path="${URL}slow/data/" data.val_path="${URL}data/" \
  >/dev/null 2>"$TMP/cut.log" &
pid=$!
for _ in $(seq 200); do [ "$(stat -c %s "$P" 2>/dev/null || echo 0)" -ge 60000 ] && break; sleep 0.05; done
kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
[ "$(stat -c %s "$P" 2>/dev/null || echo 0)" -ge 60000 ] || fail "no partial download of 60 kB appeared at $P"
[ -f "${P%.part}" ] && fail "the shard was complete before the kill (too fast to test)"
truncate -s 50000 "$P"
size=$(stat -c %s "$W/data/train_000.h5")
timeout 300 "$BIN" "$TMP/c.yaml" run.name=resumed data.train_path="${URL}slow/data/" data.val_path="${URL}data/" \
  >/dev/null 2>"$TMP/resumed.log" || { tail -5 "$TMP/resumed.log"; fail "resumed run"; }
grep -q "\"GET /slow/data/train_000.h5 HTTP/1.1\" 206 $((size - 50000)) " "$LOG" \
  || { grep train_000 "$LOG"; fail "no 206 for the last $((size - 50000)) bytes of train_000.h5"; }
cmp -s "${P%.part}" "$W/data/train_000.h5" || fail "the resumed shard differs from the served one"
diff <(losses local) <(losses resumed) >/dev/null || fail "losses after a resumed download differ"
echo "ok: a cut download resumed with a 206 for the last $((size - 50000)) of $size bytes"

# 4. init_from a checkpoint folder over HTTP
ck=$(ls -d "$TMP"/runs/local/ckpt/step_* | tail -1)
mkdir -p "$W/ckpt" && cp -r "$ck" "$W/ckpt/"
timeout 300 "$BIN" "$TMP/c.yaml" run.name=init run.steps=2 checkpoint.init_from="${URL}ckpt/$(basename "$ck")/" \
  >/dev/null 2>"$TMP/init.log" || { tail -5 "$TMP/init.log"; fail "init_from a URL"; }
grep -q "initialised params from" "$TMP/init.log" || fail "init_from: no 'initialised params' line"
echo "ok: init_from ${URL}ckpt/$(basename "$ck")/"

# 4b. a BPE corpus by config alone: prepare (tokenizer.json goes into the manifest), train from
# the URL, then `sample` finds the tokenizer beside the remote shards (fetched into the cache)
timeout 300 "$BIN" prepare "$TMP/c.yaml" data.tokenizer=bpe model.vocab_size=320 data.train_path="$W/bpe" \
  >/dev/null 2>"$TMP/bpe-prep.log" || { tail -3 "$TMP/bpe-prep.log"; fail "prepare bpe"; }
grep -q '^tokenizer.json ' "$W/bpe/manifest.txt" || fail "manifest lacks tokenizer.json"
# c.yaml's data.val_path is the byte corpus's directory: its val split is not overwritten, the
# bpe corpus's goes beside its train shards, with a warning
[ -f "$W/bpe/val_000.h5" ] || fail "the bpe val split is not beside its train shards"
grep -q "data.val_path $W/data holds another dataset's train shards" "$TMP/bpe-prep.log" ||
  { cat "$TMP/bpe-prep.log"; fail "no warning that the val split is not where data.val_path says"; }
timeout 300 "$BIN" "$TMP/c.yaml" run.name=bpe run.steps=2 data.tokenizer=bpe model.vocab_size=320 \
  data.train_path="${URL}bpe/" data.val_path="${URL}bpe/" >/dev/null 2>"$TMP/bpe.log" \
  || { tail -3 "$TMP/bpe.log"; fail "bpe run from ${URL}bpe/"; }
rm -rf "$CACHE/bpe/tokenizer.json"
timeout 120 "$BIN" sample "$TMP/runs/bpe/ckpt" --prompt "The " --length 8 >"$TMP/bpe-sample.txt" 2>"$TMP/bpe-sample.log" \
  || { tail -3 "$TMP/bpe-sample.log"; fail "sample of a run trained from a BPE corpus URL"; }
[ -s "$TMP/bpe-sample.txt" ] && [ -s "$CACHE/bpe/tokenizer.json" ] || fail "sample: no text, or no tokenizer fetched"
echo "ok: bpe corpus from ${URL}bpe/, sample with its tokenizer.json"

# 5. HTTPS: TLS verification is on. A self-signed certificate for 127.0.0.1 (openssl s_server
# -WWW serves the folder, no listings: go through the manifest) is refused; with the
# certificate as CURL_CA_BUNDLE the run works and matches the local losses.
if command -v openssl >/dev/null; then
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 \
    -keyout "$TMP/key.pem" -out "$TMP/cert.pem" >/dev/null 2>&1 || fail "openssl req"
  port=$(infra_free_port) || fail "no free port"
  (cd "$W" && exec openssl s_server -quiet -WWW -accept "127.0.0.1:$port" -cert "$TMP/cert.pem" -key "$TMP/key.pem") \
    >"$TMP/s_server.log" 2>&1 &
  spid=$!
  trap 'kill $spid 2>/dev/null; bash "$INFRA_DIR/http-down.sh" "$W" >/dev/null 2>&1; bash "$INFRA_DIR/http-down.sh" "$W2" >/dev/null 2>&1' EXIT
  for _ in $(seq 50); do curl -sk -o /dev/null "https://127.0.0.1:$port/data/manifest.txt" && break; sleep 0.1; done
  HS="https://127.0.0.1:$port/data/manifest.txt"
  timeout 120 "$BIN" "$TMP/c.yaml" run.name=tls_bad data.train_path="$HS" >/dev/null 2>"$TMP/tls_bad.log"; rc=$?
  [ $rc = 1 ] && grep 'jdt-train: error' "$TMP/tls_bad.log" | grep -q "$HS: TLS verification failed" \
    || { cat "$TMP/tls_bad.log"; fail "self-signed HTTPS: exit $rc, expected 1 with a TLS verification error"; }
  echo "ok: tls: $(grep 'jdt-train: error' "$TMP/tls_bad.log" | cut -c1-160)"
  CURL_CA_BUNDLE=$TMP/cert.pem timeout 300 "$BIN" "$TMP/c.yaml" run.name=tls data.train_path="$HS" \
    data.val_path="$HS" >/dev/null 2>"$TMP/tls.log" || { tail -5 "$TMP/tls.log"; fail "HTTPS run with CURL_CA_BUNDLE"; }
  diff <(losses local) <(losses tls) >/dev/null || fail "losses over HTTPS differ from the local run"
  kill $spid 2>/dev/null; wait $spid 2>/dev/null
  echo "ok: $(losses tls | wc -l) losses over HTTPS (CURL_CA_BUNDLE) equal the local run's"
else
  infra_skip "openssl is not installed (make deps)"
fi

# bad inputs: one line naming the URL, exit 1
expect_error() { # NAME PATTERN ARGS...
  local name=$1 pat=$2; shift 2
  timeout 120 "$BIN" "$TMP/c.yaml" run.name="$name" "$@" >/dev/null 2>"$TMP/$name.log"; local rc=$?
  [ $rc = 1 ] || { tail -3 "$TMP/$name.log"; fail "$name: exit $rc, expected 1"; }
  [ "$(grep -c 'jdt-train: error' "$TMP/$name.log")" = 1 ] || { cat "$TMP/$name.log"; fail "$name: not one error line"; }
  grep 'jdt-train: error' "$TMP/$name.log" | grep -q -- "$pat" || { cat "$TMP/$name.log"; fail "$name: error line lacks '$pat'"; }
  echo "ok: $name: $(grep 'jdt-train: error' "$TMP/$name.log" | cut -c1-160)"
}
expect_error e404 "${URL}nope/train_000.h5: HTTP 404" data.train_path="${URL}nope/train_000.h5"
cp -r "$W/data" "$W/bad"
printf 'X' | dd of="$W/bad/train_001.h5" bs=1 seek=4000 conv=notrunc 2>/dev/null
expect_error sha "${URL}bad/train_001.h5: sha256" data.train_path="${URL}bad/"
mkdir -p "$W/empty"
expect_error empty "${URL}empty/: the directory listing names no matching files" data.train_path="${URL}empty/"

# a server that goes away mid-file: stop nginx once a .part holds data
cp -r "$W/data" "$W2/data"
URL2=$(bash "$INFRA_DIR/http-up.sh" "$W2" 2>>"$TMP/up.err") || fail "second server"
C2=$JDT_CACHE_DIR/data/127.0.0.1_${URL2##*:}; C2=${C2%/}
"$BIN" "$TMP/c.yaml" run.name=gone data.train_path="${URL2}slow/data/" >/dev/null 2>"$TMP/gone.log" &
pid=$!
for _ in $(seq 100); do [ -s "$C2/slow/data/train_000.h5.part" ] && break; sleep 0.1; done
# kill -9 the server this test started (its pid file; the workers are its children), so the
# connection drops mid-file; http-down.sh (in the trap) then finds nothing left to stop
ST2=$(infra_http_state "$W2"); master=$(cat "$ST2/nginx.pid")
kill -KILL "$master" $(ps -o pid= --ppid "$master") 2>/dev/null
timeout 120 tail --pid=$pid -f /dev/null; wait $pid; rc=$?
[ $rc = 1 ] || { tail -3 "$TMP/gone.log"; fail "server gone: exit $rc, expected 1"; }
[ "$(grep -c 'jdt-train: error' "$TMP/gone.log")" = 1 ] || { cat "$TMP/gone.log"; fail "server gone: not one error line"; }
grep 'jdt-train: error' "$TMP/gone.log" | grep -q "${URL2}slow/data/train_00[0-9].h5: .*gave up after 3 attempts" \
  || { cat "$TMP/gone.log"; fail "server gone: unclear error"; }
echo "ok: gone: $(grep 'jdt-train: error' "$TMP/gone.log" | cut -c1-200)"
echo ok
