/*
 * check_shard.c — unit tests for engine/shard: mesh coordinates (tensor innermost) and process
 * groups, -1 fill-in and mesh errors, MaxText rule semantics (first rule that fits, an axis at
 * most once per tensor, non-divisible dims named), block copies, the partitioner's collectives
 * for fsdp and tensor meshes, and the ALL_GATHER / REDUCE_SCATTER ops' layouts and VJPs in the
 * interpreter and the compiled program (one process standing in for a group of two identical
 * members).
 */
#include "autodiff/autodiff.h"
#include "compile/compile.h"
#include "graph/builder.h"
#include "graph/interp.h"
#include "models/models.h"
#include "shard/shard.h"

#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

START_TEST(test_mesh_coords_and_groups)
{
    jdt_mesh m;
    jdt_err e;
    const int sizes[3] = {2, 3, 2}; /* data, fsdp, tensor */
    ck_assert_int_eq(jdt_mesh_init(&m, sizes, 12, 7, &e), JDT_OK);
    /* 7 = (d * 3 + f) * 2 + t -> d 1, f 0, t 1 */
    ck_assert_int_eq(m.coord[0], 1);
    ck_assert_int_eq(m.coord[1], 0);
    ck_assert_int_eq(m.coord[2], 1);
    int r[12];
    jdt_mesh_group_ranks(&m, 1u << JDT_MESH_TENSOR, r); /* consecutive: tensor innermost */
    ck_assert_int_eq(jdt_mesh_group_size(&m, 1u << JDT_MESH_TENSOR), 2);
    ck_assert_int_eq(r[0], 6);
    ck_assert_int_eq(r[1], 7);
    jdt_mesh_group_ranks(&m, 1u << JDT_MESH_FSDP, r);
    ck_assert_int_eq(r[0], 7);
    ck_assert_int_eq(r[1], 9);
    ck_assert_int_eq(r[2], 11);
    ck_assert_int_eq(jdt_mesh_group_index(&m, 1u << JDT_MESH_FSDP), 0);
    unsigned df = (1u << JDT_MESH_DATA) | (1u << JDT_MESH_FSDP);
    ck_assert_int_eq(jdt_mesh_group_size(&m, df), 6);
    jdt_mesh_group_ranks(&m, df, r);
    const int want[6] = {1, 3, 5, 7, 9, 11};
    for (int i = 0; i < 6; i++) ck_assert_int_eq(r[i], want[i]);
    ck_assert_int_eq(jdt_mesh_group_index(&m, df), 3);
    ck_assert_int_eq(jdt_mesh_live(&m, 7u), 7u);
}
END_TEST

START_TEST(test_mesh_fill_and_errors)
{
    jdt_mesh m;
    jdt_err e;
    const int fill[3] = {2, -1, 1};
    ck_assert_int_eq(jdt_mesh_init(&m, fill, 8, 0, &e), JDT_OK);
    ck_assert_int_eq(m.size[1], 4);
    const int two[3] = {-1, -1, 1};
    ck_assert_int_eq(jdt_mesh_init(&m, two, 4, 0, &e), JDT_ERR_CONFIG);
    ck_assert(strstr(e.msg, "both -1"));
    const int bad[3] = {3, 1, 1};
    ck_assert_int_eq(jdt_mesh_init(&m, bad, 2, 0, &e), JDT_ERR_CONFIG);
    ck_assert(strstr(e.msg, "3 devices, but the job has 2"));
    ck_assert_int_eq(jdt_mesh_init(&m, fill, 7, 0, &e), JDT_ERR_CONFIG);
    ck_assert(strstr(e.msg, "not a multiple"));
}
END_TEST

static jdt_config_rule rule(const char *logical, int n, jdt_mesh_axis a, jdt_mesh_axis b)
{
    jdt_config_rule r;
    memset(&r, 0, sizeof r);
    r.logical = (char *)logical;
    r.n_mesh_axes = n;
    r.mesh_axes[0] = a;
    r.mesh_axes[1] = b;
    return r;
}

START_TEST(test_rules_first_fit)
{
    jdt_mesh m;
    jdt_err e;
    const int sizes[3] = {1, 2, 2};
    ck_assert_int_eq(jdt_mesh_init(&m, sizes, 4, 0, &e), JDT_OK);
    /* mlp -> tensor first, then mlp -> fsdp: a (mlp, mlp) tensor gets tensor on dim 0 and, the
     * tensor axis being used, fsdp on dim 1 */
    jdt_config_rule rs[3] = {rule("mlp", 1, JDT_MESH_TENSOR, 0), rule("mlp", 1, JDT_MESH_FSDP, 0),
                             rule("embed", 0, 0, 0)};
    jdt_config_rules rules = {3, rs};
    jdt_graph *g = jdt_graph_new();
    const int64_t d[2] = {8, 6};
    const char *ax[2] = {"mlp", "mlp"};
    jdt_tensor *w = jdt_graph_param(g, "w", JDT_DTYPE_F32, 2, d, ax);
    jdt_placement p;
    ck_assert_int_eq(jdt_shard_leaf_placement(&m, &rules, w, &p, &e), JDT_OK);
    ck_assert_int_eq(p.dim[0], 1u << JDT_MESH_TENSOR);
    ck_assert_int_eq(p.dim[1], 1u << JDT_MESH_FSDP);
    jdt_shape l = jdt_shard_local_shape(&m, &w->shape, &p);
    ck_assert_int_eq(l.dims[0], 4);
    ck_assert_int_eq(l.dims[1], 3);
    /* embed -> null: replicated; an unnamed dim: replicated */
    const char *ax2[2] = {"embed", NULL};
    jdt_tensor *v = jdt_graph_param(g, "v", JDT_DTYPE_F32, 2, d, ax2);
    ck_assert_int_eq(jdt_shard_leaf_placement(&m, &rules, v, &p, &e), JDT_OK);
    ck_assert_int_eq(p.dim[0], 0);
    ck_assert_int_eq(p.dim[1], 0);
    /* a dim that does not divide: one line naming tensor, dim and axis */
    const int64_t odd[2] = {8, 5};
    const char *ax3[2] = {"embed", "mlp"};
    jdt_tensor *u = jdt_graph_param(g, "blocks.0.u", JDT_DTYPE_F32, 2, odd, ax3);
    ck_assert_int_eq(jdt_shard_leaf_placement(&m, &rules, u, &p, &e), JDT_ERR_CONFIG);
    ck_assert_msg(strstr(e.msg, "tensor 'blocks.0.u' dim 1 (mlp, size 5) does not split over mesh "
                                "axis tensor (2 ways)"), "%s", e.msg);
    jdt_graph_free(g);
}
END_TEST

START_TEST(test_copy_block)
{
    jdt_mesh m;
    jdt_err e;
    const int sizes[3] = {1, 2, 2};
    ck_assert_int_eq(jdt_mesh_init(&m, sizes, 4, 3, &e), JDT_OK); /* f 1, t 1 */
    jdt_shape s = {2, {4, 6}};
    jdt_placement p;
    memset(&p, 0, sizeof p);
    p.dim[0] = 1u << JDT_MESH_TENSOR;
    p.dim[1] = 1u << JDT_MESH_FSDP;
    float src[24], dst[6];
    for (int i = 0; i < 24; i++) src[i] = (float)i;
    jdt_shard_copy_block(&m, &s, &p, src, dst);
    /* rows 2..3, cols 3..5 */
    const float want[6] = {15, 16, 17, 21, 22, 23};
    for (int i = 0; i < 6; i++) ck_assert(dst[i] == want[i]);
    ck_assert_int_eq(jdt_shard_local_offset(&m, &s, &p, 0), 2);
    ck_assert_int_eq(jdt_shard_local_offset(&m, &s, &p, 1), 3);
}
END_TEST

static int count_op(const jdt_graph *g, jdt_op op, int group)
{
    int n = 0;
    for (int i = 0; i < jdt_graph_n_nodes(g); i++) {
        const jdt_tensor *t = jdt_graph_node(g, i);
        if (t->op == op && (group < 0 || t->attrs.i[0] == group)) n++;
    }
    return n;
}

/* parameters of the last partition_tiny model with an `embed` dim (the default rules shard
 * those over fsdp; norm weights carry `norm` and stay replicated) */
static int g_embed_params;

static void partition_tiny(const char *mesh_fsdp, const char *mesh_tensor, jdt_graph **out_g,
                           jdt_config *c)
{
    char *ovr[4] = {(char *)mesh_fsdp, (char *)mesh_tensor, (char *)"dist.world_size=2", NULL};
    jdt_err e;
    ck_assert_msg(jdt_config_load("configs/tiny.yaml", 3, ovr, NULL, c, &e) == JDT_OK, "%s", e.msg);
    jdt_mesh m;
    const int sizes[3] = {c->mesh.data, c->mesh.fsdp, c->mesh.tensor};
    ck_assert_int_eq(jdt_mesh_init(&m, sizes, 2, 0, &e), JDT_OK);
    jdt_graph *g = jdt_graph_new();
    jdt_model md;
    ck_assert_int_eq(jdt_model_build(g, c, 8, true, &md, &e), JDT_OK);
    g_embed_params = 0;
    for (int i = 0; i < md.n_params; i++) {
        const jdt_tensor *p = md.params[i].t;
        bool embed = false;
        for (int k = 0; k < p->shape.ndim; k++)
            embed = embed || (p->axes[k] && strcmp(p->axes[k], "embed") == 0);
        g_embed_params += embed;
    }
    jdt_shard_result r;
    ck_assert_msg(jdt_shard_partition(&m, &c->sharding.rules, g, &r, &e) == JDT_OK, "%s", e.msg);
    ck_assert_int_eq(jdt_graph_error(r.g, &e), JDT_OK);
    ck_assert_int_eq(r.map[md.x->id]->shape.dims[0], c->mesh.fsdp == 2 ? 4 : 8);
    jdt_shard_result_free(&r);
    jdt_graph_free(g);
    *out_g = r.g;
}

START_TEST(test_partition_fsdp_and_tensor)
{
    jdt_config c;
    jdt_graph *g;
    const int F = 1 << JDT_MESH_FSDP, T = 1 << JDT_MESH_TENSOR;
    /* fsdp=2: every weight with an embed dim is gathered for use (at least once each); no
     * all-reduce at all (the loss stays partial) */
    partition_tiny("mesh.fsdp=2", "mesh.tensor=1", &g, &c);
    ck_assert_int_gt(g_embed_params, 10);
    ck_assert_int_ge(count_op(g, JDT_OP_ALL_GATHER, F), g_embed_params);
    ck_assert_int_eq(count_op(g, JDT_OP_ALL_REDUCE, -1), 0);
    ck_assert_int_eq(count_op(g, JDT_OP_ALL_GATHER, T), 0);
    /* autodiff turns every gather into a reduce-scatter */
    jdt_graph_free(g);
    jdt_config_free(&c);
    /* tensor=2: per block two row-parallel all-reduces (attn o, mlp proj), no gathers of
     * weights (vocab replicated by default) */
    partition_tiny("mesh.fsdp=1", "mesh.tensor=2", &g, &c);
    ck_assert_int_eq(count_op(g, JDT_OP_ALL_REDUCE, T), 2 * c.model.n_layer);
    ck_assert_int_eq(count_op(g, JDT_OP_ALL_GATHER, -1), 0);
    jdt_graph_free(g);
    jdt_config_free(&c);
}
END_TEST

/* Partition kinds come from the op registry (ops.c, beside shape and VJP rules): forward ops
 * have one, backward-only ops and collectives have none, and a graph holding one of those is
 * refused naming the op and node. */
START_TEST(test_partition_kinds)
{
    ck_assert_int_eq(jdt_op_partition(JDT_OP_MATMUL), JDT_PART_MATMUL);
    ck_assert_int_eq(jdt_op_partition(JDT_OP_ADD), JDT_PART_ELEMENTWISE);
    ck_assert_int_eq(jdt_op_partition(JDT_OP_ATTENTION), JDT_PART_ATTENTION);
    ck_assert_int_eq(jdt_op_partition((jdt_op)JDT_OP_COUNT), JDT_PART_NONE);
    for (int op = 0; op < JDT_OP_COUNT; op++) {
        jdt_part_kind k = jdt_op_partition((jdt_op)op);
        ck_assert_int_lt((int)k, JDT_PART_COUNT);
        if (jdt_op_class_of((jdt_op)op) == JDT_OPC_COLLECTIVE)
            ck_assert_msg(k == JDT_PART_NONE, "collective %s has a partition kind",
                          jdt_op_name((jdt_op)op));
        if (jdt_op_class_of((jdt_op)op) == JDT_OPC_ELEMENTWISE && op != JDT_OP_GELU_GRAD &&
            op != JDT_OP_SILU_GRAD)
            ck_assert_msg(k == JDT_PART_ELEMENTWISE, "%s", jdt_op_name((jdt_op)op));
    }
    jdt_mesh m;
    jdt_err e;
    const int sizes[3] = {2, 1, 1};
    ck_assert_int_eq(jdt_mesh_init(&m, sizes, 2, 0, &e), JDT_OK);
    jdt_config_rules rules;
    memset(&rules, 0, sizeof rules);
    jdt_graph *g = jdt_graph_new();
    int64_t d[1] = {4};
    jdt_tensor *x = jdt_graph_input(g, "x", JDT_DTYPE_F32, 1, d, NULL);
    jdt_tensor *y = jdt_graph_gelu_grad(g, x, x);
    jdt_graph_add_output(g, y);
    ck_assert_int_eq(jdt_graph_error(g, &e), JDT_OK);
    jdt_shard_result r;
    ck_assert_int_eq(jdt_shard_partition(&m, &rules, g, &r, &e), JDT_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(e.msg, "gelu_grad (node 1) has no partition rule") != NULL, "%s", e.msg);
    jdt_graph_free(g);
}
END_TEST

/* A group of two identical members: gather repeats this member's part, scatter-sum doubles
 * member 0's part (this process plays index 0). */
static int g_calls;
static jdt_status twin_collective(void *ctx, int group, int kind, jdt_dtype dt, void *buf,
                                  size_t n, jdt_err *e)
{
    (void)ctx, (void)group, (void)e;
    /* f32; an all-gather moves bf16 too (FSDP's bf16 weight copies: a byte copy) */
    ck_assert(dt == JDT_DTYPE_F32 || (dt == JDT_DTYPE_BF16 && kind == JDT_COLL_ALLGATHER));
    float *f = buf;
    g_calls++;
    if (kind == JDT_COLL_ALLGATHER)
        memcpy((char *)buf + n / 2 * jdt_dtype_size(dt), buf, n / 2 * jdt_dtype_size(dt));
    else if (kind == JDT_COLL_REDUCE_SCATTER)
        for (size_t i = 0; i < n / 2; i++) f[i] *= 2.0f;
    else
        for (size_t i = 0; i < n; i++) f[i] *= 2.0f;
    return JDT_OK;
}

START_TEST(test_gather_scatter_ops)
{
    /* y = all_gather(p, axis 1) (2, 3) -> (2, 6); z = reduce_scatter(y * w, axis 1) -> (2, 3);
     * loss = sum(z). dL/dp = reduce_scatter(all_gather(1) * w) over the twin group. */
    for (int jit = 0; jit < 2; jit++) {
        jdt_graph *g = jdt_graph_new();
        const int64_t d[2] = {2, 3}, d6[2] = {2, 6};
        jdt_tensor *p = jdt_graph_param(g, "p", JDT_DTYPE_F32, 2, d, NULL);
        jdt_tensor *w = jdt_graph_input(g, "w", JDT_DTYPE_F32, 2, d6, NULL);
        jdt_tensor *y = jdt_graph_all_gather(g, p, 1, 2, 1);
        ck_assert_int_eq(y->shape.dims[1], 6);
        jdt_tensor *z = jdt_graph_reduce_scatter(g, jdt_graph_mul(g, y, w), 1, 2, 1, 0.5);
        ck_assert_int_eq(z->shape.dims[1], 3);
        jdt_tensor *loss = jdt_graph_reduce_sum(g, z, 3u, false), *grad = NULL;
        jdt_err e;
        ck_assert_int_eq(jdt_autodiff_grad(g, loss, 1, &p, &grad, &e), JDT_OK);
        jdt_graph_add_output(g, y);
        jdt_graph_add_output(g, z);
        jdt_graph_add_output(g, grad);
        float pv[6] = {1, 2, 3, 4, 5, 6}, wv[12];
        for (int i = 0; i < 12; i++) wv[i] = (float)(i + 1);
        p->data = pv;
        w->data = wv;
        const float *yv, *zv, *gv;
        jdt_program *prog = NULL;
        jdt_interp *it = NULL;
        char cache[] = "/tmp/jdt-check-shard-XXXXXX";
        ck_assert_ptr_nonnull(mkdtemp(cache));
        g_calls = 0;
        if (jit) {
            jdt_compile_opts o;
            jdt_compile_opts_init(&o);
            o.cache_dir = cache;
            o.collective = twin_collective;
            ck_assert_msg(jdt_program_compile(g, &o, &prog, &e) == JDT_OK, "%s", e.msg);
            ck_assert_msg(jdt_program_run(prog, &e) == JDT_OK, "%s", e.msg);
            yv = jdt_program_output(prog, 0);
            zv = jdt_program_output(prog, 1);
            gv = jdt_program_output(prog, 2);
        } else {
            ck_assert_int_eq(jdt_interp_new(g, &it, &e), JDT_OK);
            jdt_interp_set_collective(it, twin_collective, NULL);
            ck_assert_msg(jdt_interp_run(it, &e) == JDT_OK, "%s", e.msg);
            yv = jdt_interp_value(it, y);
            zv = jdt_interp_value(it, z);
            gv = jdt_interp_value(it, grad);
        }
        ck_assert_int_eq(g_calls, 4); /* gather, scatter; backward: gather, scatter */
        /* y rows: [p row, p row] */
        const float yw[12] = {1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6};
        for (int i = 0; i < 12; i++) ck_assert(fabsf(yv[i] - yw[i]) < 1e-6f);
        /* z = 0.5 * 2 * (y * w)[:, :3] (member 0's part summed over two twins) */
        for (int r = 0; r < 2; r++)
            for (int k = 0; k < 3; k++)
                ck_assert(fabsf(zv[r * 3 + k] - yw[r * 6 + k] * wv[r * 6 + k]) < 1e-5f);
        /* dz = 1 -> dy = 0.5 * gather(1) = 0.5 everywhere -> d(y*w)/dy -> 0.5 w ->
         * reduce_scatter (twins): 2 * 0.5 * w[:, :3] = w[:, :3] */
        for (int r = 0; r < 2; r++)
            for (int k = 0; k < 3; k++) ck_assert(fabsf(gv[r * 3 + k] - wv[r * 6 + k]) < 1e-5f);
        jdt_program_free(prog);
        jdt_interp_free(it);
        jdt_graph_free(g);
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", cache);
        ck_assert_int_eq(system(cmd), 0);
    }
}
END_TEST

/* ---- start/wait collectives (docs/compiler.md "Collectives") -------------------------------- */

/* A started collective of the fake async communicator: a snapshot of its buffer at start. */
typedef struct {
    int kind;
    jdt_dtype dt;
    void *buf, *snap;
    size_t n_bytes;
    size_t n;
} fake_work;
static int g_started, g_pending;

static jdt_status fake_start(void *ctx, int group, int kind, jdt_dtype dt, void *buf, size_t n,
                             void **handle, jdt_err *e)
{
    (void)ctx, (void)group, (void)e;
    ck_assert(dt == JDT_DTYPE_F32 || (dt == JDT_DTYPE_BF16 && kind == JDT_COLL_ALLGATHER));
    fake_work *w = malloc(sizeof *w);
    ck_assert_ptr_nonnull(w);
    w->kind = kind;
    w->dt = dt;
    w->buf = buf;
    w->n = n;
    w->n_bytes = n * jdt_dtype_size(dt);
    w->snap = malloc(w->n_bytes + 1);
    memcpy(w->snap, buf, w->n_bytes);
    g_started++;
    g_pending++;
    *handle = w;
    return JDT_OK;
}

/* The window check: nothing may have written the buffer between start and wait. Then the
 * twin group's collective, as the blocking path runs it. */
static jdt_status fake_wait(void *ctx, void *handle, jdt_err *e)
{
    fake_work *w = handle;
    ck_assert_msg(memcmp(w->buf, w->snap, w->n_bytes) == 0,
                  "a collective's buffer (%zu bytes) was written between its start and wait",
                  w->n_bytes);
    jdt_status st = twin_collective(ctx, 0, w->kind, w->dt, w->buf, w->n, e);
    g_pending--;
    free(w->snap);
    free(w);
    return st;
}

#define OV_MAX_TRACE 512
static char g_trace[OV_MAX_TRACE][48]; /* copies: the names belong to the program */
static int g_n_trace;
static void ov_trace(void *ctx, const char *name, double t0, double t1)
{
    (void)ctx, (void)t0, (void)t1;
    if (g_n_trace < OV_MAX_TRACE)
        snprintf(g_trace[g_n_trace++], sizeof g_trace[0], "%s", name);
}

/* FSDP-style step: 3 layers h = tanh(x @ all_gather(W_l) + b_l), loss = sum(h^2); the weight
 * gradients are reduce-scattered (the gather's VJP), the bias gradients all-reduced (scale
 * 0.5, the data-parallel mean), every parameter updated by SGD. Outputs: loss, gradients.
 * W_1 is stored split along its columns (gathered along axis 1: its parts are strided), the
 * others along their rows, so buckets mix both layouts. form: OV_F32; OV_BF16_FLAG, bf16
 * compute with the f32 weight gathered and rounded by the GEMM; OV_BF16_CAST, the train
 * step's cast form under FSDP: the shard cast to bf16, the bf16 copy gathered. */
enum { OV_F32, OV_BF16_FLAG, OV_BF16_CAST };
static jdt_graph *overlap_graph(int form, jdt_tensor **P, float *pv, float *xv)
{
    jdt_graph *g = jdt_graph_new();
    jdt_graph_set_matmul_bf16(g, form != OV_F32);
    const int64_t xd[2] = {4, 8}, wd[2] = {4, 8}, wd1[2] = {8, 4}, bd[1] = {8};
    jdt_tensor *x = jdt_graph_input(g, "x", JDT_DTYPE_F32, 2, xd, NULL), *h = x;
    x->data = xv;
    for (int l = 0; l < 3; l++) {
        char nm[16];
        snprintf(nm, sizeof nm, "w%d", l);
        P[2 * l] = jdt_graph_param(g, nm, JDT_DTYPE_F32, 2, l == 1 ? wd1 : wd, NULL);
        snprintf(nm, sizeof nm, "b%d", l);
        P[2 * l + 1] = jdt_graph_param(g, nm, JDT_DTYPE_F32, 1, bd, NULL);
        P[2 * l]->data = pv + l * 40;
        P[2 * l + 1]->data = pv + l * 40 + 32;
        jdt_tensor *ws = form == OV_BF16_CAST ? jdt_graph_cast(g, P[2 * l], JDT_DTYPE_BF16)
                                              : P[2 * l];
        jdt_tensor *wg = jdt_graph_all_gather(g, ws, 1, 2, l == 1); /* (8, 8) */
        jdt_tensor *z = jdt_graph_matmul(g, h, wg, false, false);
        h = jdt_graph_tanh(g, jdt_graph_add(g, z, jdt_graph_broadcast(g, P[2 * l + 1], 2, xd)));
    }
    jdt_tensor *loss = jdt_graph_reduce_sum(g, jdt_graph_mul(g, h, h), 3u, false), *G[6];
    jdt_err e;
    ck_assert_int_eq(jdt_autodiff_grad(g, loss, 6, P, G, &e), JDT_OK);
    jdt_graph_add_output(g, loss);
    for (int i = 0; i < 6; i++) {
        if (i % 2) G[i] = jdt_graph_all_reduce(g, G[i], 2, 0, 0.5);
        jdt_graph_add_output(g, G[i]);
        jdt_graph_add_update(g, P[i], jdt_graph_sub(g, P[i], jdt_graph_mul_scalar(g, G[i], 0.1)));
    }
    return g;
}

/* x (nx values) is bitwise the same run as y (ny values) */
static void assert_bitwise(const float *x, size_t nx, const float *y, size_t ny)
{
    ck_assert_uint_eq(nx, ny);
    ck_assert(memcmp(x, y, ny * sizeof(float)) == 0);
}

/* x (the interpreter's run) and y agree to 1e-5 relative, value by value */
static void assert_close(const float *x, const float *y, size_t n)
{
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(fabsf(x[i] - y[i]) <= 1e-5f * (1.0f + fabsf(x[i])), "value %zu: %g vs %g",
                      i, x[i], y[i]);
}

/* Runs the step twice (the second run sees the updated parameters) with the given schedule;
 * out receives the outputs of the second run and the parameters after it (7 + 120 floats
 * max). */
static void overlap_run(int form, int mode, float *out, size_t *n_out, jdt_compile_stats *stats)
{
    float pv[120], xv[32];
    for (int i = 0; i < 120; i++)
        pv[i] = 0.05f * (float)((i * 37) % 23 - 11);
    for (int i = 0; i < 32; i++)
        xv[i] = 0.1f * (float)((i * 13) % 17 - 8);
    jdt_tensor *P[6];
    jdt_graph *g = overlap_graph(form, P, pv, xv);
    jdt_compile_opts o;
    jdt_compile_opts_init(&o);
    char cache[] = "/tmp/jdt-check-overlap-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(cache));
    o.cache_dir = cache;
    o.collective = twin_collective;
    /* 0 interpreter, 1 blocking, 2 start/wait, 3 start/wait + buckets (every gradient
     * collective of a kind in one, all the gathers in one), 4 buckets of two (512 bytes:
     * two 8x8 tensors) and gathers issued one bucket ahead only */
    o.no_jit = mode == 0;
    if (mode >= 2) {
        o.collective_start = fake_start;
        o.collective_wait = fake_wait;
        o.trace = ov_trace;
    }
    if (mode == 3) o.bucket_bytes = 1 << 20;
    if (mode == 4) o.bucket_bytes = 512, o.prefetch_bytes = -1;
    jdt_program *prog = NULL;
    jdt_err e;
    ck_assert_msg(jdt_program_compile(g, &o, &prog, &e) == JDT_OK, "%s", e.msg);
    g_started = g_pending = g_n_trace = 0;
    for (int r = 0; r < 2; r++) {
        g_n_trace = 0;
        ck_assert_msg(jdt_program_run(prog, &e) == JDT_OK, "%s", e.msg);
        ck_assert_int_eq(g_pending, 0); /* every start was waited within the run */
    }
    size_t k = 0;
    for (int i = 0; i < 7; i++) {
        const jdt_tensor *t = jdt_graph_output(g, i);
        const float *v = jdt_program_output(prog, i);
        for (int64_t j = 0; j < jdt_shape_numel(&t->shape); j++)
            out[k++] = v[j];
    }
    for (int i = 0; i < 120; i++)
        out[k++] = pv[i];
    *n_out = k;
    *stats = *jdt_program_stats(prog);
    if (mode >= 2) { /* bucket slots lie inside their bucket, which is live across them */
        for (int b = 0; b < jdt_program_n_buffers(prog); b++) {
            jdt_buf_info a, bk;
            jdt_program_buffer(prog, b, &a);
            if (a.slot_of < 0) continue;
            ck_assert(jdt_program_buffer(prog, a.slot_of, &bk));
            ck_assert_int_ge(a.offset, bk.offset);
            ck_assert_int_le(a.offset + a.n_bytes, bk.offset + bk.n_bytes);
            ck_assert_int_le(bk.def_step, a.def_step);
            ck_assert_int_ge(bk.last_step, a.last_step);
        }
    }
    jdt_program_free(prog);
    jdt_graph_free(g);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", cache);
    ck_assert_int_eq(system(cmd), 0);
}

START_TEST(test_overlap_window)
{
    float ref[300], blk[300], ov[300], bk[300], b2[300];
    size_t n_ref, n_blk, n_ov, n_bk, n_b2;
    jdt_compile_stats s_ref, s_blk, s_ov, s_bk, s_b2;
    overlap_run(OV_F32, 0, ref, &n_ref, &s_ref);
    overlap_run(OV_F32, 1, blk, &n_blk, &s_blk);
    overlap_run(OV_F32, 2, ov, &n_ov, &s_ov);
    /* the schedule of the start/wait program: a gradient's collective is issued before the
     * last backward GEMM (it runs under it), and the weights' gathers are issued ahead */
    int first_start = -1, last_matmul = -1;
    for (int i = 0; i < g_n_trace; i++) {
        if (strcmp(g_trace[i], "reduce_scatter:start") == 0 && first_start < 0) first_start = i;
        if (strcmp(g_trace[i], "matmul") == 0) last_matmul = i;
    }
    ck_assert_int_ge(first_start, 0);
    ck_assert_msg(first_start < last_matmul,
                  "the first gradient reduce-scatter starts at step %d, after the last GEMM (%d)",
                  first_start, last_matmul);
    overlap_run(OV_F32, 3, bk, &n_bk, &s_bk);
    overlap_run(OV_F32, 4, b2, &n_b2, &s_b2);
    ck_assert_int_eq(n_ref, n_blk);
    /* bitwise equal to the blocking schedule (the twins' sums do not depend on placement) */
    assert_bitwise(ov, n_ov, blk, n_blk);
    assert_bitwise(bk, n_bk, blk, n_blk);
    assert_bitwise(b2, n_b2, blk, n_blk);
    assert_close(ref, blk, n_ref); /* and the interpreter agrees */
    /* 3 forward gathers, 2 re-gathers for the backward GEMMs of layers 1 and 2 (layer 0's
     * input needs no cotangent), 3 reduce-scatters, 3 bias all-reduces */
    ck_assert_int_eq(s_blk.n_coll_async, 0);
    ck_assert_int_eq(s_ov.n_coll_calls, 11);
    /* one has no step between its start and its wait: it runs inline, blocking */
    ck_assert_int_eq(s_ov.n_coll_async, 10);
    /* one bucket each: the 3 bias all-reduces, the 3 weight reduce-scatters, the 5 gathers */
    ck_assert_int_eq(s_bk.n_coll_bucketed, 11);
    ck_assert_int_eq(s_bk.n_coll_calls, 3);
    /* 512-byte buckets: gathers (w0 w1) (w2 w2') (w1'), reduce-scatters (w2 w1) (w0), the
     * bias all-reduces (32 bytes each) in one */
    ck_assert_int_eq(s_b2.n_coll_bucketed, 9);
    ck_assert_int_eq(s_b2.n_coll_calls, 6);
    /* prefetch: one bucket of 5 gathers (5 x 256 bytes) issued at the start; one ahead only:
     * the second bucket is issued as the first is waited, so both are in flight */
    ck_assert_int_eq(s_bk.n_coll_prefetch, 1);
    ck_assert_int_eq(s_bk.prefetch_peak_bytes, 1280);
    ck_assert_int_eq(s_b2.n_coll_prefetch, 3);
    ck_assert_int_eq(s_b2.prefetch_peak_bytes, 1024);
}
END_TEST

/* precision.compute: bf16 under FSDP. The cast form gathers each weight shard's bf16 copy (a
 * CAST on the shard, a bf16 ALL_GATHER: half the bytes) where the flag form gathers the f32
 * shard and the GEMM rounds it: round(shard) gathered = round(full), so the two steps are
 * bitwise equal, on every schedule; the interpreter (f32 wire for the bf16 values) agrees. */
START_TEST(test_overlap_bf16_gathers)
{
    float fl[300], ref[300], blk[300], ov[300], bk[300], b2[300];
    size_t n_fl, n_ref, n_blk, n_ov, n_bk, n_b2;
    jdt_compile_stats s_fl, s_ref, s_blk, s_ov, s_bk, s_b2;
    overlap_run(OV_BF16_FLAG, 1, fl, &n_fl, &s_fl);
    overlap_run(OV_BF16_CAST, 0, ref, &n_ref, &s_ref);
    overlap_run(OV_BF16_CAST, 1, blk, &n_blk, &s_blk);
    overlap_run(OV_BF16_CAST, 2, ov, &n_ov, &s_ov);
    overlap_run(OV_BF16_CAST, 3, bk, &n_bk, &s_bk);
    overlap_run(OV_BF16_CAST, 4, b2, &n_b2, &s_b2);
    ck_assert_int_eq(n_ref, n_fl);
    assert_bitwise(blk, n_blk, fl, n_fl);
    assert_bitwise(ov, n_ov, fl, n_fl);
    assert_bitwise(bk, n_bk, fl, n_fl);
    assert_bitwise(b2, n_b2, fl, n_fl);
    assert_close(ref, blk, n_ref);
    /* half the gathered bytes: 5 gathers (3 forward, 2 re-gathers for the backward, as with
     * f32: the re-gather reads the bf16 shard) of 8x8 bf16 instead of f32 */
    ck_assert_int_eq(s_fl.gather_bytes, 5 * 64 * 4);
    ck_assert_int_eq(s_blk.gather_bytes, 5 * 64 * 2);
    ck_assert_int_eq(s_ov.n_coll_calls, 11);
    /* the casts read parameters only: their gathers are prefetched like the parameters' (one
     * bucket of the 5 issued at the start, the casts moved ahead of it) */
    ck_assert_int_eq(s_bk.n_coll_prefetch, 1);
    ck_assert_int_eq(s_bk.prefetch_peak_bytes, 640);
    /* f32 (the bias all-reduces, the weight reduce-scatters) and bf16 never share a bucket */
    ck_assert_int_eq(s_bk.n_coll_calls, 3);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("shard");
    TCase *tc = tcase_create("shard");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_mesh_coords_and_groups);
    tcase_add_test(tc, test_mesh_fill_and_errors);
    tcase_add_test(tc, test_rules_first_fit);
    tcase_add_test(tc, test_copy_block);
    tcase_add_test(tc, test_partition_fsdp_and_tensor);
    tcase_add_test(tc, test_partition_kinds);
    tcase_add_test(tc, test_gather_scatter_ops);
    tcase_add_test(tc, test_overlap_window);
    tcase_add_test(tc, test_overlap_bf16_gathers);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
