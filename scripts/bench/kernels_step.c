/*
 * kernels_step.c — a whole train step through the compiler: an L-layer pre-norm transformer
 * (B=4, T=64, C=128, H=4, V=512; layernorm, attention, GELU MLP, tied head, cross-entropy),
 * autodiff backward and Adam updates in one graph. Prints the compile summary (ops before/after
 * the passes, kernels, donated updates, arena, FLOPs, compile and cc time, cache) and the time
 * and loss of a few steps, then the per-step-kind profile. Parameters get a fixed pattern, moments
 * start at zero.
 *
 *   make bench-build && build/bench/kernels_step [layers=12] [threads=1]
 */
#include "compile/compile.h"
#include "graph/builder.h"
#include "autodiff/autodiff.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv)
{
    int L = argc > 1 ? (int)strtol(argv[1], NULL, 10) : 12;
    int threads = argc > 2 ? (int)strtol(argv[2], NULL, 10) : 1;
    if (L < 1 || L > 30) L = 12;
    enum { B = 4, T = 64, C = 128, H = 4, D = 32, V = 512 };
    jdt_graph *g = jdt_graph_new();
    jdt_tensor *tok = jdt_graph_input(g, "tok", JDT_DTYPE_I32, 2, (int64_t[]){B, T}, NULL);
    jdt_tensor *tgt = jdt_graph_input(g, "tgt", JDT_DTYPE_I32, 1, (int64_t[]){B * T}, NULL);
    jdt_tensor *params[256];
    int np = 0;
    char nm[64];
    jdt_tensor *wte = jdt_graph_param(g, "wte", JDT_DTYPE_F32, 2, (int64_t[]){V, C}, NULL);
    params[np++] = wte;
    int64_t nc[2] = {B * T, C}, bthd[4] = {B, T, H, D};
    jdt_tensor *x = jdt_graph_reshape(g, jdt_graph_gather(g, wte, tok), 2, nc);
    for (int l = 0; l < L; l++) {
        jdt_tensor *w[6];
        int64_t sh[6][2] = {{C, C}, {C, C}, {C, C}, {C, C}, {C, 4 * C}, {4 * C, C}};
        for (int i = 0; i < 6; i++) {
            snprintf(nm, sizeof nm, "h%d.w%d", l, i);
            w[i] = jdt_graph_param(g, nm, JDT_DTYPE_F32, 2, sh[i], NULL);
            params[np++] = w[i];
        }
        snprintf(nm, sizeof nm, "h%d.b", l);
        jdt_tensor *bb = jdt_graph_param(g, nm, JDT_DTYPE_F32, 1, (int64_t[]){4 * C}, NULL);
        params[np++] = bb;
        jdt_tensor *xn = jdt_graph_normalize(g, x, 1e-5);
        jdt_tensor *qkv[3];
        for (int i = 0; i < 3; i++)
            qkv[i] = jdt_graph_transpose(
                g, jdt_graph_reshape(g, jdt_graph_matmul(g, xn, w[i], false, false), 4, bthd),
                (int[]){0, 2, 1, 3});
        jdt_tensor *a = jdt_graph_attention(g, qkv[0], qkv[1], qkv[2], 0.17);
        a = jdt_graph_reshape(g, jdt_graph_transpose(g, a, (int[]){0, 2, 1, 3}), 2, nc);
        x = jdt_graph_add(g, x, jdt_graph_matmul(g, a, w[3], false, false));
        jdt_tensor *m = jdt_graph_gelu(
            g,
            jdt_graph_add_bcast(
                g, jdt_graph_matmul(g, jdt_graph_normalize(g, x, 1e-5), w[4], false, false), bb));
        x = jdt_graph_add(g, x, jdt_graph_matmul(g, m, w[5], false, false));
    }
    jdt_tensor *logits = jdt_graph_matmul(g, jdt_graph_normalize(g, x, 1e-5), wte, false, true);
    jdt_tensor *loss = jdt_graph_reduce_mean(g, jdt_graph_softmax_xent(g, logits, tgt), 1u, false);
    jdt_tensor *grads[256];
    jdt_err e;
    if (jdt_autodiff_grad(g, loss, np, params, grads, &e)) {
        printf("ad: %s\n", e.msg);
        return 1;
    }
    jdt_graph_add_output(g, loss);
    for (int i = 0; i < np; i++) {
        snprintf(nm, sizeof nm, "m%d", i);
        jdt_tensor *mi = jdt_graph_state(g, nm, JDT_DTYPE_F32, params[i]->shape.ndim,
                                         params[i]->shape.dims, NULL);
        snprintf(nm, sizeof nm, "v%d", i);
        jdt_tensor *vi = jdt_graph_state(g, nm, JDT_DTYPE_F32, params[i]->shape.ndim,
                                         params[i]->shape.dims, NULL);
        jdt_tensor *mn = jdt_graph_add(g, jdt_graph_mul_scalar(g, mi, 0.9),
                                       jdt_graph_mul_scalar(g, grads[i], 0.1));
        jdt_tensor *vn =
            jdt_graph_add(g, jdt_graph_mul_scalar(g, vi, 0.999),
                          jdt_graph_mul_scalar(g, jdt_graph_mul(g, grads[i], grads[i]), 0.001));
        jdt_graph_add_update(g, mi, mn);
        jdt_graph_add_update(g, vi, vn);
        jdt_graph_add_update(
            g, params[i],
            jdt_graph_sub(
                g, params[i],
                jdt_graph_mul_scalar(
                    g, jdt_graph_div(g, mn, jdt_graph_add_scalar(g, jdt_graph_sqrt(g, vn), 1e-8)),
                    1e-3)));
    }
    for (int i = 0; i < jdt_graph_n_nodes(g); i++) {
        jdt_tensor *t = jdt_graph_node(g, i);
        if (t->op == JDT_OP_PARAM || t->op == JDT_OP_INPUT) {
            size_t n = (size_t)jdt_shape_numel(&t->shape);
            t->data = calloc(n, 4);
            if (t->dtype == JDT_DTYPE_F32 && !(t->flags & JDT_TENSOR_STATE))
                for (size_t j = 0; j < n; j++)
                    ((float *)t->data)[j] = 0.01f * (float)((j * 7919) % 13) - 0.06f;
        }
    }
    jdt_compile_opts o;
    jdt_compile_opts_init(&o);
    o.threads = threads;
    o.profile = true;
    jdt_program *p;
    if (jdt_program_compile(g, &o, &p, &e)) {
        printf("ERR %s\n", e.msg);
        return 1;
    }
    char buf[2048];
    puts(jdt_program_summary(p, buf, sizeof buf));
    printf("source %zu bytes\n", strlen(jdt_program_source(p)));
    for (int s = 0; s < 3; s++) {
        double t0 = jdt_now_s();
        if (jdt_program_run(p, &e)) {
            printf("run: %s\n", e.msg);
            return 1;
        }
        printf("step %d: loss %.6f  %.1f ms\n", s, *(const float *)jdt_program_output(p, 0),
               (jdt_now_s() - t0) * 1e3);
    }
    {
        char prof[4096];
        fputs(jdt_program_profile(p, prof, sizeof prof), stdout);
    }
    jdt_program_free(p);
    jdt_graph_free(g);
    return 0;
}
