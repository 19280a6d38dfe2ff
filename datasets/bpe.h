/*
 * bpe.h — BPE tokenizers (prefix jdt_bpe_): byte-level, the kind GPT-2, Llama-3 and Qwen use,
 * and SentencePiece-style with byte fallback (Llama 2, Mistral, Gemma).
 *
 * Loads a Hugging Face tokenizer.json (model BPE over the ByteLevel alphabet; pre-tokenizer
 * ByteLevel with GPT-2's split regex, or Split(Regex, Isolated) followed by ByteLevel without
 * regex; added/special tokens) or a GPT-2 vocab.bpe + encoder.json pair; trains one on a text;
 * writes one as a tokenizer.json that Hugging Face `tokenizers` loads. Encoding follows
 * `tokenizers`' encode(text, add_special_tokens=False): added tokens are cut out of the text
 * first (leftmost, longest), each remaining segment is split by the pre-tokenizer regex (PCRE2,
 * UTF + UCP, JIT; matches and the gaps between them are pieces), each piece's bytes are merged
 * by merge rank (lowest first, leftmost on ties). SentencePiece-style files (model.byte_fallback:
 * Llama 2, Mistral, Gemma; normalizer Prepend / Replace of "▁", or a Metaspace pre-tokenizer)
 * merge characters instead, those the vocabulary lacks as their <0xNN> byte tokens, with "▁"
 * held as a space (docs/tokenizers.md). Text need not be valid UTF-8: bytes that are
 * not part of a valid sequence form pieces of their own, so decode(encode(x)) == x for any x.
 * A jdt_bpe is not thread-safe (encoding uses a piece cache); use one per thread.
 * docs/tokenizers.md has the format details and what is not supported.
 */
#ifndef JDT_BPE_H
#define JDT_BPE_H

#include "core/core.h"

typedef struct jdt_bpe jdt_bpe;

/* GPT-2's pre-tokenizer regex (Hugging Face ByteLevel with use_regex: true). */
#define JDT_BPE_GPT2_REGEX                                                                         \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

/* Loads a tokenizer from path: a tokenizer.json file; a GPT-2 vocab.bpe file (encoder.json
 * must sit beside it); or a directory holding tokenizer.json, else vocab.bpe + encoder.json.
 * Errors (one line naming the file and the problem): ERR_NOT_FOUND, ERR_IO, ERR_FORMAT
 * (bad JSON, not a byte-level BPE, a merge whose parts or result are not in the vocab),
 * ERR_UNSUPPORTED (a normalizer or pre-tokenizer we do not implement, named), ERR_NOMEM. */
jdt_status jdt_bpe_load(const char *path, jdt_bpe **out, jdt_err *e);

/* Trains a byte-level BPE with vocab_size ids on n_bytes of text: ids 0..255 are the bytes,
 * then one id per merge (the most frequent adjacent pair within GPT-2-regex pieces, counted
 * over the whole text; ties go to the smaller (left, right) id pair), and the last id is the
 * special token "<|endoftext|>" (cut out of the text before counting). Stops early, with a
 * smaller vocabulary, if no pair occurs twice. vocab_size must be in [257, 2^24]. progress:
 * report the two phases (counting words, MB of text; merging, merges made) through
 * core's jdt_progress lines. Errors: ERR_INVALID, ERR_NOMEM. */
jdt_status jdt_bpe_train(const char *text, size_t n_bytes, int vocab_size, bool progress,
                         jdt_bpe **out, jdt_err *e);

/* Writes tok as a Hugging Face tokenizer.json at path (temp file + rename). A tokenizer loaded
 * from a tokenizer.json is written back as it was read (the original text), others are
 * generated. Errors: ERR_IO. */
jdt_status jdt_bpe_save(const jdt_bpe *tok, const char *path, jdt_err *e);

/* Number of ids (one more than the largest id). */
int jdt_bpe_vocab_size(const jdt_bpe *tok);
/* The id of special token s, or -1. */
int jdt_bpe_special_id(const jdt_bpe *tok, const char *s);
/* The special tokens transformers' tokenizer puts before every text it encodes with
 * add_special_tokens: a loaded tokenizer.json's TemplateProcessing "single" template (the
 * post-processor, or one of a Sequence's: Llama 3's <|begin_of_text|>; none for GPT-2, Qwen and
 * trained tokenizers), *n of them at *ids. Errors: ERR_FORMAT (the template names a token that
 * is not one of the tokenizer's added tokens). */
#define JDT_BPE_MAX_PREFIX 8
jdt_status jdt_bpe_prompt_prefix(const jdt_bpe *tok, const uint32_t **ids, int *n, jdt_err *e);

/* Later jdt_bpe_encode calls report MB of their text done to prog (begun by the caller, with
 * the text's size in MB as its total); NULL stops reporting. */
void jdt_bpe_set_progress(jdt_bpe *tok, jdt_progress *prog);

/* Encodes n_bytes of text, appending ids to *ids (a jdt_realloc'd array of *cap elements,
 * *n_ids used; both may start NULL/0). Errors: ERR_NOMEM, ERR_INTERNAL (a PCRE2 match
 * error, named). */
jdt_status jdt_bpe_encode(jdt_bpe *tok, const char *text, size_t n_bytes, uint32_t **ids,
                          size_t *n_ids, size_t *cap, jdt_err *e);

/* The bytes of token id (*n_bytes set); ids out of range or unused give an empty string. */
const char *jdt_bpe_token_bytes(const jdt_bpe *tok, uint32_t id, size_t *n_bytes);
/* Decodes n ids into out (up to cap bytes); returns the full decoded length (which may exceed
 * cap: then only cap bytes were written). */
size_t jdt_bpe_decode(const jdt_bpe *tok, const uint32_t *ids, size_t n, char *out, size_t cap);

/* jdt_bpe_free(NULL) is a no-op. */
void jdt_bpe_free(jdt_bpe *tok);

#endif /* JDT_BPE_H */
