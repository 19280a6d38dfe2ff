#!/usr/bin/env bash
# data_llmc.sh — end to end: `jdt-train prepare` imports llm.c's token files (the .bin shards
# its dev/data scripts write: a 1024-byte int32 header of magic, version and token count, then
# uint16 GPT-2 or uint32 Llama 3 ids). A BPE-prepared corpus is written out as llm.c files by
# numpy (two train files and a val file; one uint32 file), imported, and must give back exactly
# the same token streams (h5py reads both sides), with the tokenizer beside them, and train;
# without a val file the tail becomes val; nanoGPT's headerless train.bin / val.bin import the
# same way; bad files and settings give one line each. JSON Lines
# documents ({"text": ...}) stream through a loaded tokenizer to the ids of the joined text.
# The Python side is the venv under the build dir ($BUILD/pyvenv, from PyPI).
set -uo pipefail
BIN=${JDT_BIN:?}; TMP=${JDT_TMP:?}; ROOT=${JDT_ROOT:-$PWD}
BUILD=$(cd "$(dirname "$BIN")" && pwd)
fail() { echo "FAIL: $*"; exit 1; }
expect() { local want=$1; shift; "$@" >"$TMP/out" 2>"$TMP/err"; local rc=$?
  [ "$rc" -eq "$want" ] || { cat "$TMP/out" "$TMP/err" | tail -n 20; fail "'$*' exited $rc, expected $want"; }; }
export JDT_RUNTIME_CACHE_DIR="$TMP/cache"
. "$ROOT/tests/infra/lib.sh"
infra_pyvenv "$BUILD" "$TMP" # sets PY

# 1. a BPE corpus of our own, then the same ids as llm.c files
head -c 400000 /usr/share/games/fortunes/fortunes > "$TMP/text.txt"
[ -s "$TMP/text.txt" ] || fail "no fortunes corpus (apt-get install fortunes)"
cat > "$TMP/src.yaml" <<YAML
base_config: $ROOT/configs/tiny.yaml
model: {vocab_size: 320}
data: {format: tokens, source: $TMP/text.txt, train_path: $TMP/src, val_path: $TMP/src, tokenizer: bpe, val_fraction: 0.1}
run: {out_dir: $TMP/runs, steps: 3, eval_every: 3, eval_steps: 1}
YAML
expect 0 "$BIN" prepare "$TMP/src.yaml"
mkdir -p "$TMP/llmc"
"$PY" - "$TMP" <<'PY' || fail "writing llm.c files"
import sys, h5py, numpy as np
d = sys.argv[1]
def write(path, ids, magic=20240520, version=1, dtype=np.uint16, n=None):
    h = np.zeros(256, np.int32); h[0], h[1], h[2] = magic, version, len(ids) if n is None else n
    with open(path, "wb") as f:
        f.write(h.tobytes()); f.write(np.asarray(ids, dtype).tobytes())
tr = h5py.File(f"{d}/src/train_000.h5")["tokens"][:]
va = h5py.File(f"{d}/src/val_000.h5")["tokens"][:]
half = len(tr) // 2
write(f"{d}/llmc/fw_train_000001.bin", tr[:half])
write(f"{d}/llmc/fw_train_000002.bin", tr[half:])
write(f"{d}/llmc/fw_val_000000.bin", va)
write(f"{d}/one.bin", tr, 20240801, 7, np.uint32)                 # Llama 3's header and width
write(f"{d}/cut.bin", tr, n=len(tr) + 5)                            # the header promises more
write(f"{d}/big.bin", np.concatenate([tr[:100], [319, 400], tr[100:200]]))  # id 400 past the 320
import os
os.makedirs(f"{d}/nano", exist_ok=True)                            # nanoGPT: bare uint16 ids
tr.astype(np.uint16).tofile(f"{d}/nano/train.bin"); va.astype(np.uint16).tofile(f"{d}/nano/val.bin")
open(f"{d}/odd.bin", "wb").write(b"xyz")                           # 3 bytes: neither format
PY
cp "$TMP/src.yaml" "$TMP/imp.yaml"
sed -i "s|source: $TMP/text.txt, train_path: $TMP/src, val_path: $TMP/src|source: $TMP/llmc, train_path: $TMP/imp, val_path: $TMP/impval, tokenizer_path: $TMP/src/tokenizer.json|" "$TMP/imp.yaml"
expect 0 "$BIN" prepare "$TMP/imp.yaml"
grep -q "2 file(s)" "$TMP/err" || { cat "$TMP/err"; fail "two train files should give two shards"; }
"$PY" - "$TMP" <<'PY' || fail "imported streams differ"
import sys, glob, h5py, numpy as np
d = sys.argv[1]
def stream(pattern):
    fs = sorted(glob.glob(pattern)); assert fs, pattern
    return np.concatenate([h5py.File(f)["tokens"][:] for f in fs]), {h5py.File(f).attrs["tokenizer"] for f in fs}
a, ta = stream(f"{d}/src/train_*.h5"); b, tb = stream(f"{d}/imp/train_*.h5")
assert np.array_equal(a, b), (len(a), len(b))
a, _ = stream(f"{d}/src/val_*.h5"); b, tv = stream(f"{d}/impval/val_*.h5")
assert np.array_equal(a, b), (len(a), len(b))
assert ta == tb == tv and len(ta) == 1, (ta, tb, tv)
print(f"train and val streams identical, tokenizer {tb.pop()}")
PY
cmp -s "$TMP/src/tokenizer.json" "$TMP/imp/tokenizer.json" || fail "tokenizer.json not beside the imported shards"
expect 0 "$BIN" "$TMP/imp.yaml" run.name=imp
grep -q "val loss" "$TMP/err" || fail "no val loss on the imported data"
expect 0 "$BIN" sample "$TMP/runs/imp/ckpt" --prompt "The " --length 8
echo "import: 2 train files + 1 val file -> the same ids as the text prepare, trained, sampled"

# 1b. nanoGPT's headerless train.bin / val.bin: the same streams
expect 0 "$BIN" prepare "$TMP/imp.yaml" data.source="$TMP/nano" data.train_path="$TMP/nanoimp" data.val_path="$TMP/nanoimp"
"$PY" - "$TMP" <<'PY' || fail "nanoGPT import"
import sys, h5py, numpy as np
d = sys.argv[1]
for split in ("train", "val"):
    a = h5py.File(f"{d}/src/{split}_000.h5")["tokens"][:]; b = h5py.File(f"{d}/nanoimp/{split}_000.h5")["tokens"][:]
    assert np.array_equal(a, b), (split, len(a), len(b))
PY
echo "import: nanoGPT's train.bin + val.bin -> the same ids"
# training straight from a .bin says to import it first
expect 1 "$BIN" "$TMP/imp.yaml" data.train_path="$TMP/nano/train.bin" data.val_path="$TMP/nano/val.bin" run.name=bin
grep -q "train.bin: not an HDF5 file; llm.c's and nanoGPT's .bin token files are imported first" "$TMP/err" ||
  fail "training from a .bin: $(cat "$TMP/err")"

# 2. one uint32 file and no val file: the tail val_fraction is val
expect 0 "$BIN" prepare "$TMP/imp.yaml" data.source="$TMP/one.bin" data.train_path="$TMP/one" data.val_path="$TMP/one"
"$PY" - "$TMP" <<'PY' || fail "tail split"
import sys, h5py, numpy as np
d = sys.argv[1]
src = np.fromfile(f"{d}/one.bin", np.uint32, offset=1024)
tr = h5py.File(f"{d}/one/train_000.h5")["tokens"][:]; va = h5py.File(f"{d}/one/val_000.h5")["tokens"][:]
assert len(va) == int(len(src) * 0.1) and np.array_equal(np.concatenate([tr, va]), src), (len(tr), len(va), len(src))
PY
echo "import: one Llama-3-header file, val = its last 10%"

# 3. bad input: one line each
one_line() { [ "$(grep -c . "$TMP/err")" -eq 1 ] || { cat "$TMP/err"; fail "$1: not one line"; }; }
expect 2 "$BIN" prepare "$TMP/imp.yaml" data.tokenizer_path=
grep -q "llm.c token files (BPE ids): set data.tokenizer: bpe and data.tokenizer_path" "$TMP/err" || fail "no-tokenizer message: $(cat "$TMP/err")"
one_line "no tokenizer"
expect 1 "$BIN" prepare "$TMP/imp.yaml" data.source="$TMP/cut.bin" data.train_path="$TMP/x" data.val_path="$TMP/x"
grep -q "cut.bin: the header says .* tokens .* but the file has .* bytes" "$TMP/err" || fail "truncated-file message: $(cat "$TMP/err")"
one_line "truncated file"
expect 1 "$BIN" prepare "$TMP/imp.yaml" data.source="$TMP/big.bin" data.train_path="$TMP/x" data.val_path="$TMP/x"
grep -q "big.bin: token 101 is id 400, not below the tokenizer's 320 ids" "$TMP/err" || fail "bad-id message: $(cat "$TMP/err")"
one_line "bad id"
[ ! -e "$TMP/x/train_000.h5" ] || fail "a shard with a bad id was left as if whole"
expect 1 "$BIN" prepare "$TMP/imp.yaml" data.source="$TMP/odd.bin" data.train_path="$TMP/x" data.val_path="$TMP/x"
grep -q "odd.bin: neither an llm.c token file .* nor nanoGPT's uint16 ids (3 bytes" "$TMP/err" || fail "odd-file message: $(cat "$TMP/err")"
one_line "odd file"
expect 2 "$BIN" prepare "$TMP/imp.yaml" model.vocab_size=300
grep -q "the tokenizer has 320 ids but model.vocab_size is 300" "$TMP/err" || fail "vocab message: $(cat "$TMP/err")"
one_line "vocab"
# 4. JSON Lines documents ({"text": ...} per line, as Hugging Face datasets export them):
# streamed through a loaded tokenizer they give exactly the ids of the same documents joined
# with <|endoftext|> before each and prepared as text; a BPE trained on them puts one
# end-of-text id before each document; bytes join them with a blank line
"$PY" - "$TMP" <<'PY' || fail "writing documents"
import sys, json
d = sys.argv[1]
docs = [x.strip("\n") for x in open(f"{d}/text.txt", encoding="utf-8", errors="replace").read().split("\n%\n")]
docs = [x for x in docs if x.strip()]
with open(f"{d}/docs.jsonl", "w") as f:
    for i, x in enumerate(docs):
        f.write(json.dumps({"id": i, "text": x}) + "\n")
        if i == 3: f.write("\n")                          # a blank line is skipped
open(f"{d}/joined.txt", "w").write("".join("<|endoftext|>" + x for x in docs))
open(f"{d}/ndocs", "w").write(str(len(docs)))
PY
J="data.format=tokens data.tokenizer=bpe model.vocab_size=320 data.val_fraction=0.1"
# shellcheck disable=SC2086
expect 0 "$BIN" prepare "$ROOT/configs/tiny.yaml" $J data.source="$TMP/docs.jsonl" data.train_path="$TMP/jl" data.val_path="$TMP/jl" data.tokenizer_path="$TMP/src/tokenizer.json"
# shellcheck disable=SC2086
expect 0 "$BIN" prepare "$ROOT/configs/tiny.yaml" $J data.source="$TMP/joined.txt" data.train_path="$TMP/jt" data.val_path="$TMP/jt" data.tokenizer_path="$TMP/src/tokenizer.json"
# shellcheck disable=SC2086
expect 0 "$BIN" prepare "$ROOT/configs/tiny.yaml" $J data.source="$TMP/docs.jsonl" data.train_path="$TMP/jtr" data.val_path="$TMP/jtr"
expect 0 "$BIN" prepare "$ROOT/configs/tiny.yaml" data.format=tokens data.source="$TMP/docs.jsonl" data.train_path="$TMP/jb" data.val_path="$TMP/jb" data.val_fraction=0
ls -a "$TMP/jl" | grep -q "tmp" && fail "temporary files left in $TMP/jl: $(ls -a "$TMP/jl")"
"$PY" - "$TMP" <<'PY' || fail "JSON Lines streams"
import sys, glob, json, h5py, numpy as np
d = sys.argv[1]
def stream(dd, split):
    return np.concatenate([h5py.File(f)["tokens"][:] for f in sorted(glob.glob(f"{dd}/{split}_*.h5"))])
for split in ("train", "val"):
    a, b = stream(f"{d}/jl", split), stream(f"{d}/jt", split)
    assert np.array_equal(a, b), (split, len(a), len(b))
n = int(open(f"{d}/ndocs").read())
tok = json.load(open(f"{d}/jtr/tokenizer.json"))
eot = [t["id"] for t in tok["added_tokens"] if t["content"] == "<|endoftext|>"][0]
ids = np.concatenate([stream(f"{d}/jtr", "train"), stream(f"{d}/jtr", "val")])
assert (ids == eot).sum() == n and ids[0] == eot, ((ids == eot).sum(), n)
docs = [json.loads(l)["text"] for l in open(f"{d}/docs.jsonl") if l.strip()]
b = stream(f"{d}/jb", "train").astype(np.uint8).tobytes()
assert b == "\n\n".join(docs).encode(), (len(b), len("\n\n".join(docs).encode()))
print(f"{n} documents: streamed ids = joined-text ids; trained BPE: {n} end-of-text ids; bytes joined by blank lines")
PY
printf '{"text": "ok"}\n{"text": 3}\n' > "$TMP/bad1.jsonl"; printf '{"text": "ok"}\n{"text": "a\n' > "$TMP/bad2.jsonl"
expect 1 "$BIN" prepare "$ROOT/configs/tiny.yaml" data.format=tokens data.source="$TMP/bad1.jsonl" data.train_path="$TMP/y" data.val_path="$TMP/y"
grep -q "bad1.jsonl: line 2: no \"text\" string" "$TMP/err" || fail "no-text message: $(cat "$TMP/err")"
one_line "no text"
expect 1 "$BIN" prepare "$ROOT/configs/tiny.yaml" data.format=tokens data.source="$TMP/bad2.jsonl" data.train_path="$TMP/y" data.val_path="$TMP/y"
grep -q "bad2.jsonl: line 2" "$TMP/err" || fail "bad-JSON message: $(cat "$TMP/err")"
one_line "bad JSON"
echo "data_llmc: ok"
