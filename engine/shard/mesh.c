/*
 * mesh.c — the device mesh (rank <-> coordinate, tensor innermost), process groups named by
 * axis masks, and the logical-axis rules that give each leaf its placement (see shard.h).
 */
#include "shard/shard.h"

#include <stdio.h>
#include <string.h>

jdt_status jdt_mesh_init(jdt_mesh *m, const int sizes[JDT_MESH_AXIS_COUNT], int world_size,
                         int rank, jdt_err *e)
{
    memset(m, 0, sizeof *m);
    int fill = -1;
    long prod = 1;
    for (int a = 0; a < JDT_MESH_AXIS_COUNT; a++) {
        if (sizes[a] == -1) {
            if (fill >= 0)
                return jdt_err_set(e, JDT_ERR_CONFIG,
                                   "mesh: mesh.%s and mesh.%s are both -1; at most one axis may "
                                   "be filled in from the world size",
                                   jdt_config_mesh_axis_name((jdt_mesh_axis)fill),
                                   jdt_config_mesh_axis_name((jdt_mesh_axis)a));
            fill = a;
            continue;
        }
        if (sizes[a] < 1)
            return jdt_err_set(e, JDT_ERR_CONFIG, "mesh: mesh.%s = %d (expected >= 1 or -1)",
                               jdt_config_mesh_axis_name((jdt_mesh_axis)a), sizes[a]);
        prod *= sizes[a];
        m->size[a] = sizes[a];
    }
    if (fill >= 0) {
        if (world_size % prod)
            return jdt_err_set(e, JDT_ERR_CONFIG,
                               "mesh: mesh.%s = -1 cannot be filled in: %d processes are not a "
                               "multiple of the other axes' product %ld",
                               jdt_config_mesh_axis_name((jdt_mesh_axis)fill), world_size, prod);
        m->size[fill] = (int)(world_size / prod);
        prod = world_size;
    }
    if (prod != world_size)
        return jdt_err_set(e, JDT_ERR_CONFIG,
                           "mesh: data %d x fsdp %d x tensor %d = %ld devices, but the job has %d "
                           "process(es) (jdt-train --nproc %ld ...)",
                           m->size[0], m->size[1], m->size[2], prod, world_size, prod);
    if (rank < 0 || rank >= world_size)
        return jdt_err_set(e, JDT_ERR_CONFIG, "mesh: rank %d outside 0..%d", rank, world_size - 1);
    m->world_size = world_size;
    m->rank = rank;
    int r = rank;
    for (int a = JDT_MESH_AXIS_COUNT - 1; a >= 0; a--) {
        m->coord[a] = r % m->size[a];
        r /= m->size[a];
    }
    return JDT_OK;
}

int jdt_mesh_group_size(const jdt_mesh *m, unsigned axes)
{
    int n = 1;
    for (int a = 0; a < JDT_MESH_AXIS_COUNT; a++)
        if (axes & (1u << a)) n *= m->size[a];
    return n;
}

int jdt_mesh_group_index(const jdt_mesh *m, unsigned axes)
{
    int idx = 0;
    for (int a = 0; a < JDT_MESH_AXIS_COUNT; a++)
        if (axes & (1u << a)) idx = idx * m->size[a] + m->coord[a];
    return idx;
}

void jdt_mesh_group_ranks(const jdt_mesh *m, unsigned axes, int *ranks)
{
    const int n = jdt_mesh_group_size(m, axes);
    for (int j = 0; j < n; j++) {
        /* coordinates: this rank's outside the mask, j's row-major digits inside */
        int c[JDT_MESH_AXIS_COUNT], rest = j;
        for (int a = JDT_MESH_AXIS_COUNT - 1; a >= 0; a--) {
            if (axes & (1u << a)) {
                c[a] = rest % m->size[a];
                rest /= m->size[a];
            } else {
                c[a] = m->coord[a];
            }
        }
        int r = 0;
        for (int a = 0; a < JDT_MESH_AXIS_COUNT; a++) r = r * m->size[a] + c[a];
        ranks[j] = r;
    }
}

unsigned jdt_mesh_live(const jdt_mesh *m, unsigned axes)
{
    unsigned out = 0;
    for (int a = 0; a < JDT_MESH_AXIS_COUNT; a++)
        if ((axes & (1u << a)) && m->size[a] > 1) out |= 1u << a;
    return out;
}

const char *jdt_mesh_axes_str(unsigned axes, char *buf, size_t n)
{
    size_t o = 0;
    buf[0] = '\0';
    for (int a = 0; a < JDT_MESH_AXIS_COUNT && o < n; a++)
        if (axes & (1u << a))
            o += (size_t)snprintf(buf + o, n - o, "%s%s", o ? "+" : "",
                                  jdt_config_mesh_axis_name((jdt_mesh_axis)a));
    if (!axes) snprintf(buf, n, "none");
    return buf;
}

jdt_status jdt_shard_leaf_placement(const jdt_mesh *m, const jdt_config_rules *rules,
                                    const jdt_tensor *t, jdt_placement *out, jdt_err *e)
{
    memset(out, 0, sizeof *out);
    unsigned used = 0;
    for (int d = 0; d < t->shape.ndim; d++) {
        const char *name = t->axes[d];
        if (!name) continue;
        for (int i = 0; rules && i < rules->n_rules; i++) {
            const jdt_config_rule *r = &rules->rules[i];
            if (strcmp(r->logical, name) != 0) continue;
            unsigned mask = 0;
            for (int j = 0; j < r->n_mesh_axes; j++) mask |= 1u << r->mesh_axes[j];
            if (mask & used) continue; /* an axis at most once per tensor: try the next rule */
            mask = jdt_mesh_live(m, mask);
            const int ways = jdt_mesh_group_size(m, mask);
            if (t->shape.dims[d] % ways) {
                char ax[64];
                return jdt_err_set(e, JDT_ERR_CONFIG,
                                   "sharding.rules: tensor '%s' dim %d (%s, size %lld) does not "
                                   "split over mesh axis %s (%d ways)",
                                   t->name ? t->name : "?", d, name,
                                   (long long)t->shape.dims[d],
                                   jdt_mesh_axes_str(mask, ax, sizeof ax), ways);
            }
            out->dim[d] = (uint8_t)mask;
            used |= mask;
            break;
        }
    }
    return JDT_OK;
}

jdt_shape jdt_shard_local_shape(const jdt_mesh *m, const jdt_shape *s, const jdt_placement *p)
{
    jdt_shape l = *s;
    for (int d = 0; d < s->ndim; d++) l.dims[d] /= jdt_mesh_group_size(m, p->dim[d]);
    return l;
}

int64_t jdt_shard_local_offset(const jdt_mesh *m, const jdt_shape *s, const jdt_placement *p,
                               int d)
{
    const int ways = jdt_mesh_group_size(m, p->dim[d]);
    return (int64_t)jdt_mesh_group_index(m, p->dim[d]) * (s->dims[d] / ways);
}

double jdt_shard_loss_seed(const jdt_mesh *m, const jdt_placement *p)
{
    unsigned repl = jdt_mesh_live(m, 7u & ~(unsigned)p->partial);
    return 1.0 / (double)jdt_mesh_group_size(m, repl);
}

unsigned jdt_shard_grad_axes(const jdt_mesh *m, const jdt_placement *p)
{
    unsigned split = 0;
    for (int d = 0; d < JDT_MAX_DIMS; d++) split |= p->dim[d];
    return jdt_mesh_live(m, 7u & ~split);
}

void jdt_shard_copy_block(const jdt_mesh *m, const jdt_shape *s, const jdt_placement *p,
                          const float *src, float *dst)
{
    const jdt_shape l = jdt_shard_local_shape(m, s, p);
    int64_t off[JDT_MAX_DIMS], idx[JDT_MAX_DIMS] = {0};
    for (int d = 0; d < s->ndim; d++) off[d] = jdt_shard_local_offset(m, s, p, d);
    const int64_t n = jdt_shape_numel(&l);
    for (int64_t i = 0; i < n; i++) {
        int64_t g = 0;
        for (int d = 0; d < s->ndim; d++) g = g * s->dims[d] + off[d] + idx[d];
        dst[i] = src[g];
        for (int d = s->ndim - 1; d >= 0; d--) { /* next local index, row-major */
            if (++idx[d] < l.dims[d]) break;
            idx[d] = 0;
        }
    }
}

unsigned jdt_shard_batch_axes(const jdt_mesh *m, const jdt_config_rules *rules)
{
    for (int i = 0; rules && i < rules->n_rules; i++) {
        const jdt_config_rule *r = &rules->rules[i];
        if (strcmp(r->logical, "batch") != 0) continue;
        unsigned mask = 0;
        for (int j = 0; j < r->n_mesh_axes; j++) mask |= 1u << r->mesh_axes[j];
        return jdt_mesh_live(m, mask);
    }
    return 0;
}

void jdt_shard_batch_rows(const jdt_mesh *m, const jdt_config_rules *rules, int64_t rows,
                          int64_t *begin, int64_t *end)
{
    const unsigned axes = jdt_shard_batch_axes(m, rules);
    const int64_t per = rows / jdt_mesh_group_size(m, axes), at = jdt_mesh_group_index(m, axes);
    *begin = per * at;
    *end = per * (at + 1);
}

/* The placement the rules give a leaf whose dims are named a and b (shapes do not matter). */
static jdt_placement named_placement(const jdt_mesh *m, const jdt_config_rules *rules,
                                     const char *a, const char *b)
{
    jdt_tensor t;
    memset(&t, 0, sizeof t);
    t.shape.ndim = 2; /* dims of 0 divide by every count of ways */
    t.axes[0] = a;
    t.axes[1] = b;
    jdt_placement p;
    jdt_err e;
    if (jdt_shard_leaf_placement(m, rules, &t, &p, &e) != JDT_OK) memset(&p, 0, sizeof p);
    return p;
}

int jdt_shard_seq_ways(const jdt_mesh *m, const jdt_config_rules *rules)
{
    const unsigned seq = named_placement(m, rules, "batch", "seq").dim[1];
    if (!seq || (named_placement(m, rules, "vocab", "embed").dim[0] & seq)) return 1;
    return jdt_mesh_group_size(m, seq);
}
