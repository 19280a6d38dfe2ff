/*
 * hf.h — Hugging Face interop (prefix jdt_hf_): a jdt checkpoint of a gpt model exported as a
 * transformers model directory (model.safetensors + config.json + tokenizer.json).
 *
 * Two architectures map exactly (docs/interop.md has the tensor-by-tensor mapping):
 *   GPT2LMHeadModel  — norm layernorm, bias true, pos learned, activation gelu (tanh form =
 *                      HF "gelu_new"), tie_embeddings true, n_kv_head = n_head;
 *   LlamaForCausalLM — norm rmsnorm, bias false, pos rope, activation swiglu (GQA allowed,
 *                      tied or untied head).
 * Any other combination is ERR_UNSUPPORTED naming the key that does not fit.
 */
#ifndef JDT_TRAIN_HF_H
#define JDT_TRAIN_HF_H

#include "core/core.h"

/* Writes out_dir/model.safetensors (F32), out_dir/config.json and, when the run used a BPE
 * tokenizer, out_dir/tokenizer.json, from the checkpoint at ckpt_path (a step directory).
 * out_dir is created if missing; files land by temp file + rename. On success *arch (if not
 * NULL) names the transformers class. Errors: the checkpoint's (ERR_NOT_FOUND, ERR_FORMAT),
 * ERR_UNSUPPORTED (model does not map; the message says which key), ERR_IO, ERR_NOMEM. */
jdt_status jdt_hf_export(const char *ckpt_path, const char *out_dir, const char **arch, jdt_err *e);

#endif /* JDT_TRAIN_HF_H */
