/*
 * train.h — the training step and the training loop.
 *
 * The step is one graph: model forward, reverse-mode backward, gradient clipping by global
 * norm and the optimizer update (AdamW or SGD with momentum), with parameters and optimizer
 * moments as donated leaves updated in place. It is compiled once (engine/compile) and run
 * every step. With gradient accumulation (micro_batch_size < batch_size) the step splits into
 * two programs: "accumulate" (forward + backward, grads summed into accumulators) run once per
 * micro-batch, and "apply" (clip + optimizer, accumulators zeroed) run once per step.
 *
 * The loop (jdt_train_run) streams data (engine/io), logs progress and JSONL metrics, evaluates
 * on the val split, writes checkpoints (atomically, keep last K), resumes exactly and stops
 * cleanly on SIGINT/SIGTERM after saving a checkpoint.
 */
#ifndef JDT_TRAIN_H
#define JDT_TRAIN_H

#include "compile/compile.h"
#include "comm/comm.h"
#include "config/config.h"
#include "models/models.h"
#include "shard/shard.h"

#include <stdio.h>

/* Per-step scalar inputs of the optimizer graph (host-computed from the step number). */
typedef struct {
    jdt_tensor *lr;       /* () f32 learning rate of this step */
    jdt_tensor *bc1, *bc2; /* () f32 AdamW bias corrections 1/(1-b1^t), 1/(1-b2^t) */
    jdt_tensor *inv_accum; /* () f32 1 / number of micro-batches (apply graph only) */
} jdt_optim_inputs;

/* A compiled step: the graphs, their programs and the host buffers they are bound to. */
typedef struct jdt_step jdt_step;

typedef struct {
    int64_t micro_batch; /* GLOBAL rows per run of the accumulate/fused graph (every rank's
                            share together; the mesh splits it) */
    const jdt_mesh *mesh; /* NULL: one process. Else this rank's place in the device mesh: the
                             step is partitioned by engine/shard and its collectives run on
                             groups named by mesh-axis masks (shard.h) */
    int n_accum;         /* micro-batches per step */
    bool use_jit;        /* false: run the reference interpreter instead of compiled code */
    bool plan_only;      /* shapes only (`inspect`): no parameter, optimizer or accumulator
                            buffer is allocated or initialised (their data pointers stay NULL),
                            the programs are planned (copts.plan_only: passes, fusion, memory
                            plan) but not generated or compiled, the memory estimate is not
                            checked; jdt_step_run/eval then fail with ERR_INVALID */
    jdt_compile_opts copts;
} jdt_step_opts;

/* Builds and compiles the train step for cfg. On success *out owns everything; parameters are
 * initialised from cfg->run.seed and moments are zero. Errors: ERR_CONFIG (bad model/optimizer
 * combination), ERR_COMPILE, ERR_NOMEM ... with e naming the cause. */
jdt_status jdt_step_new(const jdt_config *cfg, const jdt_step_opts *o, jdt_step **out, jdt_err *e);
void jdt_step_free(jdt_step *s);

/* Runs one optimizer step (t is the 0-based step number; lr from the schedule) on the global
 * batch given as n_accum micro-batches of inputs x and targets y, laid out back to back
 * (rows micro*micro_batch ...). Writes the mean loss and the pre-clip gradient norm.
 * Returns ERR_NUMERIC when the loss or the gradient norm is not finite (with nan_policy
 * `skip` the update has then been skipped in-graph; with `stop` the caller must stop). */
jdt_status jdt_step_run(jdt_step *s, int64_t t, double lr, const void *x, const int32_t *y,
                        double *loss, double *grad_norm, jdt_err *e);

/* Mean loss of the forward-only eval graph on one micro-batch (no update). */
jdt_status jdt_step_eval(jdt_step *s, const void *x, const int32_t *y, double *loss, jdt_err *e);

/* Access to the persistent tensors for checkpoints: parameters ("params/<name>") and
 * optimizer state ("opt/m/<name>", "opt/v/<name>" or "opt/buf/<name>"). Returns the count;
 * names, data pointers, shapes through the out-arguments (pointers stay owned by s). */
int jdt_step_n_tensors(const jdt_step *s);
void jdt_step_tensor(const jdt_step *s, int i, const char **name, float **data, jdt_shape *shape);
/* Where tensor i's local block (jdt_step_tensor's shape and data) sits in the whole tensor:
 * the global shape and the block's offset per dim. Returns true on the one rank that owns
 * (writes to checkpoints) this block; blocks replicated over mesh axes have one owner. */
bool jdt_step_tensor_block(const jdt_step *s, int i, jdt_shape *global, int64_t *offset);
/* How tensor i (as jdt_step_tensor) is split over the mesh: its parameter's storage placement. */
const jdt_placement *jdt_step_tensor_placement(const jdt_step *s, int i);
/* Number of parameters: tensors 0 .. n-1 are the parameters, the rest optimizer moments. */
int jdt_step_n_params(const jdt_step *s);
/* This rank's place in the mesh (1 x 1 x 1 for one process). */
const jdt_mesh *jdt_step_mesh(const jdt_step *s);

/* The step's programs: MAIN runs once per micro-batch (forward, backward and, without
 * accumulation, clipping + update); APPLY once per step with accumulation (clipping + update);
 * EVAL the forward-only loss. */
typedef enum {
    JDT_STEP_PROG_MAIN,
    JDT_STEP_PROG_APPLY,
    JDT_STEP_PROG_EVAL,
} jdt_step_prog;
/* The (local, partitioned) graph of a program; NULL when the step has none (APPLY without
 * accumulation). Owned by s. */
const jdt_graph *jdt_step_graph(const jdt_step *s, jdt_step_prog which);
/* Compile (or plan) statistics of a program: arena bytes, kernels, FLOPs; NULL when it does
 * not exist or runs on the interpreter. Owned by s. */
const jdt_compile_stats *jdt_step_prog_stats(const jdt_step *s, jdt_step_prog which);
/* Bytes of this rank's parameters and optimizer state (its blocks). */
int64_t jdt_step_state_bytes(const jdt_step *s);

/* Device backends keep parameters and optimizer state in device memory: jdt_step_sync_host
 * copies them into the host buffers jdt_step_tensor returns (before a checkpoint is written);
 * jdt_step_host_changed says the host buffers were overwritten (a checkpoint was loaded), so
 * the next run uploads them. Both are no-ops on the CPU. */
jdt_status jdt_step_sync_host(jdt_step *s, jdt_err *e);
void jdt_step_host_changed(jdt_step *s);
/* The generated source of the main program ("" for the interpreter). */
const char *jdt_step_source(const jdt_step *s);

/* With run.profile: the time per kind of compiled step (kernels, builtins) of the train
 * programs so far, written into buf (n bytes); returns buf. */
char *jdt_step_profile(const jdt_step *s, char *buf, size_t n);
/* Forgets the times jdt_step_profile would report so far (jdt_program_profile_reset). */
void jdt_step_profile_reset(jdt_step *s);

/* The model (parameter list) and compile stats of the main program. */
const jdt_model *jdt_step_model(const jdt_step *s);
const jdt_compile_stats *jdt_step_stats(const jdt_step *s);
/* Model FLOPs per optimizer step (forward + backward = 3x forward matmul/attention flops,
 * counted from the config, the convention MFU uses). */
double jdt_step_model_flops(const jdt_step *s);

/* The compiler options the runtime section asks for (threads, cache dir, compiler, flags,
 * remat); hooks (collective, trace, profile) are left unset. One place maps config to
 * compiler, for training, eval, inspect and sampling alike. */
void jdt_train_compile_opts(const jdt_config *cfg, jdt_compile_opts *o);

/* A config-level memory estimate of one process's train step (a formula: no graph is built).
 * state: parameters, gradients, optimizer moments, gradient accumulator; act: activations
 * kept for the backward pass of one micro-batch of micro_batch rows (GLOBAL rows: with a mesh,
 * this device's share under the default rules, weights over fsdp x tensor, rows over data x
 * fsdp; NULL mesh = one device). A lower bound: the compiled plan is checked exactly before
 * its arena is allocated. */
typedef struct {
    int64_t n_params;
    double state_bytes, act_bytes, total_bytes;
} jdt_mem_estimate;
void jdt_train_mem_estimate(const jdt_config *cfg, int64_t micro_batch, const jdt_mesh *mesh,
                            jdt_mem_estimate *out);

/* Refuses (ERR_NOMEM, one line with the figures and what to change: a smaller batch or model,
 * remat, more fsdp) a plan whose estimate exceeds the memory available to this process
 * (jdt_mem_available: MemAvailable or the cgroup limit). With runtime.backend cuda only the
 * host's parameters/gradients/optimizer state count (activations are on the GPU, checked by
 * the CUDA backend against the device's free memory). JDT_OK if it fits or the figure is
 * unknown. Microseconds; call it before building anything. */
jdt_status jdt_train_check_memory(const jdt_config *cfg, int64_t micro_batch, const jdt_mesh *mesh,
                                  jdt_err *e);

/* The checkpoint directory of cfg: checkpoint.dir, or <run.out_dir>/<run.name>/ckpt. */
void jdt_train_ckpt_dir(const jdt_config *cfg, char *buf, size_t n_bytes);

/* Whether a command-line path names a checkpoint rather than a YAML config: an existing
 * directory, or an existing file ending in .h5 (`eval CKPT`). */
bool jdt_train_is_ckpt_path(const char *path);

/* The config a checkpoint was trained under, to run it again in another job (`eval CKPT`):
 * ckpt is a step directory, its state.h5, or a run's checkpoint folder (its newest complete
 * checkpoint, named in *resolved, jdt_malloc'd). The stored dist section (the old job's
 * coordinator, ranks and token) is dropped and the mesh becomes data: -1, filled in from this
 * job's process count; overrides and envp then apply as in jdt_config_load. Errors:
 * ERR_NOT_FOUND (naming ckpt), the checkpoint's open errors, ERR_FORMAT (no stored config),
 * ERR_CONFIG (an override, or a stored config this version cannot read); *resolved is NULL. */
jdt_status jdt_train_load_stored_config(const char *ckpt, int n_overrides, char *const *overrides,
                                        char *const *envp, jdt_config *out, char **resolved,
                                        jdt_err *e);

/* The config key (e.g. "model.n_layer") on which the run config cfg and the config stored in
 * a checkpoint (config_text, its metadata's; path names it in errors) describe different
 * networks, with why = "the checkpoint's K is X, this config's Y"; with optimizer true also
 * "optimizer.type" (the optimizer state a resume reads). NULL where they agree, or where the
 * checkpoint stores no config this version can read (its tensors' names and shapes decide). */
const char *jdt_train_ckpt_differs(const jdt_config *cfg, const char *config_text, const char *path,
                                   bool optimizer, char *why, size_t n);

/* Learning rate at 0-based step t: linear warmup to lr over warmup_steps, then constant,
 * cosine or linear decay to lr * min_lr_ratio at decay_steps. */
double jdt_train_lr(const jdt_config *cfg, int64_t t);

/* What this build can run (engine/train/caps.c): returns JDT_OK, or ERR_CONFIG with one line
 * "key: why; what to do" for the first thing cfg asks that is not built (bf16, mesh.fsdp or
 * mesh.tensor > 1 before the partitioner, runtime.backend cuda without a CUDA build, a
 * sharding rule naming a logical axis no model uses). cmd/ calls it once, before any work. */
jdt_status jdt_train_check_capabilities(const jdt_config *cfg, jdt_err *e);

/* Runs the training job described by cfg. dist is NULL for a single process, else the joined
 * job (every rank calls this with the same config; mesh.data must equal the world size: each
 * rank trains on its slice of every global batch, gradients are averaged in-graph, rank 0
 * writes logs, metrics and checkpoints). Returns JDT_OK on completion, JDT_ERR_INTERRUPTED
 * after a clean stop on SIGINT/SIGTERM (a checkpoint was saved), or an error with e naming
 * the step/file/rank. */
jdt_status jdt_train_run(const jdt_config *cfg, jdt_dist *dist, jdt_err *e);

/* Checks, before any process starts or joins, that cfg's mesh fits world_size processes and
 * that the sharding rules split every model tensor evenly (shapes only: nothing is allocated
 * or initialised). ERR_CONFIG with one line naming the mesh, or the tensor, dim and axis. */
jdt_status jdt_train_check_mesh(const jdt_config *cfg, int world_size, jdt_err *e);

/* `jdt-train inspect` (plan.c): plans the train step of rank 0 of cfg's mesh from shapes
 * alone (graph, partition, autodiff, compiler passes and memory plan: no process starts, no
 * parameter or arena buffer is allocated, nothing is initialised or compiled) and writes to f,
 * per device: parameter, optimizer-state, gradient and activation (arena) bytes; every
 * collective of one step with its mesh-axis group, count and bytes; each parameter's
 * sharding; op/kernel/FLOP counts. With compile (CPU backend only) it also generates and
 * compiles the code (compile time, cache hit/miss) without allocating the parameters. A plan
 * for one process on the CPU backend is this machine's and is refused like train refuses it
 * (ERR_NOMEM with the figures) when it cannot fit here; a mesh of several devices plans
 * devices elsewhere and is never refused for this machine's memory. Errors: ERR_CONFIG (mesh,
 * rules; a -1 mesh axis, which only a process count fills in), ERR_COMPILE ... cfg must pass
 * jdt_train_check_capabilities (the caller checks). runtime.backend cuda plans with the CUDA
 * backend's emitter (no GPU needed); with compile it emits the CUDA source, and with cuda_arch
 * (sm_<cuda_arch[i]>, a CUDA build) it compiles that source and the builtin kernels the step
 * launches with NVRTC into the compile cache (runtime.cache_dir), as a run on such a GPU would
 * (jdt_device_open_aot): ERR_UNSUPPORTED without CUDA, ERR_CONFIG for an arch NVRTC lacks.
 * cuda_arch lists n_arch (0..JDT_MAX_CUDA_ARCHS) architectures: the summary is printed once,
 * for the first, and each further one adds its compile line; the first failure stops.
 * source_path: NULL, or (with compile) where the step's main program's generated source goes
 * (C for the CPU, CUDA C for CUDA; each fused kernel under its `group N` comment, the number
 * run.profile's kernel table names), written to a temporary beside it and renamed into place:
 * ERR_IO naming the path when it cannot be written. */
#define JDT_MAX_CUDA_ARCHS 8
jdt_status jdt_train_inspect(const jdt_config *cfg, bool compile, const int *cuda_arch, int n_arch,
                             const char *source_path, FILE *f, jdt_err *e);

/* Forward-only evaluation of the checkpoint at ckpt_path on cfg's val split: writes the mean
 * loss over cfg->run.eval_steps batches. dist NULL: one process; else every rank of the job
 * calls it with the same config and evaluates its share of each batch on the mesh (one
 * distributed evaluation; every rank gets the same loss). */
jdt_status jdt_train_eval(const jdt_config *cfg, jdt_dist *dist, const char *ckpt_path,
                          double *loss, jdt_err *e);

/* Reads parameter p (whole, f32, global shape) from checkpoint ck under "params/<name>" into
 * dst (numel(p) floats); used by sample and export. */
struct jdt_ckpt;
jdt_status jdt_train_read_param(struct jdt_ckpt *ck, const jdt_tensor *p, float *dst, jdt_err *e);

/* What `sample` does when a sequence outgrows model.seq_len (T) tokens (docs/cli.md). */
typedef enum {
    JDT_SAMPLE_CONTEXT_SHIFT,  /* keep the newest T/2 tokens, re-run them as a prefill, go on */
    JDT_SAMPLE_CONTEXT_WINDOW, /* exact sliding window: every token sees the last T tokens */
    JDT_SAMPLE_CONTEXT_STOP,   /* the sequence ends once its context is full */
} jdt_sample_context;

#define JDT_SAMPLE_DEFAULT_BATCH 32

/* Text generation from a checkpoint. */
typedef struct {
    const char *const *prompts; /* (n_prompts) texts to condition on; "" starts from a newline
                                 * (bytes) or <|endoftext|> (BPE) */
    int n_prompts;              /* >= 1; several prompts are decoded as one batch */
    long max_new_tokens;        /* tokens to generate per prompt at most */
    double temperature;         /* 0: greedy (argmax) */
    int top_k;                  /* 0: off */
    double top_p;               /* nucleus sampling; 1: off */
    uint64_t seed;              /* token i of prompt s draws Philox(seed, (s << 32) | 7, i) */
    const char *const *stops;   /* (n_stops) a sequence ends where its generated text first
                                 * contains one of these; the stop text is not printed */
    int n_stops;
    bool ignore_eos;            /* keep going past the tokenizer's <|endoftext|> */
    jdt_sample_context context; /* past model.seq_len tokens */
    bool full_forward;          /* the reference path: the whole forward graph per token, no
                                 * KV cache (for checks and benchmarks) */
    int threads;                /* 0: the checkpoint's runtime.threads (0 there: all cores) */
    int max_batch;              /* sequences decoded together at most (0: the default); more
                                 * prompts wait and take the slot of one that finishes */
} jdt_sample_opts;

typedef struct {
    int n_seqs;
    int batch;               /* sequences decoded together at most */
    int64_t n_prompt_tokens; /* prompt tokens of the first batch (cut to seq_len) */
    double prefill_s;        /* wall time of the first batch's prefill */
    int64_t n_new_tokens;    /* tokens generated, every sequence together */
    double decode_s;         /* wall time from the end of the prefill to the last token (the
                              * prefill of prompts admitted later included) */
    int n_context_resets;    /* re-runs of a sequence's context past seq_len (shift/window) */
    int64_t cache_bytes;     /* KV cache; 0 with full_forward */
} jdt_sample_stats;

/* Loads the checkpoint at ckpt_path (its stored config gives the model and the tokenizer) and
 * generates up to o->max_new_tokens tokens after each prompt: the prompts are prefilled once
 * into a KV cache (engine/train/decode.h), then every step decodes one token of each unfinished
 * sequence; at most o->max_batch sequences at a time (continuous batching: a finished one's
 * slot is given to the next waiting prompt, which is prefilled in the same step). With one prompt, out gets the prompt and the generated text as it is made (text
 * that may begin a stop sequence is held back until it is decided), then a newline; with
 * several, each sample is printed whole in prompt order, headed "==> sample i/n <==".
 * A sequence ends at max_new_tokens, a stop sequence, the tokenizer's <|endoftext|> (unless
 * ignore_eos) or, with context stop, a full context. *stats (may be NULL) gets the token counts
 * and times. Errors name the checkpoint or the prompt: ERR_CONFIG (not a gpt: mlp models are
 * not autoregressive), ERR_USAGE (a prompt token outside the model's vocabulary), checkpoint
 * and tokenizer errors (ERR_IO, ERR_FORMAT, ...), ERR_NOMEM. */
jdt_status jdt_sample_run(const char *ckpt_path, const jdt_sample_opts *o, FILE *out,
                          jdt_sample_stats *stats, jdt_err *e);

#endif /* JDT_TRAIN_H */
