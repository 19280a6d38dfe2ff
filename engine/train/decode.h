/*
 * decode.h — incremental gpt forward with a KV cache (prefix jdt_decoder_), for `sample`.
 *
 * The compiled forward graph runs a fixed (B, T) window: generating one token with it costs a
 * whole T-token forward. The decoder instead keeps, per sequence and layer, the keys and values
 * of every position it has seen (the KV cache) and runs only the new rows: a prompt once
 * (prefill: many rows of one sequence, GEMMs), then one row per sequence per token (decode:
 * one row each of several sequences, GEMV for a single row). It is written in plain C over the
 * checkpoint's parameters (OpenBLAS sgemm/sgemv, OpenMP over attention heads) and covers every
 * gpt option of models/: layernorm/rmsnorm, learned positions/rope, gelu/relu/swiglu, grouped-
 * query attention, tied/untied head, biases on/off. Its logits equal the graph's (the test in
 * tests/unit/check_decode.c compares them at every position).
 *
 * Dimension letters as in models.h; S sequences, each holding at most T = model.seq_len
 * positions (what the model was trained on; the caller decides what happens past it).
 */
#ifndef JDT_DECODE_H
#define JDT_DECODE_H

#include "config/config.h"
#include "models/models.h"

typedef struct jdt_decoder jdt_decoder;

/* Creates a decoder for cfg's gpt model with room for n_seqs sequences of model.seq_len
 * positions each. m is that model built from cfg (jdt_model_build, any batch) and data[i] holds
 * parameter m->params[i] (f32, its global shape); the decoder keeps views into data, which must
 * outlive it, and nothing of m. threads: the OpenMP budget of its parallel loops and of
 * OpenBLAS (0: OpenMP's default; sets OpenBLAS's process-wide count as a program compile does).
 * Errors: ERR_CONFIG (not a gpt: mlp models are not autoregressive), ERR_FORMAT (a parameter the
 * options need is missing or has another shape, named), ERR_NOMEM. */
jdt_status jdt_decoder_new(const jdt_config *cfg, const jdt_model *m, float *const *data,
                           int n_seqs, int threads, jdt_decoder **out, jdt_err *e);

/* Runs n rows: row r appends token toks[r] to sequence seqs[r] at that sequence's next position
 * (rows of one sequence are taken in order, so a prompt is n rows of one sequence; several
 * sequences may share one call). The next-token logits of the rows with want[r] set (want NULL:
 * every row) are written packed, in row order, to logits: (number of wanted rows, V).
 * Errors leave every sequence as it was: ERR_INVALID (n < 1, a sequence index out of range, a
 * token outside [0, V), a sequence that would pass seq_len positions), ERR_NOMEM. */
jdt_status jdt_decoder_forward(jdt_decoder *d, int n, const int *seqs, const int32_t *toks,
                               const bool *want, float *logits, jdt_err *e);

/* Empties sequence seq's cache (its next token is at position 0). */
void jdt_decoder_reset(jdt_decoder *d, int seq);

/* Number of positions sequence seq holds. */
int jdt_decoder_len(const jdt_decoder *d, int seq);

/* Bytes of the KV cache (2 * L * S * Hkv * T * D floats). */
int64_t jdt_decoder_cache_bytes(const jdt_decoder *d);

/* jdt_decoder_free(NULL) is a no-op. */
void jdt_decoder_free(jdt_decoder *d);

#endif /* JDT_DECODE_H */
