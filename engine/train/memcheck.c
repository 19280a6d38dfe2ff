/*
 * memcheck.c — refuses a training plan that cannot fit in memory, before anything is built or
 * allocated (see train.h jdt_train_mem_*). The estimate comes from the config alone (a
 * formula, microseconds even for 99,999 layers), so a huge config fails at once with the
 * figure and what to change, instead of building a graph for minutes and dying in malloc.
 * The compiler checks its exact planned arena again before allocating it (compile/program.c).
 */
#include "train/train.h"

#include <stdio.h>

/* Floats kept per token per layer for the backward pass of a GPT block, a deliberate LOWER
 * bound (the compiled plan measured ~21 C at mlp_ratio 4): residual stream and two norms (3 C,
 * whole on every tensor rank), q/k/v, attention output and its projection (5 C) and the MLP's
 * pre- and post-activation (2 * F), those split over tensor ranks (tp). Under-counting keeps
 * the check from refusing a plan that fits; the arena check catches the rest. */
static double act_floats_per_token_layer(const jdt_config *c, double tp)
{
    return 3.0 * c->model.n_embd + (5.0 * c->model.n_embd + 2.0 * (double)jdt_config_mlp_dim(c)) / tp;
}

void jdt_train_mem_estimate(const jdt_config *c, int64_t micro_batch, const jdt_mesh *mesh,
                            jdt_mem_estimate *m)
{
    const double f = 4.0; /* f32 params, grads, moments and activations on the CPU path */
    /* a device's share under the default rules: weights over fsdp x tensor, rows over data x
     * fsdp, the blocks' inner dims (heads, mlp) over tensor. Other rules split less, so this
     * stays a lower bound. */
    const double w_split = mesh ? (double)mesh->size[JDT_MESH_FSDP] * mesh->size[JDT_MESH_TENSOR] : 1;
    const double row_split = mesh ? (double)mesh->size[JDT_MESH_DATA] * mesh->size[JDT_MESH_FSDP] : 1;
    const double tp = mesh ? (double)mesh->size[JDT_MESH_TENSOR] : 1;
    double n = (double)jdt_config_param_count(c);
    int moments = c->optimizer.type == JDT_OPTIM_ADAMW ? 2 : (c->optimizer.momentum > 0 ? 1 : 0);
    bool accum = c->data.micro_batch_size < c->data.batch_size;
    m->n_params = (int64_t)n;
    /* params + grads + moments (+ a gradient accumulator with micro-batching) */
    m->state_bytes = n * f * (2.0 + moments + (accum ? 1 : 0)) / w_split;
    m->act_bytes = 0;
    if (c->model.type == JDT_MODEL_GPT) {
        double tokens = (double)micro_batch * c->model.seq_len / row_split;
        double per_layer = act_floats_per_token_layer(c, tp);
        /* remat block: only each block's input is kept, plus one block recomputed at a time;
         * dots: the block's input, q/k/v, the attention's output, its projection and the MLP's
         * pre-activation (the GEMMs' outputs) kept, plus the rest of one block recomputed */
        double dots = c->model.n_embd +
                      (5.0 * c->model.n_embd + (double)jdt_config_mlp_dim(c)) / tp;
        double layers = c->runtime.remat == JDT_REMAT_BLOCK
                            ? (double)c->model.n_layer * c->model.n_embd + per_layer
                        : c->runtime.remat == JDT_REMAT_DOTS
                            ? (double)c->model.n_layer * dots + (per_layer - dots)
                            : (double)c->model.n_layer * per_layer;
        /* logits and their gradient, of one slice of the sequence under runtime.loss_chunks */
        const double slices = c->runtime.loss_chunks > 1 ? c->runtime.loss_chunks : 1;
        m->act_bytes = tokens * f * (layers + 2.0 * c->model.vocab_size / slices);
    } else {
        double widest = c->model.hidden_dim > c->model.in_dim ? c->model.hidden_dim : c->model.in_dim;
        m->act_bytes = (double)micro_batch / row_split * f * 2.0 * widest * (c->model.n_hidden + 1);
    }
    m->total_bytes = m->state_bytes + m->act_bytes;
}

static void fmt_bytes(char *buf, size_t n, double b)
{
    if (b >= 1099511627776.0) snprintf(buf, n, "%.1f TiB", b / 1099511627776.0);
    else if (b >= 1073741824.0) snprintf(buf, n, "%.1f GiB", b / 1073741824.0);
    else snprintf(buf, n, "%.1f MiB", b / 1048576.0);
}

jdt_status jdt_train_check_memory(const jdt_config *c, int64_t micro_batch, const jdt_mesh *mesh,
                                  jdt_err *e)
{
    jdt_mem_estimate m;
    jdt_train_mem_estimate(c, micro_batch, mesh, &m);
    const char *source;
    int64_t avail = jdt_mem_available(&source);
    /* runtime.backend cuda: activations live on the GPU (the CUDA backend checks its planned
     * allocation against the device's free memory); the host keeps the parameters and the
     * optimizer state that the device mirrors */
    const bool gpu = c->runtime.backend == JDT_BACKEND_CUDA;
    const double host_bytes = gpu ? m.state_bytes : m.total_bytes;
    if (avail < 0 || host_bytes <= (double)avail) return JDT_OK;
    char need[32], st[32], act[32], have[32];
    fmt_bytes(need, sizeof need, m.total_bytes);
    fmt_bytes(st, sizeof st, m.state_bytes);
    fmt_bytes(act, sizeof act, m.act_bytes);
    fmt_bytes(have, sizeof have, (double)avail);
    if (gpu)
        return jdt_err_set(e, JDT_ERR_NOMEM,
                           "the host copy of the parameters, gradients and optimizer state needs "
                           "%s (%.3g parameters) but %s is available (%s): use a smaller model "
                           "(model.n_layer, model.n_embd) or more fsdp ranks (mesh.fsdp)",
                           st, (double)m.n_params, have, source);
    const char *advice =
        m.state_bytes > (double)avail
            ? "a smaller model (model.n_layer, model.n_embd) or more fsdp ranks (mesh.fsdp)"
            : (c->runtime.remat == JDT_REMAT_BLOCK
                   ? "a smaller data.micro_batch_size or model.seq_len"
                   : "a smaller data.micro_batch_size or model.seq_len, or runtime.remat: block");
    return jdt_err_set(e, JDT_ERR_NOMEM,
                       "the plan needs at least %s%s (%.3g parameters: %s for parameters, "
                       "gradients and optimizer state; %s of activations per micro-batch of "
                       "%lld) but %s is available (%s): use %s",
                       need, mesh && mesh->world_size > 1 ? " per device" : "",
                       (double)m.n_params, st, act, (long long)micro_batch, have, source, advice);
}
