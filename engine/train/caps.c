/*
 * caps.c — what this build can run. One table of rules, checked once by cmd/ before any work
 * (jdt_train_check_capabilities): a config asking for something not built is refused with one
 * line naming the key and what to do, never accepted and silently ignored. When a feature
 * lands, its row goes. Mesh
 * shapes and rules that cannot divide the model are checked by jdt_train_check_mesh
 * (engine/train/step.c), which needs the world size.
 */
#include "train/train.h"

#include "models/models.h"

#include <stdio.h>
#include <string.h>

/* Returns true when cfg asks for what this build cannot do, with the reason in why. */
typedef bool (*cap_refuses_fn)(const jdt_config *cfg, char *why, size_t n_why);

typedef struct {
    const char *key; /* the config key the message names */
    cap_refuses_fn refuses;
} cap_rule;

/* bf16 compute (GEMMs on bf16-rounded inputs, f32 accumulation) exists on both backends (CPU:
 * oneDNN or rounded SGEMM; CUDA: cuBLASLt bf16 x bf16 -> f32); other compute types do not. */
static bool compute_not_built(const jdt_config *cfg, char *why, size_t n_why)
{
    if (cfg->precision.compute == JDT_DTYPE_F32 || cfg->precision.compute == JDT_DTYPE_BF16)
        return false;
    snprintf(why, n_why, "%s compute is not built (f32 and bf16 are); set precision.compute: bf16",
             jdt_dtype_name(cfg->precision.compute));
    return true;
}

static bool params_not_f32(const jdt_config *cfg, char *why, size_t n_why)
{
    if (cfg->precision.params == JDT_DTYPE_F32) return false;
    snprintf(why, n_why,
             "%s parameters are not built (master weights are f32); set "
             "precision.params: f32",
             jdt_dtype_name(cfg->precision.params));
    return true;
}

static bool backend_not_built(const jdt_config *cfg, char *why, size_t n_why)
{
    switch (cfg->runtime.backend) {
    case JDT_BACKEND_CPU:
        return false;
    case JDT_BACKEND_CUDA:
#ifdef JDT_CUDA
        return false;
#else
        snprintf(why, n_why,
                 "cuda needs a CUDA build of jdt-train (make CUDA=1); this binary "
                 "has the CPU backend only: set runtime.backend: cpu");
        return true;
#endif
    }
    snprintf(why, n_why, "unknown backend %d", (int)cfg->runtime.backend);
    return true;
}

/* A rule whose logical axis no model puts on a dim would silently shard nothing (a typo, or a
 * name from another codebase). Rules naming a mesh axis of size 1 are fine: as in MaxText, one
 * rule list serves every mesh, and a size-1 axis means replicated. Unknown mesh axes are
 * refused by the config parser already. */
static bool rule_axis_unused(const jdt_config *cfg, char *why, size_t n_why)
{
    const char *const *known = jdt_model_axis_names();
    for (int i = 0; i < cfg->sharding.rules.n_rules; i++) {
        const char *name = cfg->sharding.rules.rules[i].logical;
        bool used = false;
        for (int k = 0; known[k] && !used; k++)
            used = strcmp(known[k], name) == 0;
        if (used) continue;
        size_t o = (size_t)snprintf(why, n_why,
                                    "rule %d names logical axis '%s', which no model "
                                    "uses (the models' axes:",
                                    i + 1, name);
        for (int k = 0; known[k] && o < n_why; k++)
            o += (size_t)snprintf(why + o, n_why - o, "%s %s", k ? "," : "", known[k]);
        if (o < n_why) snprintf(why + o, n_why - o, ")");
        return true;
    }
    return false;
}

/* The rules, in the order their messages are checked. Delete a row when its feature lands. */
static const cap_rule CAP_RULES[] = {
    {"precision.compute", compute_not_built}, /* f32 and bf16 only */
    {"precision.params", params_not_f32},     /* f32 master weights by design */
    {"runtime.backend", backend_not_built},   /* cuda: only in a CUDA build */
    {"sharding.rules", rule_axis_unused},
};

jdt_status jdt_train_check_capabilities(const jdt_config *cfg, jdt_err *e)
{
    char why[512];
    for (size_t i = 0; i < JDT_ARRAY_LEN(CAP_RULES); i++)
        if (CAP_RULES[i].refuses(cfg, why, sizeof why))
            return jdt_err_set(e, JDT_ERR_CONFIG, "%s: %s", CAP_RULES[i].key, why);
    return JDT_OK;
}
