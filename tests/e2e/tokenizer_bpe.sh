#!/usr/bin/env bash
# tokenizer_bpe.sh — end to end: our byte-level BPE (datasets/bpe.h) encodes token for token
# like Hugging Face `tokenizers` on the fortunes corpus (plus a multilingual UTF-8 tail) for
#   a) a tokenizer trained by `tokenizers` (GPT-2 ByteLevel pre-tokenizer),
#   b) a Llama-3-style one trained by `tokenizers` (Split regex + ByteLevel without regex),
#      and a Qwen2-style one (NFC normalizer + Split + ByteLevel; the corpus has NFD text),
#   c) our own trained one (written as tokenizer.json, loaded by `tokenizers`),
#   d) c) as a GPT-2 vocab.bpe + encoder.json pair,
#   e) SentencePiece-style ones (byte_fallback, "▁" for spaces: Llama 2's Prepend + Replace
#      normalizer, Gemma's Replace and no-op Split, Metaspace first / always + split, a token across
#      a word's end), also decoding as
#      tokenizers' Replace + ByteFallback + Fuse decoder does;
# decode(encode(x)) == x for random UTF-8 and random bytes; `prepare` with data.tokenizer: bpe
# (trained and loaded) writes shards with the tokenizer recorded, a model trains on them and
# `sample` decodes through it; bad tokenizer files give one clear line and exit 1.
# The Python side lives in a venv under the build dir ($BUILD/pyvenv, from PyPI; infra_pyvenv);
# without PyPI the test skips (exit 77) saying so, and fails under CI.
set -uo pipefail
BIN=${JDT_BIN:?}; TMP=${JDT_TMP:?}; ROOT=${JDT_ROOT:-$PWD}
BUILD=$(cd "$(dirname "$BIN")" && pwd)
TOOL=$BUILD/bench/bpe_tool
REF=$ROOT/tests/e2e/bpe_ref.py
fail() { echo "FAIL: $*"; exit 1; }
expect() { local want=$1; shift; "$@" >"$TMP/out" 2>"$TMP/err"; local rc=$?
  [ "$rc" -eq "$want" ] || { cat "$TMP/out" "$TMP/err" | tail -n 20; fail "'$*' exited $rc, expected $want"; }; }
[ -x "$TOOL" ] || fail "$TOOL is missing (make tests-build)"
export JDT_RUNTIME_CACHE_DIR="$TMP/cache"

. "$ROOT/tests/infra/lib.sh"
infra_pyvenv "$BUILD" "$TMP" # sets PY

# corpus: the fortunes text of `make run` plus a deterministic multilingual tail
C=$TMP/corpus.txt
for f in /usr/share/games/fortunes/*; do
  case "$f" in *.dat|*.u8|*/art|*/ascii-art) continue;; esac
  [ -f "$f" ] && sed 's/^%$//' "$f"
done > "$C"
[ -s "$C" ] || fail "no fortunes corpus (apt-get install fortunes)"
"$PY" - "$C" <<'PY'
import random, sys
r = random.Random(12)
alph = ("abcdefghijklmnopqrstuvwxyz" "ÄÖÜäöüßéèçñ" "АБВГДабвгдежз" "αβγδεζηθ" "中文字符测试" "日本語のテキスト"
        "한국어" "עברית" "العربية" "हिन्दी" "0123456789" "٣٤٥" "½²" "  \n\t.,;:!?'\"()-–—…€$%" "🙂🚀👍🏽")
words = []
for _ in range(20000):
    w = "".join(r.choice(alph) for _ in range(r.randint(1, 8)))
    words.append(w)
open(sys.argv[1], "a", encoding="utf-8").write("\n" + " ".join(words) + " it's we'll I'M 123456 x\n")
# decomposed (NFD) accents and Hangul: an NFC normalizer changes these
import unicodedata
nfd = unicodedata.normalize("NFD", "Café naïve Ångström résumé Ñandú 한국어 Éire " * 300)
open(sys.argv[1], "a", encoding="utf-8").write(nfd + "\n")
PY
echo "corpus: $(wc -c < "$C") bytes"

check_same() { # name tokenizer-for-hf tokenizer-for-jdt [text, else the corpus]
  "$PY" "$REF" encode "$2" "${4:-$C}" "$TMP/$1.hf" >/dev/null || fail "$1: tokenizers encode"
  "$TOOL" encode "$3" "${4:-$C}" "$TMP/$1.jdt" >/dev/null || fail "$1: bpe_tool encode"
  if ! cmp -s "$TMP/$1.hf" "$TMP/$1.jdt"; then
    line=$(cmp "$TMP/$1.hf" "$TMP/$1.jdt" | sed -nE 's/.* line ([0-9]+).*/\1/p')
    fail "$1: encodings differ first at token ${line:-?} of $(wc -l < "$TMP/$1.hf") (hf $(sed -n "${line:-1}p" "$TMP/$1.hf") vs jdt $(sed -n "${line:-1}p" "$TMP/$1.jdt"))"
  fi
  echo "$1: $(wc -l < "$TMP/$1.hf") tokens, identical to tokenizers"
}

# a) trained by tokenizers, GPT-2 ByteLevel
"$PY" "$REF" train "$C" 2000 "$TMP/hf.json" || fail "tokenizers train"
check_same hf "$TMP/hf.json" "$TMP/hf.json"
# b) Llama-3 style: Split(regex, Isolated) + ByteLevel(use_regex=false)
"$PY" - "$C" "$TMP/llama.json" <<'PY' || fail "tokenizers train (llama-3 style)"
import sys
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
pat = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
       r"|\s*[\r\n]+|\s+(?!\S)|\s+")
tok = Tokenizer(models.BPE(ignore_merges=True))
tok.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(pat), behavior="isolated", invert=False),
    pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
tok.decoder = decoders.ByteLevel()
tok.train([sys.argv[1]], trainers.BpeTrainer(vocab_size=3000, show_progress=False,
          special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
tok.save(sys.argv[2])
PY
check_same llama3 "$TMP/llama.json" "$TMP/llama.json"
# b2) Qwen2 style: normalizer NFC + Split(regex with single digits) + ByteLevel
"$PY" - "$C" "$TMP/qwen.json" <<'PY' || fail "tokenizers train (qwen2 style)"
import sys
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
pat = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
       r"|\s*[\r\n]+|\s+(?!\S)|\s+")
tok = Tokenizer(models.BPE())
tok.normalizer = normalizers.NFC()
tok.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(pat), behavior="isolated", invert=False),
    pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
tok.decoder = decoders.ByteLevel()
tok.train([sys.argv[1]], trainers.BpeTrainer(vocab_size=2500, show_progress=False,
          special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
tok.save(sys.argv[2])
PY
check_same qwen2 "$TMP/qwen.json" "$TMP/qwen.json"
# e) SentencePiece-style (Llama 2, Mistral, Gemma): BPE over characters with byte_fallback and
# "▁" for spaces. One vocabulary (tokenizers trains on Metaspace-split words, as SentencePiece
# merges within words; vocabulary 1500 over an alphabet cut to 120 characters, so the
# multilingual tail falls back to <0xNN> byte tokens, 256 of them added), written with each
# front end such files use, on 400 KB of the corpus and its multilingual tail (with "<s>" and
# "</s>" in the text: added tokens, the first segment alone prepended under Metaspace first)
"$PY" - "$C" "$TMP" <<'PY' || fail "tokenizers train (SentencePiece style)"
import json, sys
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
text = open(sys.argv[1], encoding="utf-8").read()
text = text[:300000] + " <s>x</s>  a ▁b\t\n" + text[-100000:]
open(sys.argv[2] + "/spm.txt", "w", encoding="utf-8").write(text)
tr = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
tr.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
tr.train([sys.argv[2] + "/spm.txt"], trainers.BpeTrainer(vocab_size=1500, show_progress=False,
         special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=120))
d = json.loads(tr.to_str())
for b in range(256):
    d["model"]["vocab"].setdefault("<0x%02X>" % b, len(d["model"]["vocab"]))
fronts = {
    "llama2": (normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]), None),
    # transformers' Gemma conversion: a Split on " " after the Replace (finds none)
    "gemma": (normalizers.Replace(" ", "▁"), pre_tokenizers.Split(" ", behavior="merged_with_previous")),
    "metaspace": (None, pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)),
    "metasplit": (None, pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)),
}
for name, (norm, pre) in fronts.items():
    t = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    t.normalizer, t.pre_tokenizer = norm, pre
    t.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    if name == "llama2":  # its BOS before every text, as Llama 2's file has
        t.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    j = json.loads(t.to_str())
    j["model"]["vocab"], j["model"]["merges"], j["added_tokens"] = d["model"]["vocab"], d["model"]["merges"], d["added_tokens"]
    Tokenizer.from_str(json.dumps(j)).save("%s/spm_%s.json" % (sys.argv[2], name))
# a token across a word's end ("e▁", merged last): no piece may end before a "▁" (bpe.c
# spm_words), the whole segment is one
j = json.load(open("%s/spm_gemma.json" % sys.argv[2], encoding="utf-8"))
j["model"]["vocab"]["e▁"] = len(j["model"]["vocab"])
j["model"]["merges"].append(["e", "▁"])
Tokenizer.from_str(json.dumps(j)).save("%s/spm_cross.json" % sys.argv[2])
PY
for st in llama2 gemma metaspace metasplit cross; do
  check_same "spm_$st" "$TMP/spm_$st.json" "$TMP/spm_$st.json" "$TMP/spm.txt"
done
"$PY" - "$TMP/spm_llama2.json" "$TMP/spm_llama2.hf" "$TMP/spm_fb.txt" "$TMP/spm.hf.txt" <<'PY' || fail "spm: tokenizers decode"
import json, sys
from tokenizers import Tokenizer
vocab = json.load(open(sys.argv[1], encoding="utf-8"))["model"]["vocab"]
ids = [int(x) for x in open(sys.argv[2])]
fb = {v for k, v in vocab.items() if k.startswith("<0x")}
open(sys.argv[3], "w").write("%d" % sum(i in fb for i in ids))
open(sys.argv[4], "wb").write(Tokenizer.from_file(sys.argv[1]).decode(ids, skip_special_tokens=False).encode())
PY
[ "$(cat "$TMP/spm_fb.txt")" -gt 100 ] || fail "spm: only $(cat "$TMP/spm_fb.txt") byte-fallback tokens: the check proves little"
expect 0 "$TOOL" decode "$TMP/spm_llama2.json" "$TMP/spm_llama2.jdt" "$TMP/spm.jdt.txt"
cmp -s "$TMP/spm.hf.txt" "$TMP/spm.jdt.txt" || fail "spm: decoded text differs from tokenizers' decode"
echo "spm: $(cat "$TMP/spm_fb.txt") byte-fallback tokens among them; decoded as tokenizers decodes"
# JSON Lines documents through a tokenizer without an end-of-text token: each starts with the
# BOS of its template, the ids of transformers' tokenizer(text) document by document
"$PY" - "$TMP/spm.txt" "$TMP/spm_docs.jsonl" <<'PY' || fail "spm: writing documents"
import json, sys
docs = [d.strip() for d in open(sys.argv[1], encoding="utf-8").read().split("\n\n") if d.strip()][:300]
open(sys.argv[2], "w").write("".join(json.dumps({"text": d}) + "\n" for d in docs))
PY
expect 0 "$BIN" prepare "$ROOT/configs/tiny.yaml" data.format=tokens data.tokenizer=bpe model.vocab_size=2048 \
  data.source="$TMP/spm_docs.jsonl" data.train_path="$TMP/spm_jl" data.val_path="$TMP/spm_jl" \
  data.tokenizer_path="$TMP/spm_llama2.json" data.val_fraction=0.1
"$PY" - "$TMP" <<'PY' || fail "spm: JSON Lines ids differ from tokenizers' per-document encodings"
import glob, json, sys, h5py, numpy as np
from tokenizers import Tokenizer
d = sys.argv[1]
tok = Tokenizer.from_file(d + "/spm_llama2.json")
want = [i for l in open(d + "/spm_docs.jsonl") for i in tok.encode(json.loads(l)["text"]).ids]
got = np.concatenate([h5py.File(f)["tokens"][:] for s in ("train", "val") for f in sorted(glob.glob(f"{d}/spm_jl/{s}_*.h5"))])
assert want[0] == 1 and np.array_equal(np.array(want), got), (len(want), len(got), want[:5], got[:5].tolist())
print("spm: %d documents prepared from JSON Lines, each after <s>: tokenizers' encode(text) ids" % want.count(1))
PY
# a model trained on them exports its tokenizer with Llama 2's BOS and EOS in config.json (<s>
# from the template, </s>), and the exported directory samples through it
SJ=(data.format=tokens data.tokenizer=bpe model.vocab_size=2048 data.train_path="$TMP/spm_jl" data.val_path="$TMP/spm_jl"
    data.tokenizer_path="$TMP/spm_llama2.json" run.out_dir="$TMP/runs" run.name=spm run.steps=2 run.eval_every=0)
expect 0 "$BIN" "$ROOT/configs/tiny.yaml" "${SJ[@]}"
expect 0 "$BIN" export "$TMP/runs/spm/ckpt" --format hf "$TMP/hf_spm"
grep -q '"bos_token_id": 1,' "$TMP/hf_spm/config.json" && grep -q '"eos_token_id": 2,' "$TMP/hf_spm/config.json" ||
  { cat "$TMP/hf_spm/config.json"; fail "spm export: bos/eos not <s> (1) and </s> (2)"; }
expect 0 "$BIN" sample "$TMP/hf_spm" --prompt "The " --length 8 --temperature 0
echo "spm: a model on them exports bos <s>, eos </s> and samples from the export"
# c) our own trained tokenizer, loaded by tokenizers from the tokenizer.json we write
expect 0 "$TOOL" train "$C" 2000 "$TMP/ours.json"
cat "$TMP/out"
check_same ours "$TMP/ours.json" "$TMP/ours.json"
# d) the same vocabulary as a GPT-2 vocab.bpe + encoder.json pair
mkdir -p "$TMP/gpt2pair"
"$PY" - "$TMP/ours.json" "$TMP/gpt2pair" <<'PY' || fail "writing vocab.bpe"
import json, sys
d = json.load(open(sys.argv[1], encoding="utf-8"))
json.dump(d["model"]["vocab"], open(sys.argv[2] + "/encoder.json", "w", encoding="utf-8"), ensure_ascii=False)
with open(sys.argv[2] + "/vocab.bpe", "w", encoding="utf-8") as f:
    f.write("#version: 0.2\n" + "".join(m + "\n" for m in d["model"]["merges"]))
PY
check_same gpt2pair "$TMP/ours.json" "$TMP/gpt2pair/vocab.bpe"

# round trip on random UTF-8 and random bytes (invalid UTF-8 included)
for tk in "$TMP/ours.json" "$TMP/llama.json"; do  # (qwen: NFC changes text, as in tokenizers)
  expect 0 "$TOOL" roundtrip "$tk" 500 5
  grep -q "round trip ok" "$TMP/out" || fail "round trip"
done
echo "round trip ok"

# bad tokenizer files: one clear line, exit 1
printf '{"model": {"type": "BPE", "vocab": {"a": 0,}, "merges": []}}' > "$TMP/bad_comma.json"
printf '{"model": {"type": "WordPiece", "vocab": {}}}' > "$TMP/bad_type.json"
"$PY" - "$TMP/ours.json" "$TMP" <<'PY'
import json, sys
d = json.load(open(sys.argv[1], encoding="utf-8"))
d["model"]["merges"].append("zzzq qqzz")
json.dump(d, open(sys.argv[2] + "/bad_merge.json", "w"))
d = json.load(open(sys.argv[1], encoding="utf-8"))
d["normalizer"] = {"type": "NFKC"}
json.dump(d, open(sys.argv[2] + "/bad_norm.json", "w"))
d = json.load(open(sys.argv[1], encoding="utf-8"))
del d["model"]["vocab"]["Ā"]
json.dump(d, open(sys.argv[2] + "/bad_byte.json", "w"))
d = json.load(open(sys.argv[2] + "/spm_llama2.json", encoding="utf-8"))
del d["model"]["vocab"]["<0x41>"]
json.dump(d, open(sys.argv[2] + "/bad_spm_byte.json", "w"))
d = json.load(open(sys.argv[2] + "/spm_llama2.json", encoding="utf-8"))
d["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
json.dump(d, open(sys.argv[2] + "/bad_spm_pre.json", "w"))
PY
head -c 1000 "$TMP/ours.json" > "$TMP/bad_trunc.json"
printf 'x' > "$TMP/tiny.txt"
cat > "$TMP/prep.yaml" <<EOF
base_config: $ROOT/configs/tiny.yaml
model: {vocab_size: 512, seq_len: 32}
data: {format: tokens, source: $C, train_path: $TMP/data, val_path: $TMP/data, tokenizer: bpe, shuffle: true}
run: {out_dir: $TMP/runs, name: bpe, steps: 30, eval_every: 15}
EOF
for b in bad_comma:"trailing comma" bad_type:"WordPiece" bad_merge:"not in the vocab" bad_norm:"normalizer 'NFKC'" \
         bad_byte:"no token for byte 0x00" bad_trunc:"unexpected end of input" missing:"No such file" \
         bad_spm_byte:"byte_fallback without the vocabulary's token <0x41>" \
         bad_spm_pre:"pre-tokenizer 'ByteLevel' is not supported with byte_fallback"; do
  name=${b%%:*}; want=${b#*:}
  expect 1 "$BIN" prepare "$TMP/prep.yaml" data.tokenizer_path="$TMP/$name.json"
  [ "$(wc -l < "$TMP/err")" -eq 1 ] || { cat "$TMP/err"; fail "$name: not one line"; }
  grep -q -- "$want" "$TMP/err" || { cat "$TMP/err"; fail "$name: message lacks '$want'"; }
done
expect 2 "$BIN" prepare "$TMP/prep.yaml" data.tokenizer_path="$TMP/hf.json" model.vocab_size=300
grep -q "model.vocab_size to at least 2000" "$TMP/err" || { cat "$TMP/err"; fail "vocab too small message"; }
expect 2 "$BIN" prepare "$TMP/prep.yaml" model.vocab_size=256
grep -q "model.vocab_size 256: training a BPE needs" "$TMP/err" || { cat "$TMP/err"; fail "vocab 256 message"; }
echo "bad tokenizer files: one clear line each"

# prepare with a trained tokenizer, train, eval, sample
expect 0 "$BIN" prepare "$TMP/prep.yaml"
[ -f "$TMP/data/tokenizer.json" ] || fail "prepare wrote no tokenizer.json"
"$TOOL" encode "$TMP/data/tokenizer.json" "$C" "$TMP/prep.ids" >/dev/null
"$PY" - "$TMP/data" "$TMP/prep.ids" <<'PY' || fail "prepared shards do not hold the encoding"
import sys, h5py, numpy as np
d = sys.argv[1]
ids = np.loadtxt(sys.argv[2], dtype=np.int64)
tr = h5py.File(d + "/train_000.h5")
va = h5py.File(d + "/val_000.h5")
got = np.concatenate([tr["tokens"][:], va["tokens"][:]]).astype(np.int64)
assert tr["tokens"].dtype == np.uint16, tr["tokens"].dtype
assert np.array_equal(got, ids), (len(got), len(ids))
t = tr.attrs["tokenizer"]
t = t.decode() if isinstance(t, bytes) else t
assert t.startswith("bpe-") and len(t) == 20, t
assert int(tr.attrs["vocab_size"]) == 512
print("shards hold the encoding:", len(ids), "tokens, tokenizer", t)
PY
expect 0 "$BIN" "$TMP/prep.yaml"
first=$(head -1 "$TMP/runs/bpe/metrics.jsonl" | sed -E 's/.*"loss": ([0-9.e+-]+).*/\1/')
last=$(grep '"loss"' "$TMP/runs/bpe/metrics.jsonl" | tail -1 | sed -E 's/.*"loss": ([0-9.e+-]+).*/\1/')
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.5) }' || fail "loss did not fall: $first -> $last"
echo "bpe training loss $first -> $last"
expect 0 "$BIN" eval "$TMP/prep.yaml"
grep -qE "^val loss [0-9.]+" "$TMP/out" || fail "eval output"
expect 0 "$BIN" sample "$TMP/runs/bpe/ckpt" --prompt "The meaning of life" --length 30 --seed 3
[ "$(head -c 19 "$TMP/out")" = "The meaning of life" ] || fail "sample does not echo the prompt"
[ "$(wc -c < "$TMP/out")" -ge 40 ] || fail "sample printed too little for 30 BPE tokens"
head -c 300 "$TMP/out"; echo

# prepare with a loaded tokenizer: tokenizer.json is copied as it was
expect 0 "$BIN" prepare "$TMP/prep.yaml" data.tokenizer_path="$TMP/hf.json" data.train_path="$TMP/data2" model.vocab_size=2000
cmp -s "$TMP/hf.json" "$TMP/data2/tokenizer.json" || fail "loaded tokenizer.json not kept as it was"
echo "tokenizer_bpe: ok"
