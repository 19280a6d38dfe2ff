"""bpe_ref.py — the Hugging Face / tiktoken side of tests/e2e/tokenizer_bpe.sh and
scripts/bench/tokenize.sh (runs in the venv those scripts make).

  bpe_ref.py train TEXT VOCAB OUT.json     train a byte-level BPE with `tokenizers`
  bpe_ref.py encode TOKENIZER.json TEXT OUT  ids (add_special_tokens=False), one per line
  bpe_ref.py bench TOKENIZER.json TEXT REPS  encode MB/s on one thread: tokenizers, tiktoken
"""
import os
import sys
import time


def train(text_path, vocab, out):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tr = trainers.BpeTrainer(vocab_size=int(vocab), special_tokens=["<|endoftext|>"],
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                             show_progress=False)
    tok.train([text_path], tr)
    tok.save(out)


def encode(tok_path, text_path, out):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(tok_path)
    text = open(text_path, encoding="utf-8").read()
    ids = tok.encode(text, add_special_tokens=False).ids
    with open(out, "w") as f:
        f.write("".join("%d\n" % i for i in ids))
    print("%d chars -> %d tokens" % (len(text), len(ids)))


def tiktoken_from(tok_path):
    """A tiktoken Encoding with the same vocabulary, merges-by-rank and regex (GPT-2 style
    tokenizer.json: ranks are the ids of a byte-level vocab in merge order)."""
    import json
    import tiktoken
    d = json.load(open(tok_path, encoding="utf-8"))
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    dec = {chr(c): b for b, c in zip(bs, cs)}
    ranks = {bytes(dec[ch] for ch in tok): i for tok, i in d["model"]["vocab"].items()
             if all(ch in dec for ch in tok)}
    special = {a["content"]: a["id"] for a in d.get("added_tokens", [])}
    for s in special:
        ranks.pop(s.encode(), None)
    pat = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    return tiktoken.Encoding("jdt-bench", pat_str=pat, mergeable_ranks=ranks, special_tokens=special)


def bench(tok_path, text_path, reps):
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Tokenizer
    text = open(text_path, encoding="utf-8").read()
    nbytes = len(text.encode("utf-8"))
    best = 1e30
    for _ in range(int(reps)):
        tok = Tokenizer.from_file(tok_path)
        t0 = time.perf_counter()
        n = len(tok.encode(text, add_special_tokens=False).ids)
        best = min(best, time.perf_counter() - t0)
    print("tokenizers %.2f MB/s (%d tokens, best of %s)" % (nbytes / best / 1e6, n, reps))
    best = 1e30
    for _ in range(int(reps)):
        enc = tiktoken_from(tok_path)
        t0 = time.perf_counter()
        n2 = len(enc.encode_ordinary(text))
        best = min(best, time.perf_counter() - t0)
    print("tiktoken %.2f MB/s (%d tokens, best of %s)" % (nbytes / best / 1e6, n2, reps))


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"train": train, "encode": encode, "bench": bench}[cmd](*args)
