/*
 * main.c — the jdt-train command line: a table of subcommands (name, handler, one-line help,
 * usage), shared argument parsing (CONFIG, key.path=value overrides, flags), and the mapping
 * from engine statuses to documented exit codes. A new subcommand is a row in SUBCOMMANDS
 * and a handler; the --nproc launcher lives in launch.c.
 *
 * Exit codes: 0 success, 1 run-time failure, 2 usage or config error, 130/143 when stopped by
 * SIGINT/SIGTERM.
 */
#include "cmd/launch.h"
#include "cmd/plot.h"
#include "config/config.h"
#include "core/core.h"
#include "datasets/datasets.h"
#include "world/world.h"
#include "io/ckpt.h"
#include "io/fetch.h"
#include "train/train.h"
#include "train/hf.h"
#include "runtime/runtime.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

extern char **environ;

enum { EXIT_OK = 0, EXIT_RUNTIME = 1, EXIT_USAGE = 2 };

/* Flags a subcommand accepts (bitmask). */
enum {
    FLAG_LOG_LEVEL = 1 << 0,
    FLAG_PRINT_CONFIG = 1 << 1,
    FLAG_SCHEMA = 1 << 2,
    FLAG_SAMPLE = 1 << 3,  /* --prompt(s) --stop --max-new-tokens/--length --temperature --top-k
                            * --top-p --seed --context --ignore-eos --batch --threads
                            * --no-kv-cache */
    FLAG_CKPT = 1 << 4,    /* --ckpt PATH */
    FLAG_PROFILE = 1 << 5, /* --profile */
    FLAG_EXPORT = 1 << 6,  /* --format NAME, a second positional argument (OUT_DIR) */
    FLAG_RAW = 1 << 7,     /* the handler parses its own arguments (raw_argc/raw_argv) */
};

typedef struct {
    const char *config_path; /* NULL when not given */
    int n_overrides;
    char **overrides; /* (n_overrides), point into argv */
    bool help;
    bool version;
    bool print_config;
    bool schema;
    bool schema_markdown;
    const char *log_level;             /* NULL when not given */
    const char *ckpt;                  /* --ckpt PATH */
    bool no_compile;                   /* inspect --no-compile */
    bool compile;                      /* inspect --compile */
    int cuda_arch[JDT_MAX_CUDA_ARCHS]; /* inspect --cuda-arch sm_NN[,sm_MM...]: NN, MM ... */
    int n_cuda_arch;                   /* how many (0: not given) */
    const char *source;                /* inspect --source FILE */
    bool profile;                      /* train --profile */
    char **prompts;                    /* --prompt TEXT, repeatable (n_prompts) */
    int n_prompts;
    const char *prompts_file; /* --prompts FILE: one prompt per line */
    char **stops;             /* --stop TEXT, repeatable (n_stops) */
    int n_stops;
    double temperature;   /* --temperature (default 0.8) */
    long top_k;           /* --top-k (0 = off) */
    double top_p;         /* --top-p (1 = off) */
    long seed;            /* --seed */
    long length;          /* --max-new-tokens / --length: tokens to generate */
    const char *context;  /* --context shift|window|stop */
    bool ignore_eos;      /* --ignore-eos */
    bool no_kv_cache;     /* --no-kv-cache: the full-forward reference path */
    long threads;         /* sample --threads (0: the checkpoint's runtime.threads) */
    long batch;           /* sample --batch (0: JDT_SAMPLE_DEFAULT_BATCH) */
    const char *format;   /* export --format */
    const char *out_path; /* export OUT_DIR */
    int raw_argc;         /* the arguments after the subcommand (FLAG_RAW) */
    char **raw_argv;
} cli_args;

typedef struct subcommand {
    const char *name;
    int (*run)(const struct subcommand *cmd, cli_args *a);
    const char *summary;
    const char *usage;
    unsigned flags;
    bool needs_config;
} subcommand;

static int cmd_train(const subcommand *cmd, cli_args *a);
static int exit_code(jdt_status st);
static int cmd_inspect(const subcommand *cmd, cli_args *a);
static int cmd_version(const subcommand *cmd, cli_args *a);
static int cmd_prepare(const subcommand *cmd, cli_args *a);
static int cmd_sample(const subcommand *cmd, cli_args *a);
static int cmd_export(const subcommand *cmd, cli_args *a);
static int cmd_eval(const subcommand *cmd, cli_args *a);
static int cmd_help(const subcommand *cmd, cli_args *a);
static int cmd_plot(const subcommand *cmd, cli_args *a)
{
    return jdt_cmd_plot(a->raw_argc, a->raw_argv);
}

static const subcommand SUBCOMMANDS[] = {
    {"train", cmd_train, "train a model described by a YAML config",
     "usage: jdt-train [train] CONFIG [key.path=value ...] [--log-level LEVEL] [--profile]\n"
     "\n"
     "Loads CONFIG (following base_config), applies JDT_<SECTION>_<KEY> environment variables\n"
     "and key.path=value overrides, validates, and trains.\n"
     "\n"
     "options:\n"
     "  --log-level LEVEL   debug|info|warn|error (overrides run.log_level)\n"
     "  --profile           trace run.profile_steps steps (after the first) into\n"
     "                      RUN_DIR/trace.rank<r>.json (Chrome trace format: Perfetto opens it;\n"
     "                      one span per compiled kernel, GEMM, data wait, collective) and log\n"
     "                      the time per kind of kernel (same as run.profile=true)\n"
     "  -h, --help          show this help\n",
     FLAG_LOG_LEVEL | FLAG_PROFILE, true},
    {"inspect", cmd_inspect, "validate a config and summarise it, or print the schema",
     "usage: jdt-train inspect CONFIG [key.path=value ...] [--compile | --no-compile]\n"
     "                         [--cuda-arch sm_NN[,sm_MM...]] [--source FILE] [--print-config]\n"
     "                         [--log-level LEVEL]\n"
     "       jdt-train inspect --schema[=markdown]\n"
     "\n"
     "Resolves and validates CONFIG exactly as train does, then prints a summary: the model,\n"
     "its parameter count, the mesh, data, optimizer and checkpoint settings, and what this\n"
     "build cannot run of it (train and eval refuse such a config with exit 2). Then the plan\n"
     "of rank 0's train step on that mesh, from shapes alone (no process starts, nothing is\n"
     "allocated or compiled): memory per device (parameters, optimizer state, gradients,\n"
     "activations), every collective of one step with its group and bytes, each parameter's\n"
     "sharding, op/kernel/FLOP counts.\n"
     "\n"
     "options:\n"
     "  --compile           also generate and compile the step's code (CPU backend: compile\n"
     "                      time, cache hit/miss; it warms the compile cache)\n"
     "  --cuda-arch sm_NN   runtime.backend cuda: compile the step's kernels and the builtin\n"
     "                      kernels it launches with NVRTC for GPUs of that architecture\n"
     "                      (sm_90: H100/H200; a list such as sm_80,sm_90 compiles for each)\n"
     "                      into the compile cache, here, without a GPU;\n"
     "                      a run on such a GPU with the same runtime.cache_dir then starts\n"
     "                      without compiling (needs a build with make CUDA=1)\n"
     "  --source FILE       with --compile or --cuda-arch: write the step's generated source\n"
     "                      (C, or CUDA C for runtime.backend cuda) to FILE; each fused kernel\n"
     "                      sits under a 'group N' comment, the group run.profile names\n"
     "  --no-compile        print the summary only, without planning the step\n"
     "  --print-config      print the fully resolved config as YAML instead (feeding it back\n"
     "                      gives the same config)\n"
     "  --schema            print every config key with type, default, bounds and doc\n"
     "  --schema=markdown   the same as a Markdown table\n"
     "  --log-level LEVEL   debug|info|warn|error\n"
     "  -h, --help          show this help\n",
     FLAG_LOG_LEVEL | FLAG_PRINT_CONFIG | FLAG_SCHEMA, true},
    {"prepare", cmd_prepare, "turn data.source text into HDF5 token shards",
     "usage: jdt-train prepare CONFIG [key.path=value ...]\n"
     "\n"
     "Reads the text file data.source, encodes it with data.tokenizer (byte, or bpe: the\n"
     "tokenizer at data.tokenizer_path, else one of model.vocab_size ids trained on the text\n"
     "and written as data.train_path/tokenizer.json), splits off the last data.val_fraction\n"
     "as validation data and writes data.n_shards train shards (train_000.h5 ...) and\n"
     "val_000.h5 into the directory data.train_path, with manifest.txt (sizes, sha256,\n"
     "lengths) so the folder can be served over HTTP(S) and trained from by URL.\n",
     FLAG_LOG_LEVEL, true},
    {"sample", cmd_sample, "generate text from a checkpoint",
     "usage: jdt-train sample CKPT [--prompt TEXT ...] [--prompts FILE] [--max-new-tokens N]\n"
     "                             [--stop TEXT ...] [--temperature T] [--top-k K] [--top-p P]\n"
     "                             [--seed S] [--context shift|window|stop] [--ignore-eos]\n"
     "                             [--batch N] [--threads N] [--no-kv-cache]\n"
     "\n"
     "CKPT is a checkpoint directory (runs/NAME/ckpt/step_NNNNNN) or a run's checkpoint folder\n"
     "(the newest complete checkpoint in it is used). The model comes from the config stored\n"
     "in the checkpoint. CKPT may also be a Hugging Face GPT-2, Llama, Mistral, Qwen2 or Qwen3\n"
     "directory (model.safetensors, config.json, tokenizer.json), whose config.json makes the\n"
     "model.\n"
     "Prompts are prefilled into a KV cache once, then each step decodes one\n"
     "token of every unfinished prompt; tokens/s of prefill and decode go to stderr.\n"
     "\n"
     "options:\n"
     "  --prompt TEXT         a prompt; repeat it to sample several as one batch\n"
     "  --prompts FILE        one prompt per line (empty lines skipped), after any --prompt;\n"
     "                        several prompts print as \"==> sample i/n <==\" blocks in order\n"
     "  --max-new-tokens N    tokens to generate per prompt at most (default 200; --length N)\n"
     "  --stop TEXT           end a sample where its generated text contains TEXT (not\n"
     "                        printed); repeatable. <|endoftext|> of a BPE tokenizer, and a\n"
     "                        Hugging Face model's eos_token_id, also end it unless --ignore-eos\n"
     "  --temperature T       0 = greedy (default 0.8)\n"
     "  --top-k K             sample among the K most likely tokens (default 0 = off)\n"
     "  --top-p P             nucleus: the fewest most likely tokens with mass >= P (default 1)\n"
     "  --seed S              the same seed, prompts and flags give the same text (default 1)\n"
     "  --context MODE        past model.seq_len tokens: shift (default: keep the newest half,\n"
     "                        re-run it, go on), window (every token sees exactly the last\n"
     "                        seq_len tokens; slow past seq_len) or stop\n"
     "  --batch N             sequences decoded together at most (default 32); the others\n"
     "                        wait for a finished one's place\n"
     "  --threads N           CPU threads (default: the checkpoint's runtime.threads)\n"
     "  --no-kv-cache         run the whole forward graph per token (the reference path)\n",
     FLAG_SAMPLE, true},
    {"export", cmd_export, "write a checkpoint as a Hugging Face model directory",
     "usage: jdt-train export CKPT --format hf OUT_DIR\n"
     "\n"
     "Writes OUT_DIR/model.safetensors + config.json (transformers GPT2LMHeadModel for a gpt\n"
     "with GPT-2 options, LlamaForCausalLM for rmsnorm + rope + swiglu) and the run's\n"
     "tokenizer.json (BPE runs). CKPT is a checkpoint directory or a run's checkpoint folder\n"
     "(its newest checkpoint). docs/interop.md has the mapping.\n",
     FLAG_EXPORT, true},
    {"eval", cmd_eval, "loss of a checkpoint on the config's val split",
     "usage: jdt-train eval CONFIG [key.path=value ...] [--ckpt PATH]\n"
     "       jdt-train eval CKPT [key.path=value ...]\n"
     "\n"
     "Loads PATH (default: the newest checkpoint in the config's checkpoint directory) and\n"
     "prints the mean loss over run.eval_steps batches of the val split. In the second form\n"
     "CKPT is a checkpoint directory or a run's checkpoint folder (its newest checkpoint), and\n"
     "the config is the one stored in it (overrides apply on top: data.val_path=... evaluates\n"
     "on other data).\n",
     FLAG_LOG_LEVEL | FLAG_CKPT, true},
    {"plot", cmd_plot, "draw loss curves of one or several runs (PNG/SVG)", JDT_PLOT_USAGE,
     FLAG_RAW, false},
    {"version", cmd_version, "print the version and the backends built in",
     "usage: jdt-train version\n", 0, false},
    {"help", cmd_help, "show help for a command", "usage: jdt-train help [COMMAND]\n", 0, false},
};

static const subcommand *find_subcommand(const char *name)
{
    for (size_t i = 0; i < JDT_ARRAY_LEN(SUBCOMMANDS); i++)
        if (strcmp(SUBCOMMANDS[i].name, name) == 0) return &SUBCOMMANDS[i];
    return NULL;
}

static void print_top_help(FILE *f)
{
    fprintf(f,
            "jdt-train %s — train neural networks from a YAML spec (JAX-style: autodiff, SPMD\n"
            "partitioning, JIT-compiled kernels).\n"
            "\n"
            "usage: jdt-train [train] CONFIG [key.path=value ...] [flags]\n"
            "       jdt-train COMMAND [args] [flags]\n"
            "       jdt-train COMMAND --help\n"
            "\n"
            "commands:\n",
            JDT_VERSION_STRING);
    for (size_t i = 0; i < JDT_ARRAY_LEN(SUBCOMMANDS); i++)
        fprintf(f, "  %-10s %s\n", SUBCOMMANDS[i].name, SUBCOMMANDS[i].summary);
    fprintf(f, "\n"
               "flags: -h/--help, --version, --log-level LEVEL, --print-config, --schema\n"
               "launch: --nproc N runs N processes of a job on this host; under SLURM use srun\n"
               "        (docs/launch.md)\n"
               "config: key.path=value overrides and JDT_<SECTION>_<KEY> environment variables\n"
               "        apply after the files; `jdt-train inspect --schema` lists every key.\n"
               "exit codes: 0 success, 1 run-time failure, 2 usage or config error,\n"
               "            130/143 stopped by SIGINT/SIGTERM.\n"
               "docs: README.md, docs/cli.md, docs/config.md\n");
}

static int usage_error(const subcommand *cmd, const char *fmt, const char *arg)
{
    fprintf(stderr, "jdt-train: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (see 'jdt-train %s --help')\n", cmd->name);
    return EXIT_USAGE;
}

/* Parses argv[0..argc) after the subcommand name. Returns EXIT_OK or EXIT_USAGE (printed). */
static int parse_args(const subcommand *cmd, int argc, char **argv, cli_args *a)
{
    bool flags_done = false;
    memset(a, 0, sizeof *a);
    a->temperature = 0.8;
    a->seed = 1;
    a->length = 200;
    a->top_p = 1.0;
    a->raw_argc = argc;
    a->raw_argv = argv;
    /* one block: overrides, then --prompt values, then --stop values (argc + 1 each) */
    a->overrides = jdt_calloc(3 * ((size_t)argc + 1), sizeof *a->overrides);
    a->prompts = a->overrides ? a->overrides + argc + 1 : NULL;
    a->stops = a->overrides ? a->overrides + 2 * (argc + 1) : NULL;
    if (!a->overrides) {
        fprintf(stderr, "jdt-train: out of memory\n");
        return EXIT_RUNTIME;
    }
    for (int i = 0; i < argc && !(cmd->flags & FLAG_RAW); i++) {
        const char *s = argv[i];
        if (!flags_done && s[0] == '-' && s[1] != '\0') {
            if (strcmp(s, "--") == 0) {
                flags_done = true;
            } else if (strcmp(s, "-h") == 0 || strcmp(s, "--help") == 0) {
                a->help = true;
            } else if ((cmd->flags & FLAG_LOG_LEVEL) && strcmp(s, "--log-level") == 0) {
                if (i + 1 >= argc)
                    return usage_error(cmd, "--log-level needs a value (%s)",
                                       "debug|info|warn|error");
                a->log_level = argv[++i];
            } else if ((cmd->flags & FLAG_LOG_LEVEL) && strncmp(s, "--log-level=", 12) == 0) {
                a->log_level = s + 12;
            } else if ((cmd->flags & FLAG_PRINT_CONFIG) && strcmp(s, "--print-config") == 0) {
                a->print_config = true;
            } else if ((cmd->flags & FLAG_SCHEMA) && strcmp(s, "--schema") == 0) {
                a->schema = true;
            } else if ((cmd->flags & FLAG_SCHEMA) && strcmp(s, "--schema=markdown") == 0) {
                a->schema = a->schema_markdown = true;
            } else if ((cmd->flags & FLAG_PROFILE) && strcmp(s, "--profile") == 0) {
                a->profile = true;
            } else if ((cmd->flags & FLAG_PRINT_CONFIG) && strcmp(s, "--no-compile") == 0) {
                a->no_compile = true;
            } else if ((cmd->flags & FLAG_PRINT_CONFIG) && strcmp(s, "--compile") == 0) {
                a->compile = true;
            } else if ((cmd->flags & FLAG_PRINT_CONFIG) && strcmp(s, "--source") == 0) {
                if (i + 1 >= argc) return usage_error(cmd, "--source needs a %s", "file");
                a->source = argv[++i];
            } else if ((cmd->flags & FLAG_PRINT_CONFIG) &&
                       (strcmp(s, "--cuda-arch") == 0 || strncmp(s, "--cuda-arch=", 12) == 0)) {
                const char *v = s[11] == '=' ? s + 12 : i + 1 < argc ? argv[++i] : NULL;
                if (!v)
                    return usage_error(cmd, "--cuda-arch needs %s",
                                       "an architecture such as sm_90");
                /* a comma-separated list: one compile per architecture (a cluster of A100s
                 * and H100s, one cache) */
                a->n_cuda_arch = 0;
                for (const char *p = v;;) {
                    const char *q = strchr(p, ',');
                    size_t len = q ? (size_t)(q - p) : strlen(p);
                    char one[32];
                    if (len >= sizeof one) len = sizeof one - 1;
                    memcpy(one, p, len);
                    one[len] = 0;
                    const char *d = strncmp(one, "sm_", 3) == 0 ? one + 3 : one;
                    char *end = NULL;
                    long x = strtol(d, &end, 10);
                    if (end == d || *end || x < 10 || x > 999)
                        return usage_error(cmd,
                                           "--cuda-arch: %s is not an architecture such as sm_90 "
                                           "(H100/H200) or sm_80 (A100)",
                                           one);
                    if (a->n_cuda_arch == JDT_MAX_CUDA_ARCHS) {
                        char lim[16];
                        snprintf(lim, sizeof lim, "%d", JDT_MAX_CUDA_ARCHS);
                        return usage_error(cmd, "--cuda-arch: more than %s architectures", lim);
                    }
                    for (int k = 0; k < a->n_cuda_arch; k++)
                        if (a->cuda_arch[k] == x)
                            return usage_error(cmd, "--cuda-arch: %s is listed twice", one);
                    a->cuda_arch[a->n_cuda_arch++] = (int)x;
                    if (!q) break;
                    p = q + 1;
                }
                a->compile = true;
            } else if ((cmd->flags & FLAG_CKPT) && strcmp(s, "--ckpt") == 0) {
                if (i + 1 >= argc) return usage_error(cmd, "--ckpt needs a %s", "path");
                a->ckpt = argv[++i];
            } else if ((cmd->flags & FLAG_SAMPLE) && strcmp(s, "--prompt") == 0) {
                if (i + 1 >= argc) return usage_error(cmd, "--prompt needs %s", "text");
                a->prompts[a->n_prompts++] = argv[++i];
            } else if ((cmd->flags & FLAG_SAMPLE) && strcmp(s, "--prompts") == 0) {
                if (i + 1 >= argc) return usage_error(cmd, "--prompts needs a %s", "file");
                if (a->prompts_file) return usage_error(cmd, "--prompts: give one file%s", "");
                a->prompts_file = argv[++i];
            } else if ((cmd->flags & FLAG_SAMPLE) && strcmp(s, "--stop") == 0) {
                if (i + 1 >= argc || !argv[i + 1][0])
                    return usage_error(cmd, "--stop needs a non-empty %s", "text");
                a->stops[a->n_stops++] = argv[++i];
            } else if ((cmd->flags & FLAG_SAMPLE) && strcmp(s, "--context") == 0) {
                if (i + 1 >= argc)
                    return usage_error(cmd, "--context needs a mode (%s)", "shift|window|stop");
                a->context = argv[++i];
                if (strcmp(a->context, "shift") && strcmp(a->context, "window") &&
                    strcmp(a->context, "stop"))
                    return usage_error(cmd, "--context: expected shift|window|stop, got '%s'",
                                       a->context);
            } else if ((cmd->flags & FLAG_SAMPLE) && strcmp(s, "--ignore-eos") == 0) {
                a->ignore_eos = true;
            } else if ((cmd->flags & FLAG_SAMPLE) && strcmp(s, "--no-kv-cache") == 0) {
                a->no_kv_cache = true;
            } else if ((cmd->flags & FLAG_SAMPLE) &&
                       (strcmp(s, "--temperature") == 0 || strcmp(s, "--top-k") == 0 ||
                        strcmp(s, "--top-p") == 0 || strcmp(s, "--seed") == 0 ||
                        strcmp(s, "--length") == 0 || strcmp(s, "--max-new-tokens") == 0 ||
                        strcmp(s, "--threads") == 0 || strcmp(s, "--batch") == 0)) {
                if (i + 1 >= argc) return usage_error(cmd, "%s needs a number", s);
                const char *v = argv[++i];
                char *end = NULL;
                errno = 0;
                if (strcmp(s, "--temperature") == 0) {
                    a->temperature = strtod(v, &end);
                    if (errno || end == v || *end || !(a->temperature >= 0) || a->temperature > 100)
                        return usage_error(
                            cmd, "--temperature: expected a number in [0, 100], got '%s'", v);
                } else if (strcmp(s, "--top-p") == 0) {
                    a->top_p = strtod(v, &end);
                    if (errno || end == v || *end || !(a->top_p > 0) || a->top_p > 1)
                        return usage_error(cmd, "--top-p: expected a number in (0, 1], got '%s'",
                                           v);
                } else {
                    long x = strtol(v, &end, 10);
                    const bool is_batch = strcmp(s, "--batch") == 0;
                    /* a seed is any non-negative integer (run.seed's range): 20241207, time(0) */
                    const long hi = strcmp(s, "--seed") == 0 ? LONG_MAX : 1000000;
                    if (errno || end == v || *end || x < 0 || x > hi) {
                        char msg[96]; /* names the flag: s is one of the literals above */
                        snprintf(msg, sizeof msg, "%s: expected an integer in %s, got '%%s'", s,
                                 is_batch         ? "1..4096"
                                 : hi == LONG_MAX ? "[0, 2^63)"
                                                  : "[0, 1000000]");
                        return usage_error(cmd, msg, v);
                    }
                    if (strcmp(s, "--top-k") == 0)
                        a->top_k = x;
                    else if (strcmp(s, "--seed") == 0)
                        a->seed = x;
                    else if (strcmp(s, "--threads") == 0 && x > 1024)
                        return usage_error(
                            cmd, "--threads: expected 0 (the checkpoint's) to 1024, got '%s'", v);
                    else if (strcmp(s, "--threads") == 0)
                        a->threads = x;
                    else if (strcmp(s, "--batch") == 0 && (x < 1 || x > 4096))
                        return usage_error(cmd, "--batch: expected 1 to 4096 sequences, got '%s'",
                                           v);
                    else if (strcmp(s, "--batch") == 0)
                        a->batch = x;
                    else
                        a->length = x;
                }
            } else if ((cmd->flags & FLAG_EXPORT) && strcmp(s, "--format") == 0) {
                if (i + 1 >= argc) return usage_error(cmd, "--format needs a %s", "name (hf)");
                a->format = argv[++i];
            } else if (strcmp(s, "--version") == 0) {
                a->version = true;
            } else {
                return usage_error(cmd, "unknown option '%s'", s);
            }
        } else if ((cmd->flags & FLAG_EXPORT) && a->config_path && !a->out_path) {
            a->out_path = s;
        } else if (strchr(s, '=') && a->config_path) {
            a->overrides[a->n_overrides++] = argv[i];
        } else if (!a->config_path) {
            if (strchr(s, '=') && access(s, F_OK) != 0)
                return usage_error(cmd, "the config file comes before overrides; got '%s' first",
                                   s);
            a->config_path = s;
        } else {
            return usage_error(cmd, "unexpected argument '%s' (overrides are key.path=value)", s);
        }
    }
    if (a->log_level) {
        jdt_log_level lv;
        if (!jdt_log_parse_level(a->log_level, &lv) || lv == JDT_LOG_QUIET)
            return usage_error(cmd, "--log-level: expected debug|info|warn|error, got '%s'",
                               a->log_level);
    }
    return EXIT_OK;
}

/* Loads the config named in a; prints the error and returns its exit code on failure. */
/* run.log_level, or --log-level where given */
static void set_log_level(const cli_args *a, const jdt_config *c)
{
    jdt_log_level lv = c->run.log_level;
    if (a->log_level) jdt_log_parse_level(a->log_level, &lv);
    jdt_log_set_level(lv);
}

static int load_config(const cli_args *a, jdt_config *c)
{
    jdt_err e;
    jdt_err_clear(&e);
    jdt_status st = jdt_config_load(a->config_path, a->n_overrides, a->overrides, environ, c, &e);
    if (st) {
        fprintf(stderr, "jdt-train: config error: %s\n", e.msg);
        return st == JDT_ERR_CONFIG ? EXIT_USAGE : EXIT_RUNTIME;
    }
    set_log_level(a, c);
    return EXIT_OK;
}

/* "12,345,678" */
static void format_count(char *buf, size_t n_bytes, int64_t n)
{
    char digits[32];
    int nd = snprintf(digits, sizeof digits, "%lld", (long long)n);
    size_t o = 0;
    for (int i = 0; i < nd && o + 2 < n_bytes; i++) {
        if (i > 0 && (nd - i) % 3 == 0 && digits[i - 1] != '-') buf[o++] = ',';
        buf[o++] = digits[i];
    }
    buf[o] = '\0';
}

static void print_summary(const jdt_config *c, FILE *f)
{
    char num[40], num2[40];
    const int64_t n_params = jdt_config_param_count(c);
    format_count(num, sizeof num, n_params);
    fprintf(f, "config      %s\n", c->path);
    if (c->model.type == JDT_MODEL_GPT) {
        double sc[4];
        char rope_sc[96] = "";
        jdt_config_rope_scaling(c, sc);
        if (sc[0] > 0)
            snprintf(rope_sc, sizeof rope_sc, " (theta %g, llama3 scaling x%g from %d)",
                     c->model.rope_theta, sc[0], c->model.rope_original_max_pos);
        else if (c->model.pos == JDT_POS_ROPE)
            snprintf(rope_sc, sizeof rope_sc, " (theta %g)", c->model.rope_theta);
        fprintf(f,
                "model       gpt: L=%d C=%d H=%d (kv heads %d, head dim %d) T=%d V=%d; mlp %lld "
                "%s; %s, "
                "%s positions%s, %s embeddings%s, %s%s, dropout %g\n",
                c->model.n_layer, c->model.n_embd, c->model.n_head, jdt_config_kv_heads(c),
                jdt_config_head_dim(c), c->model.seq_len, c->model.vocab_size,
                (long long)jdt_config_mlp_dim(c),
                jdt_config_choice_name("model.activation", (int)c->model.activation),
                jdt_config_choice_name("model.norm", (int)c->model.norm),
                jdt_config_choice_name("model.pos", (int)c->model.pos), rope_sc,
                c->model.tie_embeddings ? "tied" : "untied",
                c->model.embed_scale ? " (times sqrt(C) on the way in)" : "",
                c->model.bias       ? "bias"
                : c->model.qkv_bias ? "q/k/v bias"
                                    : "no bias",
                c->model.qk_norm ? ", q/k norm" : "", c->model.dropout);
    } else {
        fprintf(f, "model       mlp: %d -> %d x %d hidden (%s) -> %d classes, %s\n",
                c->model.in_dim, c->model.n_hidden, c->model.hidden_dim,
                jdt_config_choice_name("model.activation", (int)c->model.activation),
                c->model.n_classes, c->model.bias ? "bias" : "no bias");
    }
    fprintf(f, "parameters  %s (%.2fM; counted from the model section)\n", num,
            (double)n_params / 1e6);
    fprintf(f, "mesh        data=%d fsdp=%d tensor=%d -> %d device%s\n", c->mesh.data, c->mesh.fsdp,
            c->mesh.tensor, jdt_config_mesh_size(c), jdt_config_mesh_size(c) == 1 ? "" : "s");
    fprintf(f, "sharding   ");
    for (int i = 0; i < c->sharding.rules.n_rules; i++) {
        const jdt_config_rule *r = &c->sharding.rules.rules[i];
        fprintf(f, " %s->", r->logical);
        if (r->n_mesh_axes == 0) fprintf(f, "replicated");
        if (r->n_mesh_axes > 1) fputc('[', f);
        for (int j = 0; j < r->n_mesh_axes; j++)
            fprintf(f, "%s%s", j ? "," : "", jdt_config_mesh_axis_name(r->mesh_axes[j]));
        if (r->n_mesh_axes > 1) fputc(']', f);
    }
    fprintf(f, "%s\n", c->sharding.rules.n_rules ? "" : " (no rules: everything replicated)");
    const char *fmt = jdt_config_choice_name("data.format", (int)c->data.format);
    if (c->data.format == JDT_DATA_SYNTHETIC)
        fprintf(f, "data        synthetic");
    else
        fprintf(f, "data        %s: train %s, val %s", fmt,
                c->data.train_path[0] ? c->data.train_path : "(unset)",
                c->data.val_path[0] ? c->data.val_path : "(unset)");
    int accum = c->data.batch_size / c->data.micro_batch_size;
    if (c->model.type == JDT_MODEL_GPT) {
        format_count(num2, sizeof num2, (int64_t)c->data.batch_size * c->model.seq_len);
        fprintf(f, "; batch %d x %d = %s tokens/step", c->data.batch_size, c->model.seq_len, num2);
    } else {
        fprintf(f, "; batch %d", c->data.batch_size);
    }
    fprintf(f, ", micro-batch %d (%d accumulation step%s)\n", c->data.micro_batch_size, accum,
            accum == 1 ? "" : "s");
    fprintf(f, "optimizer   %s lr %g, warmup %lld, %s",
            jdt_config_choice_name("optimizer.type", (int)c->optimizer.type), c->optimizer.lr,
            (long long)c->optimizer.warmup_steps,
            jdt_config_choice_name("optimizer.schedule", (int)c->optimizer.schedule));
    if (c->optimizer.schedule != JDT_SCHED_CONSTANT)
        fprintf(f, " to %gx by step %lld", c->optimizer.min_lr_ratio,
                (long long)jdt_config_decay_steps(c));
    if (c->optimizer.type == JDT_OPTIM_ADAMW)
        fprintf(f, "; betas %g/%g eps %g", c->optimizer.beta1, c->optimizer.beta2,
                c->optimizer.eps);
    else
        fprintf(f, "; momentum %g%s", c->optimizer.momentum,
                c->optimizer.nesterov ? " nesterov" : "");
    fprintf(f, ", weight decay %g, grad clip %s", c->optimizer.weight_decay,
            c->optimizer.grad_clip > 0 ? "" : "off");
    if (c->optimizer.grad_clip > 0) fprintf(f, "%g", c->optimizer.grad_clip);
    fprintf(f, "\n");
    fprintf(f, "precision   compute %s, activations %s, params %s\n",
            jdt_dtype_name(c->precision.compute), jdt_dtype_name(c->precision.activations),
            jdt_dtype_name(c->precision.params));
    fprintf(f, "run         %s: %lld steps, seed %lld, outputs in %s/%s; log every %lld",
            c->run.name, (long long)c->run.steps, (long long)c->run.seed, c->run.out_dir,
            c->run.name, (long long)c->run.log_every);
    if (c->run.eval_every > 0)
        fprintf(f, ", eval every %lld (%lld batches)\n", (long long)c->run.eval_every,
                (long long)c->run.eval_steps);
    else
        fprintf(f, ", no eval\n");
    if (c->checkpoint.dir[0])
        fprintf(f, "checkpoint  %s", c->checkpoint.dir);
    else
        fprintf(f, "checkpoint  %s/%s/ckpt", c->run.out_dir, c->run.name);
    if (c->checkpoint.every > 0) fprintf(f, ", every %lld steps", (long long)c->checkpoint.every);
    fprintf(f, ", keep %d, resume %s\n", c->checkpoint.keep, c->checkpoint.resume);
    fprintf(f, "runtime     %s, threads %s",
            jdt_config_choice_name("runtime.backend", (int)c->runtime.backend),
            c->runtime.threads ? "" : "auto");
    if (c->runtime.threads) fprintf(f, "%d", c->runtime.threads);
    fprintf(f, ", %s, remat %s", c->runtime.jit ? "jit" : "interpreter",
            jdt_config_choice_name("runtime.remat", (int)c->runtime.remat));
    if (c->runtime.loss_chunks > 1 && c->model.type == JDT_MODEL_GPT)
        fprintf(f, ", loss in %d slices of the sequence", c->runtime.loss_chunks);
    fputc('\n', f);
}

static int cmd_inspect(const subcommand *cmd, cli_args *a)
{
    if (a->schema) {
        if (a->config_path || a->print_config)
            return usage_error(cmd, "--schema takes no config (%s)", "it prints the schema");
        if (a->schema_markdown)
            jdt_config_print_schema_markdown(stdout);
        else
            jdt_config_print_schema(stdout);
        return fflush(stdout) == 0 ? EXIT_OK : EXIT_RUNTIME;
    }
    if (!a->config_path) return usage_error(cmd, "missing CONFIG%s", "");
    if (a->compile && a->no_compile)
        return usage_error(cmd, "--compile (or --cuda-arch) and --no-compile %s",
                           "exclude each other");
    if (a->source && !a->compile)
        return usage_error(cmd, "--source writes the generated code: %s",
                           "give --compile (or --cuda-arch) too");
    jdt_config c;
    int rc = load_config(a, &c);
    if (rc) return rc;
    if (a->print_config) {
        fputs(c.resolved_yaml, stdout);
    } else {
        print_summary(&c, stdout);
        /* a summary of a config this build cannot run still helps (parameter count, mesh);
         * the reason is part of it, and nothing is compiled */
        jdt_err e;
        jdt_err_clear(&e);
        bool runs = jdt_train_check_capabilities(&c, &e) == JDT_OK;
        if (!runs) printf("not runnable by this build: %s\n", e.msg);
        fflush(stdout);
        if (a->n_cuda_arch && (c.runtime.backend != JDT_BACKEND_CUDA || !runs)) {
            /* asked to fill the cache for a GPU: not doing it is an error, not a summary */
            if (c.runtime.backend != JDT_BACKEND_CUDA)
                fprintf(stderr, "jdt-train: error: --cuda-arch compiles for runtime.backend: cuda, "
                                "but this config runs on the cpu (add runtime.backend=cuda)\n");
            else
                fprintf(stderr, "jdt-train: error: --cuda-arch: nothing compiled: %s\n", e.msg);
            jdt_config_free(&c);
            return EXIT_USAGE;
        }
        if (a->source && !runs) { /* asked for the code: none is an error, as above */
            fprintf(stderr, "jdt-train: error: --source %s: nothing compiled: %s\n", a->source,
                    e.msg);
            jdt_config_free(&c);
            return EXIT_USAGE;
        }
        if (!a->no_compile && runs) {
            jdt_err_clear(&e);
            jdt_status st = jdt_train_inspect(&c, a->compile, a->cuda_arch, a->n_cuda_arch,
                                              a->source, stdout, &e);
            if (st != JDT_OK) {
                fprintf(stderr, "jdt-train: error: %s\n", e.msg);
                jdt_config_free(&c);
                return exit_code(st);
            }
        }
    }
    jdt_config_free(&c);
    return fflush(stdout) == 0 ? EXIT_OK : EXIT_RUNTIME;
}

/* Maps an engine status to the documented exit code. */
static int exit_code(jdt_status st)
{
    switch (st) {
    case JDT_OK:
        return EXIT_OK;
    case JDT_ERR_USAGE:
    case JDT_ERR_CONFIG:
        return EXIT_USAGE;
    case JDT_ERR_NOMEM:
    case JDT_ERR_INVALID:
    case JDT_ERR_IO:
    case JDT_ERR_FORMAT:
    case JDT_ERR_NOT_FOUND:
    case JDT_ERR_SHAPE:
    case JDT_ERR_UNSUPPORTED:
    case JDT_ERR_COMPILE:
    case JDT_ERR_NUMERIC:
    case JDT_ERR_NET:
    case JDT_ERR_PROTOCOL:
    case JDT_ERR_AUTH:
    case JDT_ERR_TIMEOUT:
    case JDT_ERR_PEER_LOST:
    case JDT_ERR_INTERRUPTED:
    case JDT_ERR_INTERNAL:
        return EXIT_RUNTIME;
    case JDT_STATUS_COUNT:
        break;
    }
    return EXIT_RUNTIME;
}

/* Refuses (one line, exit 2; cfg freed) a config asking for what this build cannot run, before
 * any work: see jdt_train_check_capabilities. Returns 0 when it can run. */
static int check_capabilities(jdt_config *c)
{
    jdt_err e;
    jdt_err_clear(&e);
    jdt_status st = jdt_train_check_capabilities(c, &e);
    if (st == JDT_OK) return 0;
    fprintf(stderr, "jdt-train: config error: %s\n", e.msg);
    jdt_config_free(c);
    return exit_code(st);
}

/* OMP_PROC_BIND=primary (or master) binds every thread of a team to the place of its primary
 * thread: with places of one CPU, the step's threads then share that CPU (the benchmark GPT's
 * bf16 step at 5025 against 10439 tok/s on 2 CPUs). It is what the user asked for, so it is kept,
 * with a warning that says what it costs. */
static void warn_primary_binding(const jdt_config *c)
{
    if (c->runtime.backend != JDT_BACKEND_CPU || c->runtime.threads < 2) return;
    if (omp_get_proc_bind() != omp_proc_bind_primary) return;
    const int place = omp_get_place_num(), cpus = place >= 0 ? omp_get_place_num_procs(place) : 0;
    if (cpus > 0 && cpus < c->runtime.threads)
        JDT_WARN("OMP_PROC_BIND=%s binds all %d threads to the primary thread's place (%d "
                 "CPU%s): the step runs on %s; unset it or use close or spread",
                 getenv("OMP_PROC_BIND") ? getenv("OMP_PROC_BIND") : "primary", c->runtime.threads,
                 cpus, cpus == 1 ? "" : "s", cpus == 1 ? "one CPU" : "those alone");
}

/* Joins the job (engine/world/world.h: dist.* keys, the --nproc launcher, SLURM, else one
 * process); *out stays NULL for a single process. Resolves runtime.threads 0 (auto) to
 * OMP_NUM_THREADS where it is set, else to this process's share of the host's cores. */
static jdt_status join_job(jdt_config *c, jdt_dist **out, jdt_err *e)
{
    jdt_world w;
    jdt_status st = jdt_world_resolve(c, environ, &w, e);
    if (st) return st;
    const int env_threads = c->runtime.threads <= 0 ? jdt_world_threads_env() : 0;
    if (env_threads > 0)
        JDT_INFO("threads: %d from OMP_NUM_THREADS (runtime.threads overrides it)", env_threads);
    c->runtime.threads = jdt_world_threads(&w, c->runtime.threads);
    warn_primary_binding(c);
    c->dist.local_rank = w.local_rank; /* picks this process's GPU (runtime.backend cuda) */
    return jdt_world_connect(&w, c, out, e);
}

static int cmd_train(const subcommand *cmd, cli_args *a)
{
    if (!a->config_path) return usage_error(cmd, "missing CONFIG%s", "");
    jdt_config c;
    int rc = load_config(a, &c);
    if (rc) return rc;
    if ((rc = check_capabilities(&c))) return rc;
    JDT_INFO("jdt-train %s: %s, %s, %.2fM parameters, %lld steps", JDT_VERSION_STRING, c.path,
             jdt_config_choice_name("model.type", (int)c.model.type),
             (double)jdt_config_param_count(&c) / 1e6, (long long)c.run.steps);
    jdt_err e;
    jdt_err_clear(&e);
    if (a->profile) c.run.profile = true;
    jdt_dist *dist = NULL;
    jdt_status st = join_job(&c, &dist, &e);
    if (st == JDT_OK) st = jdt_train_run(&c, dist, &e);
    if (st != JDT_OK && dist) jdt_dist_abort(dist, e.msg); /* tell the others before leaving */
    jdt_dist_free(dist);
    jdt_config_free(&c);
    if (st == JDT_ERR_INTERRUPTED) {
        fprintf(stderr, "jdt-train: %s\n", e.msg);
        return strstr(e.msg, "SIGINT") ? 130 : 143;
    }
    if (st != JDT_OK) fprintf(stderr, "jdt-train: error: %s\n", e.msg);
    return exit_code(st);
}

/* Whether prepare can write shards into directory path: local, not a .h5 file name. */
static bool shard_dir_ok(const char *path)
{
    size_t n = strlen(path);
    return n > 0 && !jdt_fetch_is_url(path) && !(n > 3 && strcmp(path + n - 3, ".h5") == 0);
}

static int cmd_prepare(const subcommand *cmd, cli_args *a)
{
    if (!a->config_path) return usage_error(cmd, "missing CONFIG%s", "");
    jdt_config c;
    int rc = load_config(a, &c);
    if (rc) return rc;
    jdt_err e;
    jdt_err_clear(&e);
    jdt_status st = JDT_OK;
    bool shadowed = false; /* data.val_path is another dataset's directory */
    const char *val_dir = jdt_prep_val_dir(c.data.train_path, c.data.val_path, &shadowed);
    if (c.data.format != JDT_DATA_TOKENS) {
        st = jdt_err_set(&e, JDT_ERR_CONFIG, "data.format: prepare makes token data, got '%s'",
                         jdt_config_choice_name("data.format", (int)c.data.format));
    } else if (!c.data.source[0]) {
        st = jdt_err_set(&e, JDT_ERR_CONFIG, "data.source: the text file to prepare is not set");
    } else if (jdt_fetch_is_url(c.data.train_path)) {
        st = jdt_err_set(&e, JDT_ERR_CONFIG,
                         "data.train_path: prepare writes local shards, not to '%s'; prepare "
                         "into a folder, serve it over HTTP(S) and train from its URL",
                         c.data.train_path);
    } else if (!shard_dir_ok(c.data.train_path)) {
        st = jdt_err_set(&e, JDT_ERR_CONFIG,
                         "data.train_path: prepare writes a directory of shards; got '%s'",
                         c.data.train_path);
    } else if (val_dir && !shard_dir_ok(val_dir)) {
        st = jdt_err_set(&e, JDT_ERR_CONFIG,
                         "data.val_path: prepare writes the val shard into a local directory "
                         "(data.train_path's, or another); got '%s'",
                         c.data.val_path);
    } else {
        if (shadowed && c.data.val_fraction > 0)
            JDT_WARN("data.val_path %s holds another dataset's train shards: the val split goes "
                     "beside the train shards in %s (point data.val_path there to evaluate on "
                     "it)",
                     c.data.val_path, c.data.train_path);
        jdt_prep_text_opts o;
        memset(&o, 0, sizeof o);
        o.text_path = c.data.source;
        o.out_dir = c.data.train_path;
        o.val_dir = val_dir; /* where the run will read it (jdt_prep_val_dir) */
        o.val_fraction = c.data.val_fraction;
        o.n_shards = c.data.n_shards;
        o.tokenizer = c.data.tokenizer == JDT_TOKENIZER_BPE ? JDT_PREP_TOK_BPE : JDT_PREP_TOK_BYTE;
        o.tokenizer_path = c.data.tokenizer_path;
        o.vocab_size = c.model.vocab_size;
        jdt_prep_result r;
        st = jdt_prep_text(&o, &r, &e);
        /* manifest.txt: sizes, sha256 and lengths, so the folder can be served over HTTP(S)
         * and trained from as it streams in (docs/data.md "Remote data") */
        if (st == JDT_OK) st = jdt_fetch_write_manifest(c.data.train_path, &e);
        if (st == JDT_OK && val_dir && r.n_val_files > 0)
            st = jdt_fetch_write_manifest(val_dir, &e);
        if (st == JDT_OK)
            JDT_INFO("prepared %s -> %s: %lld train tokens in %d file(s), %lld val tokens%s%s",
                     c.data.source, c.data.train_path, (long long)r.n_train_tokens, r.n_train_files,
                     (long long)r.n_val_tokens, val_dir && r.n_val_files ? " in " : "",
                     val_dir && r.n_val_files ? val_dir : "");
    }
    if (st != JDT_OK)
        fprintf(stderr, "jdt-train: %s: %s\n", st == JDT_ERR_CONFIG ? "config error" : "error",
                e.msg);
    jdt_config_free(&c);
    return exit_code(st);
}

/* `eval CKPT`: a checkpoint (a step directory, its state.h5, or a run's checkpoint folder)
 * where a CONFIG would be: its stored config (jdt_train_load_stored_config), the command
 * line's overrides and JDT_* variables on top; *ckpt is the checkpoint (jdt_malloc'd). Returns
 * an exit code, EXIT_OK with *c loaded. */
static int load_stored_config(const cli_args *a, jdt_config *c, char **ckpt)
{
    jdt_err e;
    jdt_err_clear(&e);
    jdt_status st = jdt_train_load_stored_config(a->config_path, a->n_overrides, a->overrides,
                                                 environ, c, ckpt, &e);
    if (st != JDT_OK) {
        fprintf(stderr, "jdt-train: %s: %s\n", st == JDT_ERR_CONFIG ? "config error" : "error",
                e.msg);
        return exit_code(st);
    }
    set_log_level(a, c);
    return EXIT_OK;
}

static int cmd_eval(const subcommand *cmd, cli_args *a)
{
    if (!a->config_path) return usage_error(cmd, "missing CONFIG or CKPT%s", "");
    const bool from_ckpt = jdt_train_is_ckpt_path(a->config_path);
    if (from_ckpt && a->ckpt)
        return usage_error(cmd, "--ckpt with a checkpoint in place of CONFIG ('%s'): give one",
                           a->config_path);
    jdt_config c;
    char *stored = NULL;
    int rc = from_ckpt ? load_stored_config(a, &c, &stored) : load_config(a, &c);
    if (rc) return rc;
    if ((rc = check_capabilities(&c))) {
        jdt_free(stored);
        return rc;
    }
    jdt_err e;
    jdt_err_clear(&e);
    char *path = NULL, dir[1100];
    jdt_train_ckpt_dir(&c, dir, sizeof dir);
    jdt_status st = jdt_ckpt_resolve(stored ? stored : a->ckpt ? a->ckpt : "auto", dir, &path, &e);
    jdt_free(stored);
    if (st == JDT_OK && !path) st = jdt_err_set(&e, JDT_ERR_NOT_FOUND, "no checkpoint in %s", dir);
    double loss = NAN;
    jdt_dist *dist = NULL; /* under --nproc / SLURM: one distributed evaluation on the mesh */
    if (st == JDT_OK) st = join_job(&c, &dist, &e);
    if (st == JDT_OK) st = jdt_train_eval(&c, dist, path, &loss, &e);
    if (st != JDT_OK && dist) jdt_dist_abort(dist, e.msg);
    const bool main_rank = !dist || jdt_dist_rank(dist) == 0;
    if (st == JDT_OK && main_rank)
        printf("val loss %.4f (%lld batches, %s)\n", loss, (long long)c.run.eval_steps, path);
    else if (st != JDT_OK)
        fprintf(stderr, "jdt-train: error: %s\n", e.msg);
    jdt_dist_free(dist);
    jdt_free(path);
    jdt_config_free(&c);
    return exit_code(st);
}

/* The largest --prompts file read: far more text than any batch of prompts, small enough that
 * a wrong path (a log, a dataset) is refused before it is read into memory. */
#define PROMPTS_MAX_BYTES ((size_t)64 << 20)

/* Reads --prompts FILE into *text (owned) and appends its non-empty lines to list (room for
 * *n + lines). Only a regular file or a pipe is read (`--prompts <(gen)`): a device such as
 * /dev/zero, a socket or a directory is refused, and so is more than PROMPTS_MAX_BYTES, so a
 * bad path never hangs or grows memory without bound. The open does not block (a FIFO with
 * no writer reads as empty). Returns EXIT_OK or EXIT_USAGE (printed). */
static int read_prompts_file(const subcommand *cmd, const char *path, char **text, char ***list,
                             int *n)
{
    char *buf = NULL;
    size_t len = 0;
    int err_no = 0;
    jdt_status st = jdt_read_file(path, true, PROMPTS_MAX_BYTES, &buf, &len, &err_no);
    if (st == JDT_ERR_NOMEM) {
        fprintf(stderr, "jdt-train: out of memory\n");
        return EXIT_RUNTIME;
    }
    if (st != JDT_OK && err_no == EFBIG && len > 0)
        fprintf(stderr, "jdt-train: --prompts: '%s' is %.1f MiB, more than the %zu MiB limit\n",
                path, (double)len / (1 << 20), PROMPTS_MAX_BYTES >> 20);
    else if (st != JDT_OK && err_no == EFBIG)
        fprintf(stderr, "jdt-train: --prompts: '%s' holds more than the %zu MiB limit\n", path,
                PROMPTS_MAX_BYTES >> 20);
    else if (st != JDT_OK && err_no == EINVAL)
        fprintf(stderr,
                "jdt-train: --prompts: cannot read '%s': not a regular file (a device or "
                "socket)\n",
                path);
    else if (st != JDT_OK)
        fprintf(stderr, "jdt-train: --prompts: cannot read '%s': %s (see 'jdt-train %s --help')\n",
                path, strerror(err_no), cmd->name);
    if (st != JDT_OK) return EXIT_USAGE;
    size_t n_lines = 1;
    for (size_t k = 0; k < len; k++)
        n_lines += buf[k] == '\n';
    char **l = jdt_calloc((size_t)*n + n_lines, sizeof *l);
    if (!l) {
        jdt_free(buf);
        fprintf(stderr, "jdt-train: out of memory\n");
        return EXIT_RUNTIME;
    }
    memcpy(l, *list, (size_t)*n * sizeof *l);
    const int before = *n;
    for (char *line = buf; line && line < buf + len;) {
        char *nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        size_t ll = strlen(line);
        if (ll && line[ll - 1] == '\r') line[--ll] = '\0';
        if (ll) l[(*n)++] = line;
        line = nl ? nl + 1 : NULL;
    }
    if (*n == before) {
        jdt_free(buf);
        jdt_free(l);
        fprintf(stderr, "jdt-train: --prompts: '%s' holds no prompt (one per line)\n", path);
        return EXIT_USAGE;
    }
    *text = buf;
    *list = l;
    return EXIT_OK;
}

static int cmd_sample(const subcommand *cmd, cli_args *a)
{
    if (!a->config_path) return usage_error(cmd, "missing CKPT%s", "");
    if (a->n_overrides) return usage_error(cmd, "unexpected argument '%s'", a->overrides[0]);
    jdt_err e;
    jdt_err_clear(&e);
    char *path = NULL, *file_text = NULL;
    char *empty[1] = {""};
    char **prompts = a->n_prompts ? a->prompts : empty;
    int n_prompts = a->n_prompts ? a->n_prompts : 1;
    if (a->prompts_file) {
        n_prompts = a->n_prompts;
        int rc = read_prompts_file(cmd, a->prompts_file, &file_text, &prompts, &n_prompts);
        if (rc) return rc;
    }
    /* a run's checkpoint folder means its newest checkpoint; anything else is one checkpoint */
    jdt_status st = JDT_OK;
    if (jdt_ckpt_find_latest(a->config_path, &path, NULL, NULL) != JDT_OK) {
        path = jdt_strdup(a->config_path);
        if (!path) st = jdt_err_set(&e, JDT_ERR_NOMEM, "out of memory");
    }
    jdt_sample_stats ss;
    if (st == JDT_OK) {
        jdt_sample_opts o = {
            .prompts = (const char *const *)prompts,
            .n_prompts = n_prompts,
            .max_new_tokens = a->length,
            .temperature = a->temperature,
            .top_k = (int)a->top_k,
            .top_p = a->top_p,
            .seed = (uint64_t)a->seed,
            .stops = (const char *const *)a->stops,
            .n_stops = a->n_stops,
            .ignore_eos = a->ignore_eos,
            .full_forward = a->no_kv_cache,
            .threads = (int)a->threads,
            .max_batch = (int)a->batch,
            .context = !a->context || strcmp(a->context, "shift") == 0 ? JDT_SAMPLE_CONTEXT_SHIFT
                       : strcmp(a->context, "window") == 0             ? JDT_SAMPLE_CONTEXT_WINDOW
                                                                       : JDT_SAMPLE_CONTEXT_STOP};
        st = jdt_sample_run(path, &o, stdout, &ss, &e);
    }
    if (st == JDT_OK) {
        const double ms_p = 1e3 * ss.prefill_s, ms_d = 1e3 * ss.decode_s;
        fprintf(stderr,
                "sample: prefill %lld tokens in %.1f ms (%.0f tokens/s); decode %lld tokens in "
                "%.1f ms (%.0f tokens/s); %d sequence%s",
                (long long)ss.n_prompt_tokens, ms_p,
                ss.prefill_s > 0 ? (double)ss.n_prompt_tokens / ss.prefill_s : 0.0,
                (long long)ss.n_new_tokens, ms_d,
                ss.decode_s > 0 ? (double)ss.n_new_tokens / ss.decode_s : 0.0, ss.n_seqs,
                ss.n_seqs == 1 ? "" : "s");
        if (ss.batch < ss.n_seqs) fprintf(stderr, " (%d at a time)", ss.batch);
        fprintf(stderr, ", ");
        if (a->no_kv_cache)
            fprintf(stderr, "full forward per token (no KV cache)\n");
        else
            fprintf(stderr, "KV cache %.1f %s, %d context re-run%s\n",
                    (double)ss.cache_bytes / (ss.cache_bytes < (1 << 20) ? 1 << 10 : 1 << 20),
                    ss.cache_bytes < (1 << 20) ? "KiB" : "MiB", ss.n_context_resets,
                    ss.n_context_resets == 1 ? "" : "s");
    } else {
        fprintf(stderr, "jdt-train: error: %s\n", e.msg);
    }
    if (prompts != a->prompts && prompts != empty) jdt_free(prompts);
    jdt_free(file_text);
    jdt_free(path);
    return exit_code(st);
}

static int cmd_export(const subcommand *cmd, cli_args *a)
{
    if (!a->config_path) return usage_error(cmd, "missing CKPT%s", "");
    if (!a->format) return usage_error(cmd, "missing --format (only %s is known)", "hf");
    if (strcmp(a->format, "hf") != 0)
        return usage_error(cmd, "--format: only hf is known, got '%s'", a->format);
    if (!a->out_path) return usage_error(cmd, "missing OUT_DIR%s", "");
    if (a->n_overrides) return usage_error(cmd, "unexpected argument '%s'", a->overrides[0]);
    jdt_err e;
    jdt_err_clear(&e);
    char *path = NULL;
    jdt_status st = JDT_OK;
    if (jdt_ckpt_find_latest(a->config_path, &path, NULL, NULL) != JDT_OK) {
        path = jdt_strdup(a->config_path);
        if (!path) st = jdt_err_set(&e, JDT_ERR_NOMEM, "out of memory");
    }
    const char *arch = NULL;
    if (st == JDT_OK) st = jdt_hf_export(path, a->out_path, &arch, &e);
    if (st == JDT_OK)
        printf("exported %s -> %s (%s)\n", path, a->out_path, arch);
    else
        fprintf(stderr, "jdt-train: error: %s\n", e.msg);
    jdt_free(path);
    return exit_code(st);
}

static int cmd_version(const subcommand *cmd, cli_args *a)
{
    if (a->config_path) return usage_error(cmd, "unexpected argument '%s'", a->config_path);
    printf("jdt-train %s\n", JDT_VERSION_STRING);
#ifdef JDT_CUDA
    printf("backends: cpu cuda\n");
#else
    printf("backends: cpu\n");
#endif
    printf("cpu: OpenBLAS %s kernels; %s; %s\n", jdt_rt_blas_core(), jdt_rt_sgemm_describe(),
           jdt_rt_bf16_describe());
    return EXIT_OK;
}

static int cmd_help(const subcommand *cmd, cli_args *a)
{
    if (!a->config_path) {
        print_top_help(stdout);
        return EXIT_OK;
    }
    const subcommand *target = find_subcommand(a->config_path);
    if (!target) return usage_error(cmd, "unknown command '%s'", a->config_path);
    fputs(target->usage, stdout);
    return EXIT_OK;
}

/* Two libraries read settings from the environment once, when they are loaded, before main;
 * unless the user set them, the process re-executes itself once with them set:
 * - libgomp (the OpenMP runtime of the generated kernels and of OpenBLAS), its wait policy. Its
 *   default spins up to ~3 ms in every barrier and between regions; on a shared machine a
 *   spinning thread takes the core a descheduled peer needs, and a training step of a few
 *   hundred small parallel regions then runs 5-10x slower with 2 threads than with 1 (issue 14;
 *   docs/perf.md, Busy machines). Unless OMP_WAIT_POLICY or GOMP_SPINCOUNT is set (even to
 *   "active"): GOMP_SPINCOUNT=3000, idle threads spin about 0.2 ms (3000 pauses) and then
 *   sleep (futex) until the next region. Sleeping at once (OMP_WAIT_POLICY=passive, until
 *   session 46) paid a wake-up on each of the step's hundreds of regions: the benchmark's bf16
 *   step ran 7% slower on a quiet machine, and on a busy one no faster than with the short spin
 *   (docs/perf.md, session 46; scripts/bench/busy.sh).
 * - OpenBLAS, its kernels (OPENBLAS_CORETYPE): where it fell back to pre-AVX2 kernels on a CPU
 *   it does not know but that has AVX2 (jdt_rt_blas_core_fix), the AVX2 or AVX-512 ones.
 * With OMP_PROC_BIND or OMP_PLACES set, libgomp has bound this thread to its first place already
 * and the new image would inherit that one place as the process's mask: the mask is widened
 * to every place first (jdt_cpus_allowed), so the new image's libgomp builds the same places.
 * If the re-exec fails, it runs on as it is. The binary is re-run by its real path, not
 * /proc/self/exe, so the process keeps its name (ps, pgrep, top show jdt-train, not "exe"). */
static void ensure_runtime_env(char **argv)
{
    const bool wait = !getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT");
    const char *core = getenv("OPENBLAS_CORETYPE") ? NULL : jdt_rt_blas_core_fix();
    if (!wait && !core) return;
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0 || (size_t)n >= sizeof self - 1) return;
    self[n] = '\0';
    if (wait && setenv("GOMP_SPINCOUNT", "3000", 1) != 0) return;
    if (core && setenv("OPENBLAS_CORETYPE", core, 1) != 0) return;
    cpu_set_t cpus, bound;
    const bool widen = jdt_cpus_allowed(&cpus) > 0 &&
                       sched_getaffinity(0, sizeof bound, &bound) == 0 && !CPU_EQUAL(&cpus, &bound);
    if (widen) sched_setaffinity(0, sizeof cpus, &cpus);
    execv(self, argv);
    if (widen) sched_setaffinity(0, sizeof bound, &bound);
    if (wait) unsetenv("GOMP_SPINCOUNT"); /* the exec failed: run on as we are */
    if (core) unsetenv("OPENBLAS_CORETYPE");
}

/* The main thread's stack: the generated kernels keep a reduction's partial sums (up to 128
 * KiB, engine/backend/cpu/emit.c PART_STACK_BYTES) and their tiles on it, and OpenBLAS and
 * oneDNN add their own frames; under a soft `ulimit -Ss 128` the benchmark GPT's first step died
 * of a segmentation fault. A soft limit under 8 MiB (Linux's usual default) is raised towards it
 * before anything runs and before the re-exec, whose image (and glibc's default thread stack)
 * then starts with it. Returns the limit in bytes (RLIM_INFINITY: none). */
static rlim_t ensure_stack(void)
{
    const rlim_t want = (rlim_t)8 << 20;
    struct rlimit rl;
    if (getrlimit(RLIMIT_STACK, &rl) != 0) return RLIM_INFINITY;
    if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= want) return rl.rlim_cur;
    const rlim_t to = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= want ? want : rl.rlim_max;
    if (to > rl.rlim_cur) {
        rl.rlim_cur = to;
        if (setrlimit(RLIMIT_STACK, &rl) != 0) getrlimit(RLIMIT_STACK, &rl);
    }
    return rl.rlim_cur;
}

int main(int argc, char **argv)
{
    const rlim_t stack = ensure_stack();
    ensure_runtime_env(argv);
    if (stack != RLIM_INFINITY && stack < ((rlim_t)1 << 20)) /* a hard limit forbids more */
        fprintf(stderr,
                "jdt-train: warning: the stack limit is %llu KiB and its hard limit allows no "
                "more; the kernels may need more than that (ulimit -s 8192)\n",
                (unsigned long long)(stack >> 10));
    if (argc < 2) {
        print_top_help(stderr);
        return EXIT_USAGE;
    }
    /* the launcher takes SIGINT/SIGTERM/SIGHUP through its signalfd, dist-check with a handler
     * on its main thread; neither runs kernels, and the launcher's ranks run main again */
    if (jdt_launch_requested(argc, argv)) return jdt_launch_main(argc, argv);
    if (strcmp(argv[1], "dist-check") == 0) return jdt_launch_dist_check(argc - 2, argv + 2);
    /* Every other command: SIGINT and SIGTERM blocked here, before any thread exists (nothing
     * above starts one; ensure_runtime_env's exec must come first, or the new image would take
     * the block for the mask it started with), so that OpenMP's, OpenBLAS's and oneDNN's
     * workers inherit the block and no handler ever interrupts a kernel; the jdt-signals
     * thread takes them. `train` stops cleanly on them (engine/train/loop.c); every other
     * command, and train before its loop starts, ends by the signal as it would unblocked. */
    jdt_err se;
    jdt_err_clear(&se);
    if (jdt_signals_init(&se) != JDT_OK) fprintf(stderr, "jdt-train: warning: %s\n", se.msg);
    const char *first = argv[1];
    if (strcmp(first, "-h") == 0 || strcmp(first, "--help") == 0) {
        print_top_help(stdout);
        return EXIT_OK;
    }
    if (strcmp(first, "--version") == 0) {
        printf("jdt-train %s\n", JDT_VERSION_STRING);
        return EXIT_OK;
    }
    const subcommand *cmd = find_subcommand(first);
    int arg0 = 2;
    if (!cmd) {
        /* `jdt-train CONFIG ...` means train; a bare word that is no file is a mistyped command */
        if (first[0] != '-' && !strchr(first, '.') && !strchr(first, '/') && !strchr(first, '=') &&
            access(first, F_OK) != 0) {
            fprintf(stderr, "jdt-train: unknown command '%s' (commands:", first);
            for (size_t i = 0; i < JDT_ARRAY_LEN(SUBCOMMANDS); i++)
                fprintf(stderr, " %s", SUBCOMMANDS[i].name);
            fprintf(stderr, "; or give a CONFIG file to train)\n");
            return EXIT_USAGE;
        }
        cmd = find_subcommand("train");
        arg0 = 1;
    }
    cli_args a;
    int rc = parse_args(cmd, argc - arg0, argv + arg0, &a);
    if (rc == EXIT_OK) {
        if (a.help) {
            fputs(cmd->usage, stdout);
        } else if (a.version) {
            printf("jdt-train %s\n", JDT_VERSION_STRING);
        } else {
            rc = cmd->run(cmd, &a);
        }
    }
    jdt_free(a.overrides);
    return rc;
}
