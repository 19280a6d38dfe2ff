/*
 * config.c — loads YAML config files into jdt_config: a small node tree built from libyaml
 * events (every node remembers file:line:col), base_config chains merged deeply, environment
 * and command-line overrides inserted into the tree, then one pass over the tree that sets
 * fields through the schema table (schema.c), then cross-field checks.
 *
 * Every user error becomes JDT_ERR_CONFIG with one line: "<place>: <key path>: <problem>",
 * where <place> is file:line:col, "override 'k=v'" or "environment variable JDT_X".
 */
#include "config/config-impl.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <yaml.h>

#define MAX_BASE_DEPTH 32
#define MAX_NEST_DEPTH 64
#define MAX_FILE_BYTES (16u << 20)
#define MAX_KEYS 256

/* ---- sources and the node tree -------------------------------------------------------------- */

typedef struct cfg_src {
    char *label; /* a file path, "override 'k=v'" or "environment variable JDT_X" */
    bool is_file;
    struct cfg_src *next;
} cfg_src;

typedef enum { NODE_SCALAR, NODE_SEQ, NODE_MAP } node_kind;

typedef struct cfg_node {
    node_kind kind;
    char *key;       /* set when the node is the value of a mapping entry */
    int kline, kcol; /* position of that key (1-based) */
    char *text;      /* scalar text */
    bool plain;      /* scalar was unquoted */
    const cfg_src *src;
    int line, col; /* position of the value (1-based) */
    int n, cap;
    struct cfg_node **items;
} cfg_node;

/* Where a key's value came from (for cross-field messages); src NULL = schema default. */
typedef struct {
    const cfg_src *src;
    int line, col;
} cfg_pos;

typedef struct {
    cfg_src *srcs;
    const char *top_label;
    char *chain_real[MAX_BASE_DEPTH]; /* realpaths of the files being loaded (cycle check) */
    const char *chain_label[MAX_BASE_DEPTH];
    int depth;
    cfg_pos pos[MAX_KEYS];
} loader;

static void node_free(cfg_node *n)
{
    if (!n) return;
    for (int i = 0; i < n->n; i++) node_free(n->items[i]);
    jdt_free(n->items);
    jdt_free(n->key);
    jdt_free(n->text);
    jdt_free(n);
}

static cfg_node *node_new(node_kind kind, const cfg_src *src, int line, int col)
{
    cfg_node *n = jdt_calloc(1, sizeof *n);
    if (!n) return NULL;
    n->kind = kind;
    n->src = src;
    n->line = line;
    n->col = col;
    return n;
}

static jdt_status node_push(cfg_node *parent, cfg_node *child, jdt_err *e)
{
    if (parent->n == parent->cap) {
        int cap = parent->cap ? parent->cap * 2 : 8;
        cfg_node **items = jdt_realloc(parent->items, (size_t)cap * sizeof *items);
        if (!items) return jdt_err_set(e, JDT_ERR_NOMEM, "config: out of memory");
        parent->items = items;
        parent->cap = cap;
    }
    parent->items[parent->n++] = child;
    return JDT_OK;
}

/* Keys one mapping may hold: every section of the schema has a few dozen; a file with more is
 * not a config (500k keys took minutes in the linear duplicate checks). */
#define CFG_MAP_MAX_KEYS 4096

static cfg_node *map_get(const cfg_node *map, const char *key, int *index)
{
    for (int i = 0; i < map->n; i++) {
        if (strcmp(map->items[i]->key, key) == 0) {
            if (index) *index = i;
            return map->items[i];
        }
    }
    return NULL;
}

static cfg_src *src_add(loader *ld, const char *label, bool is_file)
{
    cfg_src *s = jdt_calloc(1, sizeof *s);
    if (!s) return NULL;
    s->label = jdt_strdup(label);
    if (!s->label) {
        jdt_free(s);
        return NULL;
    }
    s->is_file = is_file;
    s->next = ld->srcs;
    ld->srcs = s;
    return s;
}

/* Formats the place of (src, line, col): "file:line:col", "file" (line 0) or the label. */
static void place(char *buf, size_t n_bytes, const cfg_src *src, int line, int col)
{
    if (!src)
        snprintf(buf, n_bytes, "(default)");
    else if (src->is_file && line > 0)
        snprintf(buf, n_bytes, "%s:%d:%d", src->label, line, col);
    else
        snprintf(buf, n_bytes, "%s", src->label);
}

static void node_place(char *buf, size_t n_bytes, const cfg_node *n, bool at_key)
{
    if (at_key && n->kline > 0)
        place(buf, n_bytes, n->src, n->kline, n->kcol);
    else
        place(buf, n_bytes, n->src, n->line, n->col);
}

/* ---- "did you mean" --------------------------------------------------------------------------- */

static int edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63) return 99;
    int row[64];
    for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j];
            int best = diag + (a[i - 1] != b[j - 1]);
            if (row[j] + 1 < best) best = row[j] + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return (int)row[lb];
}

/* Tracks the closest candidate within a tolerance that grows with the word's length. */
typedef struct {
    const char *word;
    char best[128];
    int best_d;
} suggester;

static void suggest_init(suggester *s, const char *word)
{
    s->word = word;
    s->best[0] = '\0';
    s->best_d = 99;
}

static void suggest_try(suggester *s, const char *cand, const char *shown)
{
    size_t len = strlen(s->word);
    int tol = len <= 3 ? 1 : len <= 6 ? 2 : 3;
    int d = edit_distance(s->word, cand);
    if (d <= tol && d < s->best_d) {
        s->best_d = d;
        snprintf(s->best, sizeof s->best, "%s", shown ? shown : cand);
    }
}

/* Writes " (did you mean X?)" or "" into buf. */
static void suggest_hint(const suggester *s, char *buf, size_t n_bytes)
{
    if (s->best[0])
        snprintf(buf, n_bytes, " (did you mean %s?)", s->best);
    else
        buf[0] = '\0';
}

static int section_index(const char *name)
{
    for (int i = 0; JDT_CONFIG_SECTIONS[i]; i++)
        if (strcmp(JDT_CONFIG_SECTIONS[i], name) == 0) return i;
    return -1;
}

/* Hint for an unknown key `leaf` in `section` (NULL section: a top-level name). */
static void hint_for_key(const char *section, const char *leaf, char *buf, size_t n_bytes)
{
    suggester s;
    suggest_init(&s, leaf);
    int n = jdt_config_schema_count();
    if (!section) {
        for (int i = 0; JDT_CONFIG_SECTIONS[i]; i++) suggest_try(&s, JDT_CONFIG_SECTIONS[i], NULL);
    }
    size_t sl = section ? strlen(section) : 0;
    for (int i = 0; i < n; i++) {
        const char *p = jdt_config_schema_key(i)->path;
        const char *dot = strchr(p, '.');
        if (section && (strncmp(p, section, sl) != 0 || p[sl] != '.')) continue;
        suggest_try(&s, dot + 1, p);
    }
    if (!s.best[0]) { /* the right key in the wrong section? */
        for (int i = 0; i < n; i++) {
            const char *p = jdt_config_schema_key(i)->path;
            if (strcmp(strchr(p, '.') + 1, leaf) == 0) {
                snprintf(s.best, sizeof s.best, "%s", p);
                break;
            }
        }
    }
    suggest_hint(&s, buf, n_bytes);
}

/* ---- YAML text -> node tree ----------------------------------------------------------------- */

static jdt_status yaml_next(yaml_parser_t *p, yaml_event_t *ev, const cfg_src *src, jdt_err *e)
{
    if (yaml_parser_parse(p, ev)) return JDT_OK;
    if (p->error == YAML_MEMORY_ERROR) return jdt_err_set(e, JDT_ERR_NOMEM, "config: out of memory");
    char where[512], ctx[256] = "";
    place(where, sizeof where, src, (int)p->problem_mark.line + 1, (int)p->problem_mark.column + 1);
    if (p->context)
        snprintf(ctx, sizeof ctx, " (%s at line %d column %d)", p->context,
                 (int)p->context_mark.line + 1, (int)p->context_mark.column + 1);
    return jdt_err_set(e, JDT_ERR_CONFIG, "%s: YAML syntax error: %s%s", where,
                       p->problem ? p->problem : "unknown problem", ctx);
}

static const char *kind_name(const cfg_node *n)
{
    return n->kind == NODE_MAP ? "a mapping" : n->kind == NODE_SEQ ? "a list" : "a scalar";
}

/* Parses the node that starts with *ev (consumed) into *out. `path` names it in messages. */
static jdt_status parse_node(yaml_parser_t *p, yaml_event_t *ev, const cfg_src *src,
                             const char *path, int depth, cfg_node **out, jdt_err *e)
{
    jdt_status st = JDT_OK;
    char where[512];
    cfg_node *n = NULL;
    yaml_event_t kev, vev;
    int line = (int)ev->start_mark.line + 1, col = (int)ev->start_mark.column + 1;
    *out = NULL;
    if (depth > MAX_NEST_DEPTH) {
        place(where, sizeof where, src, line, col);
        st = jdt_err_set(e, JDT_ERR_CONFIG, "%s: %s: nested more than %d levels deep", where,
                         path[0] ? path : "(top)", MAX_NEST_DEPTH);
        goto out_event;
    }
    switch (ev->type) {
    case YAML_SCALAR_EVENT:
        n = node_new(NODE_SCALAR, src, line, col);
        if (!n) goto out_nomem;
        n->text = jdt_malloc(ev->data.scalar.length + 1);
        if (!n->text) goto out_nomem;
        memcpy(n->text, ev->data.scalar.value, ev->data.scalar.length);
        n->text[ev->data.scalar.length] = '\0';
        n->plain = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
        break;
    case YAML_SEQUENCE_START_EVENT:
        n = node_new(NODE_SEQ, src, line, col);
        if (!n) goto out_nomem;
        for (int i = 0;; i++) {
            cfg_node *child;
            char sub[256];
            st = yaml_next(p, &vev, src, e);
            if (st) goto out_node;
            if (vev.type == YAML_SEQUENCE_END_EVENT) {
                yaml_event_delete(&vev);
                break;
            }
            snprintf(sub, sizeof sub, "%s[%d]", path, i);
            st = parse_node(p, &vev, src, sub, depth + 1, &child, e);
            if (st) goto out_node;
            st = node_push(n, child, e);
            if (st) {
                node_free(child);
                goto out_node;
            }
        }
        break;
    case YAML_MAPPING_START_EVENT:
        n = node_new(NODE_MAP, src, line, col);
        if (!n) goto out_nomem;
        for (;;) {
            cfg_node *child, *dup;
            char sub[256];
            st = yaml_next(p, &kev, src, e);
            if (st) goto out_node;
            if (kev.type == YAML_MAPPING_END_EVENT) {
                yaml_event_delete(&kev);
                break;
            }
            int kl = (int)kev.start_mark.line + 1, kc = (int)kev.start_mark.column + 1;
            if (kev.type != YAML_SCALAR_EVENT) {
                yaml_event_delete(&kev);
                place(where, sizeof where, src, kl, kc);
                st = jdt_err_set(e, JDT_ERR_CONFIG, "%s: %s: mapping keys must be plain names",
                                 where, path[0] ? path : "(top)");
                goto out_node;
            }
            char *key = jdt_strdup((const char *)kev.data.scalar.value);
            yaml_event_delete(&kev);
            if (!key) goto out_nomem;
            snprintf(sub, sizeof sub, "%s%s%s", path, path[0] ? "." : "", key);
            if (n->n >= CFG_MAP_MAX_KEYS) { /* the duplicate check below is linear per key */
                place(where, sizeof where, src, kl, kc);
                st = jdt_err_set(e, JDT_ERR_CONFIG, "%s: %s: more than %d keys in one mapping",
                                 where, path[0] ? path : "(top)", CFG_MAP_MAX_KEYS);
                jdt_free(key);
                goto out_node;
            }
            if ((dup = map_get(n, key, NULL)) != NULL) {
                place(where, sizeof where, src, kl, kc);
                st = jdt_err_set(e, JDT_ERR_CONFIG,
                                 "%s: %s: duplicate key (first set at line %d); keep one", where,
                                 sub, dup->kline);
                jdt_free(key);
                goto out_node;
            }
            st = yaml_next(p, &vev, src, e);
            if (st) {
                jdt_free(key);
                goto out_node;
            }
            st = parse_node(p, &vev, src, sub, depth + 1, &child, e);
            if (st) {
                jdt_free(key);
                goto out_node;
            }
            child->key = key;
            child->kline = kl;
            child->kcol = kc;
            st = node_push(n, child, e);
            if (st) {
                node_free(child);
                goto out_node;
            }
        }
        break;
    case YAML_ALIAS_EVENT:
        place(where, sizeof where, src, line, col);
        st = jdt_err_set(e, JDT_ERR_CONFIG,
                         "%s: %s: YAML aliases (*name) are not supported; write the value out",
                         where, path[0] ? path : "(top)");
        goto out_event;
    case YAML_NO_EVENT:
    case YAML_STREAM_START_EVENT:
    case YAML_STREAM_END_EVENT:
    case YAML_DOCUMENT_START_EVENT:
    case YAML_DOCUMENT_END_EVENT:
    case YAML_SEQUENCE_END_EVENT:
    case YAML_MAPPING_END_EVENT:
        place(where, sizeof where, src, line, col);
        st = jdt_err_set(e, JDT_ERR_CONFIG, "%s: unexpected YAML event", where);
        goto out_event;
    }
    yaml_event_delete(ev);
    *out = n;
    return JDT_OK;

out_nomem:
    st = jdt_err_set(e, JDT_ERR_NOMEM, "config: out of memory");
out_node:
    node_free(n);
out_event:
    yaml_event_delete(ev);
    return st;
}

/* Parses a whole YAML stream of at most one document; *out is NULL for an empty stream. */
static jdt_status parse_text(const char *text, size_t len, const cfg_src *src, cfg_node **out,
                             jdt_err *e)
{
    yaml_parser_t p;
    yaml_event_t ev;
    jdt_status st;
    cfg_node *root = NULL;
    *out = NULL;
    if (!yaml_parser_initialize(&p)) return jdt_err_set(e, JDT_ERR_NOMEM, "config: out of memory");
    yaml_parser_set_input_string(&p, (const unsigned char *)text, len);
    st = yaml_next(&p, &ev, src, e); /* STREAM_START */
    if (st) goto out_parser;
    yaml_event_delete(&ev);
    st = yaml_next(&p, &ev, src, e);
    if (st) goto out_parser;
    if (ev.type == YAML_STREAM_END_EVENT) {
        yaml_event_delete(&ev);
        goto out_parser;
    }
    yaml_event_delete(&ev); /* DOCUMENT_START */
    st = yaml_next(&p, &ev, src, e);
    if (st) goto out_parser;
    st = parse_node(&p, &ev, src, "", 0, &root, e);
    if (st) goto out_parser;
    st = yaml_next(&p, &ev, src, e); /* DOCUMENT_END */
    if (st) goto out_root;
    yaml_event_delete(&ev);
    st = yaml_next(&p, &ev, src, e);
    if (st) goto out_root;
    if (ev.type != YAML_STREAM_END_EVENT) {
        char where[512];
        place(where, sizeof where, src, (int)ev.start_mark.line + 1, (int)ev.start_mark.column + 1);
        yaml_event_delete(&ev);
        st = jdt_err_set(e, JDT_ERR_CONFIG, "%s: a config holds one YAML document; found a second",
                         where);
        goto out_root;
    }
    yaml_event_delete(&ev);
    *out = root;
    yaml_parser_delete(&p);
    return JDT_OK;

out_root:
    node_free(root);
out_parser:
    yaml_parser_delete(&p);
    return st;
}

/* True if s is well-formed UTF-8 (no overlong forms, surrogates or code points past
 * U+10FFFF): YAML text must be, values from overrides may not be, and the resolved config
 * must load back (libyaml rejects what this rejects; fuzz_config found an overlong form). */
static bool valid_utf8(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        unsigned c = *p;
        int n = c < 0x80 ? 0 : (c >> 5) == 6 ? 1 : (c >> 4) == 14 ? 2 : (c >> 3) == 30 ? 3 : -1;
        if (n < 0) return false;
        uint32_t cp = n == 0 ? c : n == 1 ? (c & 0x1f) : n == 2 ? (c & 0x0f) : (c & 0x07);
        for (int i = 1; i <= n; i++) {
            if ((p[i] & 0xc0) != 0x80) return false;
            cp = (cp << 6) | (p[i] & 0x3f);
        }
        if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) ||
            cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        p += n + 1;
    }
    return true;
}

/* A value given as text (override, environment, schema default): flow collections and quoted
 * scalars go through YAML; anything else is taken verbatim as a plain scalar, so
 * run.name=a: b is the string "a: b". */
static jdt_status node_from_text(const char *text, const cfg_src *src, cfg_node **out, jdt_err *e)
{
    *out = NULL;
    if (text[0] == '[' || text[0] == '{' || text[0] == '"' || text[0] == '\'') {
        jdt_status st = parse_text(text, strlen(text), src, out, e);
        if (st) return st;
        if (*out) return JDT_OK;
    }
    cfg_node *n = node_new(NODE_SCALAR, src, 0, 0);
    if (!n) return jdt_err_set(e, JDT_ERR_NOMEM, "config: out of memory");
    n->text = jdt_strdup(text);
    if (!n->text) {
        node_free(n);
        return jdt_err_set(e, JDT_ERR_NOMEM, "config: out of memory");
    }
    n->plain = true;
    *out = n;
    return JDT_OK;
}

/* ---- files, base_config, merging -------------------------------------------------------------- */

/* Moves child's entries into base (deep for mappings; child wins) and frees child. */
static jdt_status merge_into(cfg_node *base, cfg_node *child, jdt_err *e)
{
    jdt_status st = JDT_OK;
    for (int i = 0; i < child->n; i++) {
        cfg_node *c = child->items[i];
        int bi;
        cfg_node *b = map_get(base, c->key, &bi);
        child->items[i] = NULL;
        if (b && b->kind == NODE_MAP && c->kind == NODE_MAP) {
            st = merge_into(b, c, e);
        } else if (b) {
            base->items[bi] = c;
            node_free(b);
        } else {
            st = node_push(base, c, e);
            if (st) node_free(c);
        }
        if (st) break;
    }
    node_free(child);
    return st;
}

/* Loads one config document (file `label`, or `text` when non-NULL) and its base_config chain
 * into *out, a mapping. `ref` is the base_config node that named this file (NULL at the top). */
static jdt_status load_tree(loader *ld, const char *label, const char *text_in, const cfg_node *ref,
                            cfg_node **out, jdt_err *e)
{
    jdt_status st = JDT_OK;
    char where[512] = "";
    char *text = NULL, *real = NULL, *base_path = NULL;
    size_t len = 0;
    cfg_node *root = NULL, *base = NULL;
    const cfg_src *src;
    *out = NULL;

    if (ref)
        node_place(where, sizeof where, ref, false);
    if (text_in) {
        len = strlen(text_in);
    } else {
        int err_no = 0;
        st = jdt_read_file(label, ref == NULL, MAX_FILE_BYTES, &text, &len, &err_no);
        if (st == JDT_ERR_NOMEM) return jdt_err_set(e, st, "config: out of memory");
        if (st) {
            const char *why = err_no == EINVAL ? "not a regular file (a FIFO, socket or device)"
                                               : strerror(err_no);
            if (ref)
                return jdt_err_set(e, JDT_ERR_CONFIG, "%s: base_config: cannot read '%s': %s",
                                   where, label, why);
            return jdt_err_set(e, JDT_ERR_CONFIG, "%s: cannot read config file: %s", label, why);
        }
        real = realpath(label, NULL);
        for (int i = 0; real && i < ld->depth; i++) {
            if (ld->chain_real[i] && strcmp(ld->chain_real[i], real) == 0) {
                char chain[1024] = "";
                size_t o = 0;
                for (int j = i; j < ld->depth && o < sizeof chain; j++)
                    o += (size_t)snprintf(chain + o, sizeof chain - o, "%s -> ", ld->chain_label[j]);
                if (o < sizeof chain) snprintf(chain + o, sizeof chain - o, "%s", label);
                st = jdt_err_set(e, JDT_ERR_CONFIG, "%s: base_config cycle: %s", where, chain);
                goto out_free;
            }
        }
    }
    if (ld->depth >= MAX_BASE_DEPTH) {
        st = jdt_err_set(e, JDT_ERR_CONFIG, "%s: base_config chain deeper than %d files", where,
                         MAX_BASE_DEPTH);
        goto out_free;
    }
    src = src_add(ld, label, true);
    if (!src) goto out_nomem;
    st = parse_text(text_in ? text_in : text, len, src, &root, e);
    if (st) goto out_free;
    if (!root || (root->kind == NODE_SCALAR && root->plain && root->text[0] == '\0')) {
        node_free(root);
        root = node_new(NODE_MAP, src, 1, 1);
        if (!root) goto out_nomem;
    }
    if (root->kind != NODE_MAP) {
        place(where, sizeof where, src, root->line, root->col);
        st = jdt_err_set(e, JDT_ERR_CONFIG,
                         "%s: expected a mapping of sections (run:, model:, ...) at the top, got %s",
                         where, kind_name(root));
        goto out_free;
    }
    int bi;
    cfg_node *bref = map_get(root, "base_config", &bi);
    if (bref) {
        if (bref->kind != NODE_SCALAR || bref->text[0] == '\0') {
            node_place(where, sizeof where, bref, false);
            st = jdt_err_set(e, JDT_ERR_CONFIG, "%s: base_config: expected a file path, got %s",
                             where, bref->kind == NODE_SCALAR ? "nothing" : kind_name(bref));
            goto out_free;
        }
        const char *slash = strrchr(label, '/');
        size_t dl = (bref->text[0] == '/' || !slash) ? 0 : (size_t)(slash - label) + 1;
        base_path = jdt_malloc(dl + strlen(bref->text) + 1);
        if (!base_path) goto out_nomem;
        memcpy(base_path, label, dl);
        strcpy(base_path + dl, bref->text);
        ld->chain_real[ld->depth] = real;
        ld->chain_label[ld->depth] = label;
        ld->depth++;
        st = load_tree(ld, base_path, NULL, bref, &base, e);
        ld->depth--;
        if (st) goto out_free;
        /* drop base_config from the child, then merge the child over the base */
        memmove(&root->items[bi], &root->items[bi + 1], (size_t)(root->n - bi - 1) * sizeof *root->items);
        root->n--;
        node_free(bref);
        st = merge_into(base, root, e);
        root = base;
        base = NULL;
        if (st) goto out_free;
    }
    *out = root;
    root = NULL;
    goto out_free;

out_nomem:
    st = jdt_err_set(e, JDT_ERR_NOMEM, "config: out of memory");
out_free:
    node_free(root);
    node_free(base);
    jdt_free(base_path);
    jdt_free(text);
    free(real); /* from realpath(3) */
    return st;
}

/* ---- overrides ------------------------------------------------------------------------------ */

typedef struct {
    const jdt_config_key *key;
    const char *value;
    const char *text; /* the whole "k=v" or "JDT_X=v" */
    bool from_env;
} override;

/* Sets root.section.leaf = a node parsed from o->value. */
static jdt_status apply_override(loader *ld, cfg_node *root, const override *o, jdt_err *e)
{
    char label[600], where[512], section[32];
    jdt_status st;
    cfg_node *val = NULL, *sec, *new_sec = NULL, *old;
    const char *path = o->key->path, *dot = strchr(path, '.');
    int vi;
    snprintf(section, sizeof section, "%.*s", (int)(dot - path), path);
    snprintf(label, sizeof label, o->from_env ? "environment variable %s" : "override '%s'", o->text);
    const cfg_src *src = src_add(ld, label, false);
    if (!src) return jdt_err_set(e, JDT_ERR_NOMEM, "config: out of memory");
    st = node_from_text(o->value, src, &val, e);
    if (st) return st;
    val->key = jdt_strdup(dot + 1);
    if (!val->key) goto out_nomem;
    sec = map_get(root, section, NULL);
    if (sec && sec->kind == NODE_SCALAR && sec->plain && sec->text[0] == '\0') {
        sec->kind = NODE_MAP; /* "section:" with nothing under it */
    } else if (sec && sec->kind != NODE_MAP) {
        node_place(where, sizeof where, sec, false);
        st = jdt_err_set(e, JDT_ERR_CONFIG, "%s: %s: expected a mapping of keys, got %s", where,
                         section, kind_name(sec));
        goto out_free_val;
    }
    if (!sec) {
        new_sec = node_new(NODE_MAP, src, 0, 0);
        if (!new_sec || !(new_sec->key = jdt_strdup(section))) goto out_nomem;
        st = node_push(root, new_sec, e);
        if (st) goto out_free_val;
        sec = new_sec;
        new_sec = NULL; /* owned by root now */
    }
    old = map_get(sec, dot + 1, &vi);
    if (old) {
        sec->items[vi] = val;
        node_free(old);
        return JDT_OK;
    }
    st = node_push(sec, val, e);
    if (st) goto out_free_val;
    return JDT_OK;

out_nomem:
    st = jdt_err_set(e, JDT_ERR_NOMEM, "config: out of memory");
out_free_val:
    node_free(new_sec);
    node_free(val);
    return st;
}

/* Parses "section.key=value" into *o. */
static jdt_status parse_cli_override(const char *text, override *o, jdt_err *e)
{
    const char *eq = strchr(text, '=');
    char path[128], hint[200];
    memset(o, 0, sizeof *o);
    if (!eq || eq == text || (size_t)(eq - text) >= sizeof path)
        return jdt_err_set(e, JDT_ERR_CONFIG,
                           "override '%s': expected section.key=value (e.g. model.n_layer=4)", text);
    snprintf(path, sizeof path, "%.*s", (int)(eq - text), text);
    const char *dot = strchr(path, '.');
    if (!dot || dot == path || !dot[1] || strchr(dot + 1, '.'))
        return jdt_err_set(e, JDT_ERR_CONFIG,
                           "override '%s': expected section.key=value (e.g. model.n_layer=4), "
                           "got key '%s'",
                           text, path);
    o->key = jdt_config_schema_find(path);
    if (!o->key) {
        char section[64];
        snprintf(section, sizeof section, "%.*s", (int)(dot - path), path);
        if (section_index(section) < 0) {
            hint_for_key(NULL, section, hint, sizeof hint);
            return jdt_err_set(e, JDT_ERR_CONFIG, "override '%s': %s: unknown section '%s'%s", text,
                               path, section, hint);
        }
        hint_for_key(section, dot + 1, hint, sizeof hint);
        return jdt_err_set(e, JDT_ERR_CONFIG, "override '%s': %s: unknown key%s", text, path, hint);
    }
    o->value = eq + 1;
    o->text = text;
    return JDT_OK;
}

/* If `var` ("NAME=value") is a config variable, fills *o and returns JDT_OK with o->key set;
 * leaves o->key NULL for JDT_* names outside the sections; errors for unknown keys. */
static jdt_status parse_env_override(const char *var, override *o, jdt_err *e)
{
    char name[160], want[160], sec_up[40];
    const char *eq = strchr(var, '=');
    memset(o, 0, sizeof *o);
    if (strncmp(var, "JDT_", 4) != 0 || !eq || (size_t)(eq - var) >= sizeof name) return JDT_OK;
    snprintf(name, sizeof name, "%.*s", (int)(eq - var), var);
    int sec = -1;
    for (int i = 0; JDT_CONFIG_SECTIONS[i]; i++) {
        size_t l = strlen(JDT_CONFIG_SECTIONS[i]);
        for (size_t j = 0; j <= l; j++)
            sec_up[j] = (char)(JDT_CONFIG_SECTIONS[i][j] >= 'a' && JDT_CONFIG_SECTIONS[i][j] <= 'z'
                                   ? JDT_CONFIG_SECTIONS[i][j] - 'a' + 'A'
                                   : JDT_CONFIG_SECTIONS[i][j]);
        if (strncmp(name + 4, sec_up, l) == 0 && name[4 + l] == '_') {
            sec = i;
            break;
        }
    }
    if (sec < 0) return JDT_OK;
    suggester s;
    suggest_init(&s, name);
    for (int i = 0; i < jdt_config_schema_count(); i++) {
        const jdt_config_key *k = jdt_config_schema_key(i);
        jdt_config_env_name(k, want, sizeof want);
        if (strcmp(want, name) == 0) {
            o->key = k;
            o->value = eq + 1;
            o->text = var;
            o->from_env = true;
            return JDT_OK;
        }
        suggest_try(&s, want, NULL);
    }
    char hint[200];
    suggest_hint(&s, hint, sizeof hint);
    return jdt_err_set(e, JDT_ERR_CONFIG,
                       "environment variable %s: no config key %s.* has this name%s (JDT_ + key "
                       "path in capitals, '.' -> '_', e.g. JDT_MODEL_N_LAYER)",
                       name, JDT_CONFIG_SECTIONS[sec], hint);
}

/* ---- tree -> struct -------------------------------------------------------------------------- */

static void got_str(char *buf, size_t n_bytes, const cfg_node *v)
{
    if (v->kind != NODE_SCALAR)
        snprintf(buf, n_bytes, "%s", kind_name(v));
    else if (!v->plain)
        snprintf(buf, n_bytes, "the quoted string \"%.80s\"", v->text);
    else if (v->text[0] == '\0')
        snprintf(buf, n_bytes, "nothing");
    else
        snprintf(buf, n_bytes, "'%.80s'", v->text);
}

static bool is_null(const cfg_node *v)
{
    return v->kind == NODE_SCALAR && v->plain &&
           (!v->text[0] || !strcmp(v->text, "~") || !strcmp(v->text, "null") ||
            !strcmp(v->text, "Null") || !strcmp(v->text, "NULL"));
}

static jdt_status type_error_hint(const jdt_config_key *k, const cfg_node *v, const char *what,
                                  const char *hint, jdt_err *e)
{
    char where[512], got[160];
    node_place(where, sizeof where, v, false);
    got_str(got, sizeof got, v);
    return jdt_err_set(e, JDT_ERR_CONFIG, "%s: %s: expected %s, got %s%s", where, k->path, what,
                       got, hint);
}

static jdt_status type_error(const jdt_config_key *k, const cfg_node *v, const char *what,
                             jdt_err *e)
{
    return type_error_hint(k, v, what, "", e);
}

static jdt_status parse_rules(const jdt_config_key *k, const cfg_node *v, jdt_config_rules *out,
                              jdt_err *e)
{
    char where[512], path[160];
    const char *shape = "a list of [logical_axis, mesh_axis | [mesh_axes] | null] pairs";
    jdt_config_rules r = {0, NULL};
    jdt_status st = JDT_OK;
    if (v->kind != NODE_SEQ) return type_error(k, v, shape, e);
    if (v->n) {
        r.rules = jdt_calloc((size_t)v->n, sizeof *r.rules);
        if (!r.rules) return jdt_err_set(e, JDT_ERR_NOMEM, "config: out of memory");
    }
    for (int i = 0; i < v->n; i++) {
        const cfg_node *it = v->items[i];
        jdt_config_rule *rule = &r.rules[r.n_rules];
        snprintf(path, sizeof path, "%s[%d]", k->path, i);
        node_place(where, sizeof where, it, false);
        if (it->kind != NODE_SEQ || it->n != 2 || it->items[0]->kind != NODE_SCALAR ||
            is_null(it->items[0])) {
            st = jdt_err_set(e, JDT_ERR_CONFIG,
                             "%s: %s: expected a pair [logical_axis, mesh_axis | [mesh_axes] | null]",
                             where, path);
            goto out_fail;
        }
        rule->logical = jdt_strdup(it->items[0]->text);
        if (!rule->logical) goto out_nomem;
        r.n_rules++;
        const cfg_node *m = it->items[1];
        int n_axes = is_null(m) ? 0 : m->kind == NODE_SCALAR ? 1 : m->kind == NODE_SEQ ? m->n : -1;
        if (n_axes < 0 || n_axes > JDT_MESH_AXIS_COUNT) {
            node_place(where, sizeof where, m, false);
            st = jdt_err_set(e, JDT_ERR_CONFIG,
                             "%s: %s: expected a mesh axis, a list of up to %d mesh axes or null",
                             where, path, JDT_MESH_AXIS_COUNT);
            goto out_fail;
        }
        for (int j = 0; j < n_axes; j++) {
            const cfg_node *a = m->kind == NODE_SCALAR ? m : m->items[j];
            int found = -1;
            suggester s;
            if (a->kind == NODE_SCALAR) {
                suggest_init(&s, a->text);
                for (int x = 0; x < JDT_MESH_AXIS_COUNT; x++) {
                    const char *nm = jdt_config_mesh_axis_name((jdt_mesh_axis)x);
                    if (strcmp(a->text, nm) == 0) found = x;
                    suggest_try(&s, nm, NULL);
                }
            }
            node_place(where, sizeof where, a, false);
            if (found < 0) {
                char hint[200] = "", got[160];
                if (a->kind == NODE_SCALAR) suggest_hint(&s, hint, sizeof hint);
                got_str(got, sizeof got, a);
                st = jdt_err_set(e, JDT_ERR_CONFIG,
                                 "%s: %s: unknown mesh axis %s (mesh axes: data, fsdp, tensor)%s",
                                 where, path, got, hint);
                goto out_fail;
            }
            for (int q = 0; q < j; q++) {
                if ((int)rule->mesh_axes[q] == found) {
                    st = jdt_err_set(e, JDT_ERR_CONFIG, "%s: %s: mesh axis '%s' listed twice",
                                     where, path, a->text);
                    goto out_fail;
                }
            }
            rule->mesh_axes[j] = (jdt_mesh_axis)found;
        }
        rule->n_mesh_axes = n_axes;
    }
    for (int i = 0; i < out->n_rules; i++) jdt_free(out->rules[i].logical);
    jdt_free(out->rules);
    *out = r;
    return JDT_OK;

out_nomem:
    st = jdt_err_set(e, JDT_ERR_NOMEM, "config: out of memory");
out_fail:
    for (int i = 0; i < r.n_rules; i++) jdt_free(r.rules[i].logical);
    jdt_free(r.rules);
    return st;
}

/* Sets the field of key k in c from node v. */
static jdt_status set_field(const jdt_config_key *k, const cfg_node *v, jdt_config *c, jdt_err *e)
{
    char *field = (char *)c + k->offset;
    char exp[160], what[200];
    jdt_config_key_expect(k, exp, sizeof exp);
    switch (k->type) {
    case JDT_CONFIG_INT:
    case JDT_CONFIG_I64: {
        bool ranged = strstr(exp, "..") != NULL;
        snprintf(what, sizeof what, "an integer %s%s", ranged ? "in " : "", exp);
        if (v->kind != NODE_SCALAR || !v->plain || !v->text[0]) return type_error(k, v, what, e);
        char *end;
        errno = 0;
        long long x = strtoll(v->text, &end, 10);
        const bool too_big = *end == '\0' && (errno == ERANGE || (double)x > k->max);
        if (too_big && !ranged) /* ">= 1" alone misreads 2^31: give the type's bound */
            snprintf(what, sizeof what, "an integer %s and at most %.0f", exp, k->max);
        if (*end != '\0' || errno == ERANGE || (double)x < k->min || (double)x > k->max)
            return type_error(k, v, what, e);
        if (k->type == JDT_CONFIG_INT)
            *(int *)field = (int)x;
        else
            *(int64_t *)field = (int64_t)x;
        return JDT_OK;
    }
    case JDT_CONFIG_FLOAT: {
        bool ranged = exp[0] == '[';
        snprintf(what, sizeof what, "a number %s%s", ranged ? "in " : "", exp);
        if (v->kind != NODE_SCALAR || !v->plain || !v->text[0]) return type_error(k, v, what, e);
        char *end;
        errno = 0;
        double x = strtod(v->text, &end);
        if (*end != '\0' || !isfinite(x) || x < k->min || x > k->max || (k->max_open && x >= k->max))
            return type_error(k, v, what, e);
        *(double *)field = x;
        return JDT_OK;
    }
    case JDT_CONFIG_BOOL: {
        static const char *const yes[] = {"true", "True", "TRUE", "yes", "Yes", "on", "On"};
        static const char *const no[] = {"false", "False", "FALSE", "no", "No", "off", "Off"};
        if (v->kind == NODE_SCALAR && v->plain) {
            for (size_t i = 0; i < JDT_ARRAY_LEN(yes); i++) {
                if (strcmp(v->text, yes[i]) == 0) {
                    *(bool *)field = true;
                    return JDT_OK;
                }
                if (strcmp(v->text, no[i]) == 0) {
                    *(bool *)field = false;
                    return JDT_OK;
                }
            }
        }
        return type_error(k, v, "true or false", e);
    }
    case JDT_CONFIG_STR: {
        if (v->kind != NODE_SCALAR || !valid_utf8(v->text))
            return type_error(k, v, "a string (UTF-8)", e);
        char *s = jdt_strdup(is_null(v) ? "" : v->text);
        if (!s) return jdt_err_set(e, JDT_ERR_NOMEM, "config: out of memory");
        jdt_free(*(char **)field);
        *(char **)field = s;
        return JDT_OK;
    }
    case JDT_CONFIG_ENUM: {
        snprintf(what, sizeof what, "one of %s", exp);
        if (v->kind != NODE_SCALAR) return type_error(k, v, what, e);
        suggester s;
        suggest_init(&s, v->text);
        for (int i = 0; k->choices[i]; i++) {
            if (strcmp(v->text, k->choices[i]) == 0) {
                *(int *)field = k->values ? k->values[i] : i;
                return JDT_OK;
            }
            suggest_try(&s, k->choices[i], NULL);
        }
        char hint[200];
        suggest_hint(&s, hint, sizeof hint);
        return type_error_hint(k, v, what, hint, e);
    }
    case JDT_CONFIG_RULES: return parse_rules(k, v, (jdt_config_rules *)(void *)field, e);
    }
    return jdt_err_set(e, JDT_ERR_INTERNAL, "config: key %s has an unknown type", k->path);
}

static jdt_status set_defaults(jdt_config *c, jdt_err *e)
{
    cfg_src src = {(char *)"(schema default)", false, NULL};
    for (int i = 0; i < jdt_config_schema_count(); i++) {
        const jdt_config_key *k = jdt_config_schema_key(i);
        cfg_node *v;
        jdt_status st = node_from_text(k->def, &src, &v, e);
        if (st) return st;
        st = set_field(k, v, c, e);
        node_free(v);
        if (st) return jdt_err_prefix(e, "internal: schema default of %s", k->path);
    }
    return JDT_OK;
}

static jdt_status apply_tree(loader *ld, const cfg_node *root, jdt_config *c, jdt_err *e)
{
    char where[512], hint[200], path[160];
    for (int i = 0; i < root->n; i++) {
        const cfg_node *sec = root->items[i];
        if (section_index(sec->key) < 0) {
            node_place(where, sizeof where, sec, true);
            hint_for_key(NULL, sec->key, hint, sizeof hint);
            return jdt_err_set(e, JDT_ERR_CONFIG,
                               "%s: %s: unknown section (sections: run, model, mesh, sharding, "
                               "data, optimizer, precision, checkpoint, runtime, dist)%s",
                               where, sec->key, hint);
        }
        if (is_null(sec)) continue;
        if (sec->kind != NODE_MAP) {
            node_place(where, sizeof where, sec, false);
            return jdt_err_set(e, JDT_ERR_CONFIG, "%s: %s: expected a mapping of keys, got %s",
                               where, sec->key, kind_name(sec));
        }
        for (int j = 0; j < sec->n; j++) {
            const cfg_node *v = sec->items[j];
            snprintf(path, sizeof path, "%s.%s", sec->key, v->key);
            const jdt_config_key *k = jdt_config_schema_find(path);
            if (!k) {
                node_place(where, sizeof where, v, true);
                hint_for_key(sec->key, v->key, hint, sizeof hint);
                return jdt_err_set(e, JDT_ERR_CONFIG, "%s: %s: unknown key%s", where, path, hint);
            }
            jdt_status st = set_field(k, v, c, e);
            if (st) return st;
            cfg_pos *p = &ld->pos[jdt_config_key_index(k)];
            p->src = v->src;
            p->line = v->line;
            p->col = v->col;
        }
    }
    return JDT_OK;
}

/* ---- cross-field checks ------------------------------------------------------------------- */

static jdt_status cross_error(loader *ld, const char *path, jdt_err *e, const char *fmt, ...)
    JDT_PRINTF(4, 5);

static jdt_status cross_error(loader *ld, const char *path, jdt_err *e, const char *fmt, ...)
{
    char where[512], msg[1024];
    const jdt_config_key *k = jdt_config_schema_find(path);
    const cfg_pos *p = k ? &ld->pos[jdt_config_key_index(k)] : NULL;
    if (p && p->src)
        place(where, sizeof where, p->src, p->line, p->col);
    else
        snprintf(where, sizeof where, "%s", ld->top_label);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return jdt_err_set(e, JDT_ERR_CONFIG, "%s: %s: %s", where, path, msg);
}

static jdt_status check_cross(loader *ld, jdt_config *c, jdt_err *e)
{
    if (c->model.type == JDT_MODEL_GPT) {
        if (!c->model.head_dim && c->model.n_embd % c->model.n_head)
            return cross_error(ld, "model.n_head", e,
                               "%d heads do not divide model.n_embd = %d (or set model.head_dim)",
                               c->model.n_head, c->model.n_embd);
        int kv = jdt_config_kv_heads(c);
        if (c->model.n_head % kv)
            return cross_error(ld, "model.n_kv_head", e,
                               "%d key/value heads do not divide model.n_head = %d", kv,
                               c->model.n_head);
        if (c->model.pos == JDT_POS_ROPE && jdt_config_head_dim(c) % 2)
            return cross_error(ld, "model.pos", e, "rope needs an even head dim; %s = %d",
                               c->model.head_dim ? "model.head_dim" : "n_embd / n_head",
                               jdt_config_head_dim(c));
        if (c->model.rope_scaling == JDT_ROPE_SCALING_LLAMA3 &&
            !(c->model.rope_low_freq_factor > 0 &&
              c->model.rope_high_freq_factor > c->model.rope_low_freq_factor))
            return cross_error(ld, "model.rope_high_freq_factor", e,
                               "llama3 scaling needs 0 < model.rope_low_freq_factor (%g) < "
                               "model.rope_high_freq_factor (%g)",
                               c->model.rope_low_freq_factor, c->model.rope_high_freq_factor);
        if (c->runtime.loss_chunks > c->model.seq_len)
            return cross_error(ld, "runtime.loss_chunks", e,
                               "%d slices of a sequence of model.seq_len = %d tokens: at most %d",
                               c->runtime.loss_chunks, c->model.seq_len, c->model.seq_len);
    } else if (jdt_config_gated_mlp(c)) {
        return cross_error(ld, "model.activation", e, "%s gates a gpt's MLP; an mlp model takes gelu or relu",
                           jdt_config_choice_name("model.activation", (int)c->model.activation));
    }
    if (c->data.micro_batch_size == 0) c->data.micro_batch_size = c->data.batch_size;
    if (c->data.batch_size % c->data.micro_batch_size)
        return cross_error(ld, "data.micro_batch_size", e, "%d does not divide data.batch_size = %d",
                           c->data.micro_batch_size, c->data.batch_size);
    int *mesh_ax[JDT_MESH_AXIS_COUNT] = {&c->mesh.data, &c->mesh.fsdp, &c->mesh.tensor};
    int fill = -1, known = 1;
    for (int i = 0; i < JDT_MESH_AXIS_COUNT; i++) {
        char key[32];
        snprintf(key, sizeof key, "mesh.%s", jdt_config_mesh_axis_name((jdt_mesh_axis)i));
        if (*mesh_ax[i] == 0) return cross_error(ld, key, e, "expected -1 (fill in) or >= 1, got 0");
        if (*mesh_ax[i] > 0) {
            known *= *mesh_ax[i];
            continue;
        }
        if (fill >= 0)
            return cross_error(ld, key, e, "-1, but mesh.%s is -1 too: at most one axis is filled in",
                               jdt_config_mesh_axis_name((jdt_mesh_axis)fill));
        fill = i;
    }
    if (fill >= 0 && c->dist.world_size > 0) { /* the world size is known: fill the axis in */
        char key[32];
        snprintf(key, sizeof key, "mesh.%s", jdt_config_mesh_axis_name((jdt_mesh_axis)fill));
        if (c->dist.world_size % known)
            return cross_error(ld, key, e, "-1 cannot be filled in: %d processes are not a multiple "
                               "of the other axes' product %d", c->dist.world_size, known);
        *mesh_ax[fill] = c->dist.world_size / known;
    }
    int mesh[JDT_MESH_AXIS_COUNT];
    for (int i = 0; i < JDT_MESH_AXIS_COUNT; i++) mesh[i] = *mesh_ax[i] > 0 ? *mesh_ax[i] : 1;
    for (int i = 0; i < c->sharding.rules.n_rules; i++) {
        const jdt_config_rule *r = &c->sharding.rules.rules[i];
        if (strcmp(r->logical, "batch") != 0) continue;
        int ways = 1;
        char axes[64] = "";
        size_t o = 0;
        for (int j = 0; j < r->n_mesh_axes; j++) {
            ways *= mesh[r->mesh_axes[j]];
            o += (size_t)snprintf(axes + o, sizeof axes - o, "%s%s=%d", j ? " x " : "",
                                  jdt_config_mesh_axis_name(r->mesh_axes[j]), mesh[r->mesh_axes[j]]);
        }
        if (c->data.micro_batch_size % ways)
            return cross_error(ld, "data.micro_batch_size", e,
                               "%d sequences do not split over the %d ways the batch is sharded "
                               "(sharding.rules: batch -> %s)",
                               c->data.micro_batch_size, ways, axes);
        break;
    }
    int n_dev = jdt_config_mesh_size(c);
    if (c->dist.world_size > 0 && n_dev > 0 && c->dist.world_size != n_dev)
        return cross_error(ld, "dist.world_size", e,
                           "%d processes, but the mesh has %d devices (data %d x fsdp %d x tensor %d); "
                           "mesh.data=-1 (or fsdp=-1) fills an axis in from the process count",
                           c->dist.world_size, n_dev, c->mesh.data, c->mesh.fsdp, c->mesh.tensor);
    if (c->dist.world_size == 0)
        return cross_error(ld, "dist.world_size", e, "expected -1 (auto) or >= 1, got 0");
    if (c->dist.rank >= 0 && c->dist.world_size > 0 && c->dist.rank >= c->dist.world_size)
        return cross_error(ld, "dist.rank", e, "%d is not below dist.world_size = %d",
                           c->dist.rank, c->dist.world_size);
    if (c->precision.activations == JDT_DTYPE_BF16 && c->precision.compute != JDT_DTYPE_BF16)
        return cross_error(ld, "precision.activations", e,
                           "bf16 needs precision.compute: bf16 (the GEMMs that write them)");
    if (c->dist.token[0] && c->dist.token_file[0])
        return cross_error(ld, "dist.token_file", e, "set dist.token or dist.token_file, not both");
    if (c->optimizer.decay_steps > 0 && c->optimizer.schedule != JDT_SCHED_CONSTANT &&
        c->optimizer.decay_steps < c->optimizer.warmup_steps)
        return cross_error(ld, "optimizer.decay_steps", e,
                           "%lld ends before optimizer.warmup_steps = %lld",
                           (long long)c->optimizer.decay_steps, (long long)c->optimizer.warmup_steps);
    /* The run builds file names under these paths in fixed buffers: a longer path is refused
     * here rather than cut short there (outputs written to another, truncated, directory). */
    const struct {
        const char *key, *val;
        size_t extra;
    } paths[] = {
        {"run.out_dir", c->run.out_dir, strlen(c->run.name) + 1},
        {"run.name", c->run.name, strlen(c->run.out_dir) + 1},
        {"checkpoint.dir", c->checkpoint.dir, 0},
        {"checkpoint.resume", c->checkpoint.resume, 0},
        {"checkpoint.init_from", c->checkpoint.init_from, 0},
        {"runtime.cache_dir", c->runtime.cache_dir, 0},
        {"data.source", c->data.source, 0},
        {"data.train_path", c->data.train_path, 0},
        {"data.val_path", c->data.val_path, 0},
        {"data.tokenizer_path", c->data.tokenizer_path, 0},
    };
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++)
        if (strlen(paths[i].val) + paths[i].extra > JDT_CONFIG_PATH_MAX)
            return cross_error(ld, paths[i].key, e,
                               "path of %zu characters%s: at most %d are supported",
                               strlen(paths[i].val) + paths[i].extra,
                               paths[i].extra ? " with run.out_dir/run.name" : "",
                               JDT_CONFIG_PATH_MAX);
    return JDT_OK;
}

/* ---- load ----------------------------------------------------------------------------------- */

static jdt_status load_common(const char *label, const char *text, int n_overrides,
                              char *const *overrides, char *const *envp, jdt_config *out, jdt_err *e)
{
    jdt_status st;
    loader ld;
    cfg_node *root = NULL;
    override *ovr = NULL;
    int n_ovr = 0, n_env = 0;
    memset(&ld, 0, sizeof ld);
    memset(out, 0, sizeof *out);
    ld.top_label = label;
    if (jdt_config_schema_count() > MAX_KEYS)
        return jdt_err_set(e, JDT_ERR_INTERNAL, "config: schema has more than %d keys", MAX_KEYS);

    if (envp)
        while (envp[n_env]) n_env++;
    if (n_overrides + n_env > 0) {
        ovr = jdt_calloc((size_t)(n_overrides + n_env), sizeof *ovr);
        if (!ovr) {
            st = jdt_err_set(e, JDT_ERR_NOMEM, "config: out of memory");
            goto out_free;
        }
    }
    /* parse the override syntax first: a typo there should not wait for a slow file */
    for (int i = 0; i < n_overrides; i++) {
        st = parse_cli_override(overrides[i], &ovr[n_ovr], e);
        if (st) goto out_free;
        n_ovr++;
    }
    int n_cli = n_ovr;
    for (int i = 0; i < n_env; i++) {
        override o;
        st = parse_env_override(envp[i], &o, e);
        if (st) goto out_free;
        if (!o.key) continue;
        for (int j = 0; j < n_cli; j++) {
            if (ovr[j].key == o.key) {
                st = jdt_err_set(e, JDT_ERR_CONFIG,
                                 "%s is set both on the command line ('%s') and in the environment "
                                 "(%s); remove one",
                                 o.key->path, ovr[j].text, o.text);
                goto out_free;
            }
        }
        ovr[n_ovr++] = o;
    }

    st = load_tree(&ld, label, text, NULL, &root, e);
    if (st) goto out_free;
    for (int i = 0; i < n_ovr; i++) {
        st = apply_override(&ld, root, &ovr[i], e);
        if (st) goto out_free;
    }
    st = set_defaults(out, e);
    if (st) goto out_free;
    st = apply_tree(&ld, root, out, e);
    if (st) goto out_free;
    st = check_cross(&ld, out, e);
    if (st) goto out_free;
    out->path = jdt_strdup(label);
    if (!out->path) {
        st = jdt_err_set(e, JDT_ERR_NOMEM, "config: out of memory");
        goto out_free;
    }
    out->resolved_yaml = jdt_config_to_yaml(out, e);
    st = out->resolved_yaml ? JDT_OK : e ? e->code : JDT_ERR_NOMEM;

out_free:
    if (st) jdt_config_free(out);
    node_free(root);
    jdt_free(ovr);
    while (ld.srcs) {
        cfg_src *next = ld.srcs->next;
        jdt_free(ld.srcs->label);
        jdt_free(ld.srcs);
        ld.srcs = next;
    }
    return st;
}

jdt_status jdt_config_load(const char *path, int n_overrides, char *const *overrides,
                           char *const *envp, jdt_config *out, jdt_err *e)
{
    return load_common(path, NULL, n_overrides, overrides, envp, out, e);
}

jdt_status jdt_config_load_string(const char *text, const char *label, int n_overrides,
                                  char *const *overrides, char *const *envp, jdt_config *out,
                                  jdt_err *e)
{
    return load_common(label, text, n_overrides, overrides, envp, out, e);
}

void jdt_config_free(jdt_config *c)
{
    if (!c) return;
    for (int i = 0; i < jdt_config_schema_count(); i++) {
        const jdt_config_key *k = jdt_config_schema_key(i);
        char *field = (char *)c + k->offset;
        if (k->type == JDT_CONFIG_STR) {
            jdt_free(*(char **)field);
        } else if (k->type == JDT_CONFIG_RULES) {
            jdt_config_rules *r = (jdt_config_rules *)(void *)field;
            for (int j = 0; j < r->n_rules; j++) jdt_free(r->rules[j].logical);
            jdt_free(r->rules);
        }
    }
    jdt_free(c->path);
    jdt_free(c->resolved_yaml);
    memset(c, 0, sizeof *c);
}
