/*
 * hf.h — Hugging Face interop (prefix jdt_hf_): a jdt checkpoint of a gpt model exported as a
 * transformers model directory (model.safetensors + config.json + tokenizer.json).
 *
 * Four architectures map exactly (docs/interop.md has the tensor-by-tensor mapping):
 *   GPT2LMHeadModel  — norm layernorm, bias true, pos learned, activation gelu (tanh form =
 *                      HF "gelu_new"), tie_embeddings true, n_kv_head = n_head;
 *   LlamaForCausalLM — norm rmsnorm, bias false, pos rope, activation swiglu (GQA, any
 *                      head_dim, tied or untied head); a "mistral" directory reads as one;
 *   Qwen2ForCausalLM — the Llama settings with qkv_bias true;
 *   Qwen3ForCausalLM — the Llama settings with qk_norm true.
 * Any other combination is ERR_UNSUPPORTED naming the key that does not fit.
 */
#ifndef JDT_TRAIN_HF_H
#define JDT_TRAIN_HF_H

#include "core/core.h"
#include "graph/graph.h"

/* Writes out_dir/model.safetensors (F32), out_dir/config.json and, when the run used a BPE
 * tokenizer, out_dir/tokenizer.json, from the checkpoint at ckpt_path (a step directory).
 * out_dir is created if missing; files land by temp file + rename. On success *arch (if not
 * NULL) names the transformers class. Errors: the checkpoint's (ERR_NOT_FOUND, ERR_FORMAT),
 * ERR_UNSUPPORTED (model does not map; the message says which key), ERR_IO, ERR_NOMEM. */
jdt_status jdt_hf_export(const char *ckpt_path, const char *out_dir, const char **arch, jdt_err *e);

struct jdt_step;
struct jdt_config;
/* checkpoint.init_from: fills every "params/<name>" tensor of step from path, which is either
 * a Hugging Face directory (model.safetensors, or the files model.safetensors.index.json
 * lists, + config.json, as jdt_hf_export writes them or as transformers saves the four
 * architectures above in F32/F16/BF16) or a jdt checkpoint
 * (a step directory or a run's checkpoint folder: its newest). Optimizer state is left as it
 * is (fresh). config.json must agree with cfg on every dimension and its model_type be the
 * architecture cfg maps to; the message names the key that does not (or the settings that
 * select the file's architecture). Errors: ERR_NOT_FOUND, ERR_FORMAT, ERR_CONFIG (mismatch),
 * ERR_UNSUPPORTED, ERR_IO, ERR_NOMEM. */
jdt_status jdt_hf_init_from(struct jdt_step *step, const struct jdt_config *cfg, const char *path,
                            jdt_err *e);

/* Whether path is a Hugging Face model directory (config.json and model.safetensors or
 * model.safetensors.index.json). */
bool jdt_hf_is_model_dir(const char *path);

/* The config of the gpt a Hugging Face directory holds, as YAML for jdt_config_load_string:
 * the model section from config.json (gpt2, llama, mistral, qwen2 or qwen3; transformers'
 * defaults where a key is absent; the Llama family's context capped at 4096 positions, the KV
 * cache `sample` sizes by it, and at a sliding window in use) and
 * the data section's tokenizer: the directory's tokenizer.json, or bytes for a jdt export of a
 * byte-tokenizer run. *yaml is jdt_malloc'd. Errors: ERR_UNSUPPORTED (another model_type),
 * ERR_FORMAT (a dimension missing), ERR_NOT_FOUND (no tokenizer), the JSON
 * reader's. */
jdt_status jdt_hf_config_yaml(const char *dir, char **yaml, jdt_err *e);

/* The end-of-sequence ids of a Hugging Face directory: "eos_token_id" (an id or a list of
 * ids) of config.json and of generation_config.json where it exists (Llama 3 Instruct's lists
 * <|eot_id|> there), each below vocab once, at most JDT_HF_MAX_EOS. Errors: ERR_FORMAT (an id
 * that is not an integer in [0, vocab)), the JSON reader's. */
#define JDT_HF_MAX_EOS 8

jdt_status jdt_hf_eos_ids(const char *dir, int vocab, int *ids, int *n, jdt_err *e);

/* Reads the whole params names[i] (our names: "wte", "blocks.0.attn.q.w", ...) of shapes[i]
 * into dst[i] from a Hugging Face directory, after checking config.json against cfg (as
 * jdt_hf_init_from does). Errors as jdt_hf_init_from. */
jdt_status jdt_hf_read_params(const char *dir, const struct jdt_config *cfg, int n,
                              const char *const *names, const jdt_shape *shapes, float *const *dst,
                              jdt_err *e);

#endif /* JDT_TRAIN_HF_H */
