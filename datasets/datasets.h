/*
 * datasets.h — dataset preparation (prefix jdt_prep_): the byte tokenizer, text file -> token
 * shards with a train/val split, llm.c's token files -> token shards, and deterministic
 * synthetic token and array datasets. Library
 * code behind `jdt-train prepare`; the files it writes are the formats of io/data.h
 * (docs/data.md).
 */
#ifndef JDT_DATASETS_H
#define JDT_DATASETS_H

#include "core/core.h"

#define JDT_PREP_BYTE_VOCAB 256

/* Byte tokenizer: token i is byte i of the text (vocab 256). Writes n_bytes tokens to out and
 * returns the count. */
int64_t jdt_prep_byte_encode(const void *text, size_t n_bytes, uint32_t *out);
/* Inverse of the byte tokenizer: writes n bytes to out (ids >= 256 become '?'). */
void jdt_prep_byte_decode(const uint32_t *tokens, int64_t n, char *out);

typedef enum { JDT_PREP_TOK_BYTE, JDT_PREP_TOK_BPE } jdt_prep_tokenizer;

typedef struct {
    const char *text_path; /* input text file */
    const char *out_dir;   /* created if missing */
    const char *val_dir;   /* where val_000.h5 goes (created if missing); NULL, "" or out_dir
                              under another name = out_dir */
    double val_fraction;   /* [0, 1): the tail of the token stream that becomes val */
    int n_shards;          /* train shard files (>= 1); val is one file */
    int compress_level;    /* 0..9 (deflate) */
    jdt_prep_tokenizer tokenizer;
    const char *tokenizer_path; /* BPE: tokenizer to load (bpe.h); NULL or "" = train one */
    int vocab_size;             /* BPE: ids to train, and the most a loaded one may have */
} jdt_prep_text_opts;

typedef struct {
    int64_t n_train_tokens;
    int64_t n_val_tokens;
    int n_train_files;
    int n_val_files;
    int vocab_size; /* ids the shards may hold (256 for bytes) */
} jdt_prep_result;

/* Tokenizes text_path with the byte tokenizer, streaming it in blocks (never all in memory),
 * and writes out_dir/train_000.h5 ... train_{n_shards-1}.h5 and (if val_fraction > 0)
 * val_dir/val_000.h5 (val_dir: out_dir unless set), each through a temp file + rename. Stale
 * train_/val_ shards of an earlier run with more shards are removed (and out_dir's val_ shards
 * when val goes to another directory; val_dir's train_ files are left alone). res may be NULL.
 * Errors: ERR_NOT_FOUND/ERR_IO (the file), ERR_INVALID (empty text, too few tokens for the shards,
 * bad options). */
jdt_status jdt_prep_text(const jdt_prep_text_opts *opts, jdt_prep_result *res, jdt_err *e);

/* Where `jdt-train prepare` writes the val shard for a config's data.train_path and
 * data.val_path, so that a run reads it where the config says: val_path when it names another
 * directory, else NULL (beside the train shards). Never a directory of another dataset's train
 * shards (train_NNN.h5): a config whose train_path alone was overridden would overwrite that
 * dataset's val split; NULL then, with *shadowed set (else false). */
const char *jdt_prep_val_dir(const char *train_path, const char *val_path, bool *shadowed);

/* The BPE path of jdt_prep_text (opts->tokenizer == JDT_PREP_TOK_BPE; jdt_prep_text calls it).
 * Reads the whole text into memory; loads opts->tokenizer_path, or trains a tokenizer of
 * opts->vocab_size ids on the train part (the head) of the text; writes it as
 * out_dir/tokenizer.json; encodes the text; splits the ids into train shards and the val tail
 * as the byte path does. Shards record tokenizer "bpe-<16 hex digits of the FNV-1a hash of
 * tokenizer.json>" and vocab_size = the tokenizer's. Errors as jdt_prep_text, plus the
 * tokenizer's (bpe.h), and ERR_CONFIG when a loaded tokenizer has more than vocab_size ids or
 * vocab_size cannot hold a trained one (< 257). */
jdt_status jdt_prep_text_bpe(const jdt_prep_text_opts *opts, jdt_prep_result *res, jdt_err *e);

/* True if source is an llm.c or nanoGPT token file (a `.bin` file, or any file whose header
 * has llm.c's GPT-2 or Llama 3 magic) or a directory holding `.bin` files: jdt_prep_text then
 * imports it (jdt_prep_llmc) instead of reading it as text. */
bool jdt_prep_is_llmc(const char *source);

/* Imports llm.c token files (the format of its dev/data scripts: a 1024-byte header of int32
 * magic, version and token count, then uint16 GPT-2 or uint32 Llama 3 ids): opts->text_path
 * is one such file or a directory of them (every .bin file, in name order; a .bin without
 * llm.c's magic is nanoGPT's: bare uint16 ids). Files whose name
 * contains "val" become val shards, one each (val_fraction unused); without one, the tail
 * val_fraction of the stream does, as for text. Each train file becomes one train shard
 * (n_shards unused). The ids need the tokenizer that made them: opts->tokenizer must be BPE
 * with tokenizer_path set; it is saved as out_dir/tokenizer.json and its hash tags the shards
 * as for text, and every id is checked against its size. Streams the files in 1 MiB blocks.
 * Errors: ERR_CONFIG (no tokenizer, vocab_size below the tokenizer's), ERR_FORMAT (a bad
 * header, a size that does not match it, ids of two widths, an id past the tokenizer, each
 * naming the file), ERR_IO, ERR_INVALID (no train file, too few tokens). */
jdt_status jdt_prep_llmc(const jdt_prep_text_opts *opts, jdt_prep_result *res, jdt_err *e);

/* Prepares a JSON Lines file (opts->text_path ends in .jsonl; jdt_prep_text calls it): one
 * JSON object per line, the document in its "text" string (blank lines skipped). Each document
 * is preceded by the tokenizer's <|endoftext|> (else <|end_of_text|>) id. With a loaded BPE
 * (tokenizer_path) the documents are encoded one at a time into temporary files that
 * jdt_prep_llmc splits as llm.c's (memory holds one document; one train shard per 2^30
 * tokens); otherwise they are joined into a temporary text file ("<|endoftext|>" before each
 * for a BPE to train, a blank line between them for bytes) that the text path prepares.
 * The temporaries live in out_dir and are removed. Errors: as jdt_prep_text and jdt_prep_llmc,
 * and ERR_FORMAT naming the file and line (not JSON, no "text" string), ERR_INVALID (no
 * document). */
jdt_status jdt_prep_jsonl(const jdt_prep_text_opts *opts, jdt_prep_result *res, jdt_err *e);

/* The tokenizer a run uses when data.tokenizer is bpe: data_dir/tokenizer.json (data_dir is
 * the prepared shard directory, or the directory of a single shard file), else
 * tokenizer_path. Errors: ERR_NOT_FOUND (naming both places), the tokenizer's load errors. */
struct jdt_bpe;
jdt_status jdt_prep_bpe_for_run(const char *data_path, const char *tokenizer_path,
                                struct jdt_bpe **out, jdt_err *e);

/* Writes a synthetic token file of n_tokens ids < vocab_size, a pure function of seed: a
 * random sparse Markov chain (each token's successor is a fixed random token with
 * probability 3/4, else uniform), so a model has something to learn. Tokenizer "synthetic". */
jdt_status jdt_prep_synth_tokens(const char *path, int64_t n_tokens, uint32_t vocab_size,
                                 uint64_t seed, jdt_err *e);

/* Writes a synthetic array dataset, a pure function of seed: x (n_rows, dim) ~ N(0, 1), and
 * y = argmax(x @ W) for a random W (dim, n_classes): linearly separable classes. */
jdt_status jdt_prep_synth_arrays(const char *path, int64_t n_rows, int64_t dim, int64_t n_classes,
                                 uint64_t seed, jdt_err *e);

#endif /* JDT_DATASETS_H */
