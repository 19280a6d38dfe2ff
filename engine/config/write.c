/*
 * write.c — the config back out as YAML (every key, schema order, shortest round-trip floats,
 * double-quoted strings), config equality, and values derived from a config (parameter count,
 * effective decay steps, mesh size).
 */
#include "config/config-impl.h"

#include <stdlib.h>
#include <string.h>

/* Shortest %g form that reads back as exactly x. */
static void format_double(char *buf, size_t n_bytes, double x)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, n_bytes, "%.*g", prec, x);
        if (strtod(buf, NULL) == x) return;
    }
}

static void write_quoted(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\t': fputs("\\t", f); break;
        case '\r': fputs("\\r", f); break;
        default:
            if (*p < 0x20 || *p == 0x7f) {
                fprintf(f, "\\x%02x", *p);
            } else if (*p == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f) {
                /* C1 controls: YAML does not allow them raw (found by fuzz_config) */
                fprintf(f, "\\u%04x", p[1]);
                p++;
            } else if (*p == 0xef && p[1] == 0xbf && (p[2] == 0xbe || p[2] == 0xbf)) {
                fprintf(f, "\\u%04x", p[2] == 0xbe ? 0xfffe : 0xffff); /* noncharacters */
                p += 2;
            } else {
                fputc(*p, f);
            }
        }
    }
    fputc('"', f);
}

const char *jdt_config_choice_name(const char *path, int value)
{
    const jdt_config_key *k = jdt_config_schema_find(path);
    if (!k || k->type != JDT_CONFIG_ENUM) return "?";
    for (int i = 0; k->choices[i]; i++)
        if ((k->values ? k->values[i] : i) == value) return k->choices[i];
    return "?";
}

static void write_value(FILE *f, const jdt_config_key *k, const jdt_config *c)
{
    const char *field = (const char *)c + k->offset;
    char buf[64];
    switch (k->type) {
    case JDT_CONFIG_INT: fprintf(f, "%d", *(const int *)field); break;
    case JDT_CONFIG_I64: fprintf(f, "%lld", (long long)*(const int64_t *)field); break;
    case JDT_CONFIG_FLOAT:
        format_double(buf, sizeof buf, *(const double *)field);
        fputs(buf, f);
        break;
    case JDT_CONFIG_BOOL: fputs(*(const bool *)field ? "true" : "false", f); break;
    case JDT_CONFIG_STR: write_quoted(f, *(char *const *)field ? *(char *const *)field : ""); break;
    case JDT_CONFIG_ENUM: {
        fputs(jdt_config_choice_name(k->path, *(const int *)field), f);
        break;
    }
    case JDT_CONFIG_RULES: {
        const jdt_config_rules *r = (const jdt_config_rules *)(const void *)field;
        if (r->n_rules == 0) {
            fputs(" []", f);
            break;
        }
        for (int i = 0; i < r->n_rules; i++) {
            const jdt_config_rule *rule = &r->rules[i];
            fputs("\n    - [", f);
            write_quoted(f, rule->logical);
            fputs(", ", f);
            if (rule->n_mesh_axes == 0) fputs("null", f);
            if (rule->n_mesh_axes > 1) fputc('[', f);
            for (int j = 0; j < rule->n_mesh_axes; j++)
                fprintf(f, "%s%s", j ? ", " : "", jdt_config_mesh_axis_name(rule->mesh_axes[j]));
            if (rule->n_mesh_axes > 1) fputc(']', f);
            fputc(']', f);
        }
        break;
    }
    }
}

jdt_status jdt_config_write_yaml(const jdt_config *c, FILE *f, jdt_err *e)
{
    const char *section = "";
    size_t sl = 0;
    fprintf(f, "# resolved by jdt-train %s\n", JDT_VERSION_STRING);
    for (int i = 0; i < jdt_config_schema_count(); i++) {
        const jdt_config_key *k = jdt_config_schema_key(i);
        const char *dot = strchr(k->path, '.');
        if ((size_t)(dot - k->path) != sl || strncmp(section, k->path, sl) != 0) {
            section = k->path;
            sl = (size_t)(dot - k->path);
            fprintf(f, "%.*s:\n", (int)sl, section);
        }
        fprintf(f, "  %s:", dot + 1);
        if (k->type != JDT_CONFIG_RULES) fputc(' ', f);
        write_value(f, k, c);
        fputc('\n', f);
    }
    if (fflush(f) != 0 || ferror(f))
        return jdt_err_set(e, JDT_ERR_IO, "writing the resolved config failed");
    return JDT_OK;
}

char *jdt_config_to_yaml(const jdt_config *c, jdt_err *e)
{
    char *buf = NULL, *out;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) {
        jdt_err_set(e, JDT_ERR_NOMEM, "config: out of memory");
        return NULL;
    }
    jdt_status st = jdt_config_write_yaml(c, f, e);
    if (fclose(f) != 0 && st == JDT_OK) st = jdt_err_set(e, JDT_ERR_NOMEM, "config: out of memory");
    if (st) {
        free(buf); /* open_memstream allocates with malloc */
        return NULL;
    }
    out = jdt_malloc(len + 1);
    if (out) {
        memcpy(out, buf, len);
        out[len] = '\0';
    } else {
        jdt_err_set(e, JDT_ERR_NOMEM, "config: out of memory");
    }
    free(buf);
    return out;
}

/* True when key k holds the same value in a and b. */
static bool key_equal(const jdt_config_key *k, const jdt_config *a, const jdt_config *b)
{
    const char *fa = (const char *)a + k->offset, *fb = (const char *)b + k->offset;
    switch (k->type) {
    case JDT_CONFIG_INT:
    case JDT_CONFIG_ENUM: return *(const int *)fa == *(const int *)fb;
    case JDT_CONFIG_I64: return *(const int64_t *)fa == *(const int64_t *)fb;
    case JDT_CONFIG_FLOAT: return *(const double *)fa == *(const double *)fb;
    case JDT_CONFIG_BOOL: return *(const bool *)fa == *(const bool *)fb;
    case JDT_CONFIG_STR: {
        const char *sa = *(char *const *)fa, *sb = *(char *const *)fb;
        return strcmp(sa ? sa : "", sb ? sb : "") == 0;
    }
    case JDT_CONFIG_RULES: {
        const jdt_config_rules *ra = (const void *)fa, *rb = (const void *)fb;
        if (ra->n_rules != rb->n_rules) return false;
        for (int r = 0; r < ra->n_rules; r++) {
            const jdt_config_rule *x = &ra->rules[r], *y = &rb->rules[r];
            if (strcmp(x->logical, y->logical) != 0 || x->n_mesh_axes != y->n_mesh_axes)
                return false;
            for (int j = 0; j < x->n_mesh_axes; j++)
                if (x->mesh_axes[j] != y->mesh_axes[j]) return false;
        }
        return true;
    }
    }
    return false;
}

const jdt_config_key *jdt_config_first_difference(const jdt_config *a, const jdt_config *b,
                                                  bool job_only)
{
    for (int i = 0; i < jdt_config_schema_count(); i++) {
        const jdt_config_key *k = jdt_config_schema_key(i);
        if (job_only && jdt_config_key_per_process(k)) continue;
        if (!key_equal(k, a, b)) return k;
    }
    return NULL;
}

bool jdt_config_equal(const jdt_config *a, const jdt_config *b)
{
    return jdt_config_first_difference(a, b, false) == NULL;
}

void jdt_config_value_text(const jdt_config_key *k, const jdt_config *c, char *buf,
                           size_t n_bytes)
{
    if (n_bytes == 0) return;
    buf[0] = '\0';
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return;
    write_value(f, k, c);
    if (fclose(f) != 0 || !text) {
        free(text);
        return;
    }
    /* rules are written as a block list ("\n    - [a, b]" each): one flow list instead */
    size_t o = 0;
    const char *p = text;
    if (k->type == JDT_CONFIG_RULES && strncmp(p, " []", 3) != 0 && o + 1 < n_bytes)
        buf[o++] = '[';
    if (k->type == JDT_CONFIG_RULES && strncmp(p, " []", 3) == 0) p++;
    bool first = true;
    while (*p && o + 1 < n_bytes) {
        if (k->type == JDT_CONFIG_RULES && strncmp(p, "\n    - ", 7) == 0) {
            p += 7;
            if (!first && o + 2 < n_bytes) {
                buf[o++] = ',';
                buf[o++] = ' ';
            }
            first = false;
            continue;
        }
        buf[o++] = *p++;
    }
    if (k->type == JDT_CONFIG_RULES && !first && o + 1 < n_bytes) buf[o++] = ']';
    buf[o] = '\0';
    free(text); /* open_memstream allocates with malloc */
}

int64_t jdt_config_mlp_dim(const jdt_config *c)
{
    return c->model.mlp_dim > 0 ? c->model.mlp_dim : (int64_t)c->model.mlp_ratio * c->model.n_embd;
}

int jdt_config_kv_heads(const jdt_config *c)
{
    return c->model.n_kv_head ? c->model.n_kv_head : c->model.n_head;
}

void jdt_config_rope_scaling(const jdt_config *c, double sc[4])
{
    const bool on = c->model.pos == JDT_POS_ROPE && c->model.rope_scaling == JDT_ROPE_SCALING_LLAMA3;
    sc[0] = on ? c->model.rope_factor : 0.0;
    sc[1] = c->model.rope_low_freq_factor;
    sc[2] = c->model.rope_high_freq_factor;
    sc[3] = (double)c->model.rope_original_max_pos;
}

int jdt_config_head_dim(const jdt_config *c)
{
    return c->model.head_dim ? c->model.head_dim : c->model.n_embd / c->model.n_head;
}

bool jdt_config_qkv_bias(const jdt_config *c)
{
    return c->model.bias || c->model.qkv_bias;
}

bool jdt_config_gated_mlp(const jdt_config *c)
{
    return c->model.activation == JDT_ACT_SWIGLU || c->model.activation == JDT_ACT_GEGLU;
}

int64_t jdt_config_decay_steps(const jdt_config *c)
{
    return c->optimizer.decay_steps ? c->optimizer.decay_steps : c->run.steps;
}

int jdt_config_mesh_size(const jdt_config *c)
{
    if (c->mesh.data < 1 || c->mesh.fsdp < 1 || c->mesh.tensor < 1) return 0; /* a -1 axis */
    return c->mesh.data * c->mesh.fsdp * c->mesh.tensor;
}

int64_t jdt_config_param_count(const jdt_config *c)
{
    const int64_t bias = c->model.bias ? 1 : 0;
    if (c->model.type == JDT_MODEL_MLP) {
        int64_t n = 0, in = c->model.in_dim;
        for (int i = 0; i < c->model.n_hidden; i++) {
            n += in * c->model.hidden_dim + bias * c->model.hidden_dim;
            in = c->model.hidden_dim;
        }
        return n + in * c->model.n_classes + bias * c->model.n_classes;
    }
    const int64_t V = c->model.vocab_size, T = c->model.seq_len, C = c->model.n_embd;
    const int64_t D = jdt_config_head_dim(c), KV = (int64_t)jdt_config_kv_heads(c) * D;
    const int64_t Q = (int64_t)c->model.n_head * D, qkvb = jdt_config_qkv_bias(c) ? 1 : 0;
    const int64_t Hm = jdt_config_mlp_dim(c);
    const int64_t norm = C * (c->model.norm == JDT_NORM_LAYERNORM ? 1 + bias : 1);
    const int64_t qk_norm = c->model.qk_norm ? 2 * D * (c->model.norm == JDT_NORM_LAYERNORM ? 1 + bias : 1) : 0;
    int64_t attn = C * Q + 2 * C * KV + Q * C + qkvb * (Q + 2 * KV) + bias * C + qk_norm; /* q, k, v, o */
    int64_t mlp = jdt_config_gated_mlp(c) ? 3 * C * Hm + bias * (2 * Hm + C)
                                                        : 2 * C * Hm + bias * (Hm + C);
    int64_t n = V * C;                                /* token embedding (V, C) */
    if (c->model.pos == JDT_POS_LEARNED) n += T * C; /* position embedding (T, C) */
    n += (int64_t)c->model.n_layer * (2 * norm + attn + mlp);
    n += norm; /* final norm */
    if (!c->model.tie_embeddings) n += C * V; /* head (C, V) */
    return n;
}
