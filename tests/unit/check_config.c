/*
 * check_config.c — unit tests for engine/config: every user-error kind (with its place, key
 * path and hint), base_config inheritance (relative paths, chains, cycles, deep merge),
 * command-line and environment overrides (and their conflict), the YAML round trip, schema
 * completeness, cross-field checks, parameter counts and allocation-failure cleanup.
 * Runs from the repository root (tests/run-all.sh does), so configs/ is reachable.
 */
#include "tests/unit/testutil.h"
#include "config/config.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- helpers ------------------------------------------------------------------------------- */

static void make_tmpdir(void) { tu_tmpdir_make("check-config"); }

static void rm_tmpdir(void) { tu_tmpdir_remove(); }

/* Writes text to <tmpdir>/name (creating one level of sub-folder) and returns the full path in a
 * static buffer rotation of 4. */
static const char *put(const char *name, const char *text)
{
    static char paths[4][256];
    static int slot;
    char *p = paths[slot++ % 4];
    snprintf(p, 256, "%s/%s", tu_tmpdir(), name);
    char *slash = strrchr(p, '/');
    *slash = '\0';
    mkdir(p, 0755);
    *slash = '/';
    FILE *f = fopen(p, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
    return p;
}

/* Loads text; expects JDT_ERR_CONFIG and that the message contains every needle (NULL-ended). */
static void expect_error_v(jdt_status st, const jdt_err *e, const char *const *needles)
{
    ck_assert_msg(st == JDT_ERR_CONFIG, "expected ERR_CONFIG, got %s (%s)", jdt_status_name(st),
                  e->msg);
    for (int i = 0; needles[i]; i++)
        ck_assert_msg(strstr(e->msg, needles[i]) != NULL, "message '%s' lacks '%s'", e->msg,
                      needles[i]);
    ck_assert_msg(strchr(e->msg, '\n') == NULL, "message is not one line: '%s'", e->msg);
}

#define EXPECT_ERROR(st, e, ...)                                                                   \
    do {                                                                                           \
        const char *const needles_[] = {__VA_ARGS__, NULL};                                        \
        expect_error_v((st), (e), needles_);                                                       \
    } while (0)

static jdt_status load_text(const char *text, jdt_config *c, jdt_err *e)
{
    return jdt_config_load_string(text, "t.yaml", 0, NULL, NULL, c, e);
}

/* ---- loading and defaults -------------------------------------------------------------------- */

START_TEST(test_load_tiny)
{
    jdt_config c;
    jdt_err e;
    jdt_status st = jdt_config_load("configs/tiny.yaml", 0, NULL, NULL, &c, &e);
    ck_assert_msg(st == JDT_OK, "%s", e.msg);
    ck_assert_str_eq(c.run.name, "tiny");
    ck_assert_int_eq(c.model.type, JDT_MODEL_GPT);
    ck_assert_int_eq(c.model.n_layer, 2);
    ck_assert_int_eq(c.data.format, JDT_DATA_SYNTHETIC);
    ck_assert_int_eq(c.data.micro_batch_size, 4);
    ck_assert_int_eq(c.precision.compute, JDT_DTYPE_F32);
    ck_assert_double_eq(c.model.init_std, 0.02); /* schema default */
    ck_assert_str_eq(c.path, "configs/tiny.yaml");
    ck_assert_ptr_nonnull(strstr(c.resolved_yaml, "n_layer: 2\n"));
    jdt_config_free(&c);
    jdt_config_free(&c); /* zeroed: a second free is harmless */
    jdt_config_free(NULL);
}
END_TEST

START_TEST(test_all_configs_validate)
{
    const char *files[] = {"configs/tiny.yaml", "configs/llm.yaml", "configs/mlp.yaml",
                           "configs/gpt2-124m.yaml"};
    for (size_t i = 0; i < JDT_ARRAY_LEN(files); i++) {
        jdt_config c;
        jdt_err e;
        jdt_status st = jdt_config_load(files[i], 0, NULL, NULL, &c, &e);
        ck_assert_msg(st == JDT_OK, "%s: %s", files[i], e.msg);
        jdt_config_free(&c);
    }
}
END_TEST

START_TEST(test_empty_is_defaults)
{
    jdt_config a, b;
    jdt_err e;
    ck_assert_int_eq(load_text("", &a, &e), JDT_OK);
    ck_assert_int_eq(load_text("# only a comment\nmodel:\n", &b, &e), JDT_OK);
    ck_assert(jdt_config_equal(&a, &b));
    ck_assert_int_eq(a.model.n_head, 4);
    ck_assert_int_eq(a.data.micro_batch_size, a.data.batch_size); /* 0 resolves to batch_size */
    ck_assert_int_eq(a.sharding.rules.n_rules, 7);
    ck_assert_str_eq(a.sharding.rules.rules[0].logical, "batch");
    ck_assert_int_eq(a.sharding.rules.rules[0].n_mesh_axes, 2);
    ck_assert_int_eq(a.sharding.rules.rules[0].mesh_axes[1], JDT_MESH_FSDP);
    ck_assert_str_eq(a.checkpoint.dir, "");
    jdt_config_free(&a);
    jdt_config_free(&b);
}
END_TEST

/* ---- each error kind ------------------------------------------------------------------------ */

START_TEST(test_unknown_key_hint)
{
    jdt_config c;
    jdt_err e;
    EXPECT_ERROR(load_text("model:\n  n_layr: 4\n", &c, &e), &e, "t.yaml:2:3", "model.n_layr",
                 "unknown key", "did you mean model.n_layer?");
    EXPECT_ERROR(load_text("modle:\n  n_layer: 4\n", &c, &e), &e, "t.yaml:1:1", "modle",
                 "did you mean model?");
    /* right key, wrong section */
    EXPECT_ERROR(load_text("run:\n  lr: 0.1\n", &c, &e), &e, "run.lr", "did you mean optimizer.lr?");
    /* far from everything: no hint */
    EXPECT_ERROR(load_text("run:\n  zzzzzzzzzz: 1\n", &c, &e), &e, "run.zzzzzzzzzz", "unknown key");
    ck_assert_ptr_null(strstr(e.msg, "did you mean"));
    EXPECT_ERROR(load_text("model: 3\n", &c, &e), &e, "t.yaml:1:8", "model", "expected a mapping");
    EXPECT_ERROR(load_text("- 1\n- 2\n", &c, &e), &e, "t.yaml:1:1", "mapping of sections");
}
END_TEST

START_TEST(test_wrong_types)
{
    jdt_config c;
    jdt_err e;
    EXPECT_ERROR(load_text("model:\n  n_layer: four\n", &c, &e), &e, "t.yaml:2:12", "model.n_layer",
                 "expected an integer >= 1", "'four'");
    EXPECT_ERROR(load_text("model:\n  n_layer: 2.5\n", &c, &e), &e, "model.n_layer", "integer");
    EXPECT_ERROR(load_text("model:\n  n_layer: \"4\"\n", &c, &e), &e, "model.n_layer",
                 "quoted string");
    EXPECT_ERROR(load_text("model:\n  bias: maybe\n", &c, &e), &e, "model.bias", "true or false");
    EXPECT_ERROR(load_text("optimizer:\n  lr: fast\n", &c, &e), &e, "optimizer.lr", "a number");
    EXPECT_ERROR(load_text("optimizer:\n  lr: .nan\n", &c, &e), &e, "optimizer.lr", "a number");
    EXPECT_ERROR(load_text("run:\n  name: [a, b]\n", &c, &e), &e, "run.name", "a string", "a list");
    EXPECT_ERROR(load_text("model:\n  activation: gelo\n", &c, &e), &e, "t.yaml:2:15",
                 "model.activation", "one of gelu|swiglu|relu|geglu", "did you mean gelu?");
    EXPECT_ERROR(load_text("precision:\n  params: bf16\n", &c, &e), &e, "precision.params",
                 "one of f32");
    EXPECT_ERROR(load_text("precision:\n  activations: bf16\n", &c, &e), &e,
                 "precision.activations", "needs precision.compute: bf16");
}
END_TEST

START_TEST(test_out_of_range)
{
    jdt_config c;
    jdt_err e;
    EXPECT_ERROR(load_text("model:\n  n_layer: 0\n", &c, &e), &e, "model.n_layer", ">= 1", "'0'");
    EXPECT_ERROR(load_text("model:\n  dropout: 1.0\n", &c, &e), &e, "model.dropout", "[0, 1)");
    EXPECT_ERROR(load_text("model:\n  dropout: -0.1\n", &c, &e), &e, "model.dropout", "[0, 1)");
    EXPECT_ERROR(load_text("dist:\n  port: 70000\n", &c, &e), &e, "dist.port", "0..65535");
    EXPECT_ERROR(load_text("run:\n  seed: 99999999999999999999999\n", &c, &e), &e, "run.seed");
    EXPECT_ERROR(load_text("model:\n  n_layer: 99999999999\n", &c, &e), &e, "model.n_layer");
    ck_assert_int_eq(load_text("model:\n  dropout: 0.999\ndist:\n  port: 65535\n", &c, &e), JDT_OK);
    jdt_config_free(&c);
}
END_TEST

START_TEST(test_duplicate_key)
{
    jdt_config c;
    jdt_err e;
    EXPECT_ERROR(load_text("model:\n  n_layer: 4\n  n_embd: 64\n  n_layer: 5\n", &c, &e), &e,
                 "t.yaml:4:3", "model.n_layer", "duplicate key", "line 2");
    EXPECT_ERROR(load_text("run:\n  steps: 1\nrun:\n  seed: 2\n", &c, &e), &e, "t.yaml:3:1", "run",
                 "duplicate");
}
END_TEST

START_TEST(test_yaml_syntax)
{
    jdt_config c;
    jdt_err e;
    EXPECT_ERROR(load_text("model:\n  n_layer: [1, 2\n", &c, &e), &e, "t.yaml:", "YAML syntax error");
    EXPECT_ERROR(load_text("model:\n\tn_layer: 4\n", &c, &e), &e, "t.yaml:2:", "YAML syntax error");
    EXPECT_ERROR(load_text("run: {a: 1}\n---\nrun: {}\n", &c, &e), &e, "t.yaml:2:1", "second");
    EXPECT_ERROR(load_text("run: &x {steps: 1}\nmodel: *x\n", &c, &e), &e, "t.yaml:2:8", "aliases");
}
END_TEST

START_TEST(test_missing_and_unreadable)
{
    jdt_config c;
    jdt_err e;
    make_tmpdir();
    char path[128];
    snprintf(path, sizeof path, "%s/nope.yaml", tu_tmpdir());
    EXPECT_ERROR(jdt_config_load(path, 0, NULL, NULL, &c, &e), &e, path, "No such file");
    EXPECT_ERROR(jdt_config_load(tu_tmpdir(), 0, NULL, NULL, &c, &e), &e, tu_tmpdir(), "directory");
    const char *child = put("child.yaml", "run:\n  steps: 1\nbase_config: missing.yaml\n");
    EXPECT_ERROR(jdt_config_load(child, 0, NULL, NULL, &c, &e), &e, "child.yaml:3:14",
                 "base_config", "missing.yaml", "No such file");
    const char *bad = put("bad.yaml", "base_config: [a]\n");
    EXPECT_ERROR(jdt_config_load(bad, 0, NULL, NULL, &c, &e), &e, "bad.yaml:1:14", "base_config",
                 "file path");
    rm_tmpdir();
}
END_TEST

/* ---- inheritance ---------------------------------------------------------------------------- */

START_TEST(test_base_config_chain)
{
    jdt_config c;
    jdt_err e;
    make_tmpdir();
    put("base/root.yaml", "run:\n  name: root\n  steps: 10\nmodel:\n  n_layer: 2\n  n_embd: 64\n"
                          "  n_head: 2\nsharding:\n  rules: [[batch, data], [embed, fsdp]]\n");
    put("base/mid.yaml", "base_config: root.yaml\nmodel:\n  n_layer: 3\n  activation: relu\n");
    /* relative to the including file: ../base/mid.yaml from exp/ */
    const char *leaf = put("exp/leaf.yaml", "base_config: ../base/mid.yaml\nrun:\n  steps: 20\n"
                                            "sharding:\n  rules: [[vocab, tensor]]\n");
    jdt_status st = jdt_config_load(leaf, 0, NULL, NULL, &c, &e);
    ck_assert_msg(st == JDT_OK, "%s", e.msg);
    ck_assert_str_eq(c.run.name, "root");   /* from the root, untouched */
    ck_assert_int_eq(c.run.steps, 20);      /* leaf wins */
    ck_assert_int_eq(c.model.n_layer, 3);   /* mid wins over root */
    ck_assert_int_eq(c.model.n_embd, 64);   /* deep merge keeps root's sibling keys */
    ck_assert_int_eq(c.model.activation, JDT_ACT_RELU);
    ck_assert_int_eq(c.sharding.rules.n_rules, 1); /* lists are replaced, not merged */
    ck_assert_str_eq(c.sharding.rules.rules[0].logical, "vocab");
    jdt_config_free(&c);

    /* an error in a base file names that file */
    put("base/root.yaml", "model:\n  n_embd: -1\n");
    EXPECT_ERROR(jdt_config_load(leaf, 0, NULL, NULL, &c, &e), &e, "root.yaml:2:11", "model.n_embd");
    rm_tmpdir();
}
END_TEST

START_TEST(test_base_config_cycle)
{
    jdt_config c;
    jdt_err e;
    make_tmpdir();
    const char *a = put("a.yaml", "base_config: b.yaml\n");
    put("b.yaml", "base_config: sub/c.yaml\n");
    put("sub/c.yaml", "base_config: ../a.yaml\n");
    EXPECT_ERROR(jdt_config_load(a, 0, NULL, NULL, &c, &e), &e, "c.yaml:1:14", "base_config cycle",
                 "a.yaml -> ", "b.yaml -> ", "c.yaml -> ");
    const char *self = put("self.yaml", "run:\n  steps: 3\nbase_config: ./self.yaml\n");
    EXPECT_ERROR(jdt_config_load(self, 0, NULL, NULL, &c, &e), &e, "self.yaml:3:14", "cycle");
    rm_tmpdir();
}
END_TEST

START_TEST(test_gpt2_inherits_llm)
{
    jdt_config llm, gpt;
    jdt_err e;
    ck_assert_int_eq(jdt_config_load("configs/llm.yaml", 0, NULL, NULL, &llm, &e), JDT_OK);
    ck_assert_int_eq(jdt_config_load("configs/gpt2-124m.yaml", 0, NULL, NULL, &gpt, &e), JDT_OK);
    ck_assert_int_eq(gpt.model.n_layer, 12);
    ck_assert_double_eq(gpt.optimizer.beta2, llm.optimizer.beta2);
    ck_assert_double_eq(gpt.optimizer.weight_decay, llm.optimizer.weight_decay);
    ck_assert_int_eq(gpt.run.log_every, llm.run.log_every);
    jdt_config_free(&llm);
    jdt_config_free(&gpt);
}
END_TEST

static void check_round_trip(const jdt_config *a);

/* ---- overrides -------------------------------------------------------------------------------- */

START_TEST(test_cli_overrides)
{
    jdt_config c;
    jdt_err e;
    char *ov[] = {"model.n_layer=7", "run.name=a: b", "optimizer.lr=1e-3",
                  "sharding.rules=[[batch, [data, fsdp, tensor]], [mlp, null]]", "run.name=final"};
    jdt_status st = jdt_config_load("configs/tiny.yaml", 5, ov, NULL, &c, &e);
    ck_assert_msg(st == JDT_OK, "%s", e.msg);
    ck_assert_int_eq(c.model.n_layer, 7);
    ck_assert_str_eq(c.run.name, "final"); /* later override wins */
    ck_assert_double_eq(c.optimizer.lr, 1e-3);
    ck_assert_int_eq(c.sharding.rules.n_rules, 2);
    ck_assert_int_eq(c.sharding.rules.rules[0].n_mesh_axes, 3);
    ck_assert_int_eq(c.sharding.rules.rules[1].n_mesh_axes, 0);
    jdt_config_free(&c);
    char *bad_utf8[] = {"run.name=\xff\xfe"};
    EXPECT_ERROR(jdt_config_load("configs/tiny.yaml", 1, bad_utf8, NULL, &c, &e), &e,
                 "run.name", "UTF-8");
    char *ctrl[] = {"run.name=a\x01b"};
    ck_assert_int_eq(jdt_config_load("configs/tiny.yaml", 1, ctrl, NULL, &c, &e), JDT_OK);
    check_round_trip(&c);
    jdt_config_free(&c);
    char *colon[] = {"run.name=a: b"};
    ck_assert_int_eq(jdt_config_load("configs/tiny.yaml", 1, colon, NULL, &c, &e), JDT_OK);
    ck_assert_str_eq(c.run.name, "a: b");
    jdt_config_free(&c);
}
END_TEST

START_TEST(test_bad_override_syntax)
{
    jdt_config c;
    jdt_err e;
    char *cases[][2] = {
        {"model.n_layer", "expected section.key=value"},
        {"=4", "expected section.key=value"},
        {"n_layer=4", "expected section.key=value"},
        {"model.n_layer.x=4", "expected section.key=value"},
        {"model.n_layr=4", "did you mean model.n_layer?"},
        {"modl.n_layer=4", "did you mean model?"},
        {"model.n_layer=x", "expected an integer"},
        {"sharding.rules=[[batch, tensr]]", "did you mean tensor?"},
        {"sharding.rules=[[batch", "YAML syntax error"},
    };
    for (size_t i = 0; i < JDT_ARRAY_LEN(cases); i++) {
        char *ov[] = {cases[i][0]};
        char quoted[128];
        snprintf(quoted, sizeof quoted, "override '%s'", cases[i][0]);
        EXPECT_ERROR(jdt_config_load("configs/tiny.yaml", 1, ov, NULL, &c, &e), &e, quoted,
                     cases[i][1]);
    }
}
END_TEST

START_TEST(test_env_overrides)
{
    jdt_config c;
    jdt_err e;
    char *env[] = {"PATH=/bin", "JDT_BIN=/x/jdt-train", "JDT_TOKEN=abc", "JDT_RUNS=1",
                   "JDT_MODEL_N_LAYER=5", "JDT_OPTIMIZER_LR=0.5", "JDT_RUNTIME_THREADS=3", NULL};
    jdt_status st = jdt_config_load("configs/tiny.yaml", 0, NULL, env, &c, &e);
    ck_assert_msg(st == JDT_OK, "%s", e.msg);
    ck_assert_int_eq(c.model.n_layer, 5);
    ck_assert_double_eq(c.optimizer.lr, 0.5);
    ck_assert_int_eq(c.runtime.threads, 3);
    jdt_config_free(&c);

    char *bad_val[] = {"JDT_MODEL_N_LAYER=many", NULL};
    EXPECT_ERROR(jdt_config_load("configs/tiny.yaml", 0, NULL, bad_val, &c, &e), &e,
                 "environment variable JDT_MODEL_N_LAYER=many", "model.n_layer", "integer");
    char *unknown[] = {"JDT_MODEL_NLAYER=3", NULL};
    EXPECT_ERROR(jdt_config_load("configs/tiny.yaml", 0, NULL, unknown, &c, &e), &e,
                 "JDT_MODEL_NLAYER", "did you mean JDT_MODEL_N_LAYER?");
    /* the same key both ways is an error, whichever value */
    char *both_env[] = {"JDT_MODEL_N_LAYER=3", NULL};
    char *both_cli[] = {"model.n_layer=3"};
    EXPECT_ERROR(jdt_config_load("configs/tiny.yaml", 1, both_cli, both_env, &c, &e), &e,
                 "model.n_layer", "both", "model.n_layer=3", "JDT_MODEL_N_LAYER=3");
    /* different keys both ways are fine */
    char *other_cli[] = {"model.n_embd=128"};
    ck_assert_int_eq(jdt_config_load("configs/tiny.yaml", 1, other_cli, both_env, &c, &e), JDT_OK);
    ck_assert_int_eq(c.model.n_layer, 3);
    ck_assert_int_eq(c.model.n_embd, 128);
    jdt_config_free(&c);
}
END_TEST

/* ---- round trip ------------------------------------------------------------------------------ */

static void check_round_trip(const jdt_config *a)
{
    jdt_config b;
    jdt_err e;
    jdt_status st = jdt_config_load_string(a->resolved_yaml, "resolved.yaml", 0, NULL, NULL, &b, &e);
    ck_assert_msg(st == JDT_OK, "%s\n%s", e.msg, a->resolved_yaml);
    ck_assert(jdt_config_equal(a, &b));
    ck_assert_str_eq(a->resolved_yaml, b.resolved_yaml);
    char *again = jdt_config_to_yaml(&b, &e);
    ck_assert_str_eq(again, a->resolved_yaml);
    jdt_free(again);
    jdt_config_free(&b);
}

START_TEST(test_round_trip)
{
    const char *files[] = {"configs/tiny.yaml", "configs/llm.yaml", "configs/mlp.yaml",
                           "configs/gpt2-124m.yaml"};
    for (size_t i = 0; i < JDT_ARRAY_LEN(files); i++) {
        jdt_config c;
        jdt_err e;
        ck_assert_int_eq(jdt_config_load(files[i], 0, NULL, NULL, &c, &e), JDT_OK);
        check_round_trip(&c);
        jdt_config_free(&c);
    }
    /* awkward values: quotes, backslashes, control chars, UTF-8, yaml-looking strings, floats
     * that have no short decimal form, an empty rule list */
    jdt_config c;
    jdt_err e;
    const char *text = "run:\n  name: \"a \\\"q\\\" \\\\ b\\tc\\nd: e # f\"\n  out_dir: 'héllo: [x]'\n"
                       "data:\n  source: \"null\"\n  train_path: \"123\"\n  val_path: \"true\"\n"
                       "optimizer:\n  lr: 0.1\n  eps: 3.0000000000000004e-08\n  beta2: 0.9990000000000001\n"
                       "model:\n  init_std: 0.0123456789012345678\n"
                       "sharding:\n  rules: []\n";
    jdt_status st = load_text(text, &c, &e);
    ck_assert_msg(st == JDT_OK, "%s", e.msg);
    ck_assert_str_eq(c.run.name, "a \"q\" \\ b\tc\nd: e # f");
    ck_assert_str_eq(c.data.source, "null");
    ck_assert_int_eq(c.sharding.rules.n_rules, 0);
    check_round_trip(&c);
    jdt_config_free(&c);
}
END_TEST

/* ---- schema ------------------------------------------------------------------------------- */

static int cmp_size(const void *a, const void *b)
{
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

static size_t field_size(const jdt_config_key *k)
{
    switch (k->type) {
    case JDT_CONFIG_INT:
    case JDT_CONFIG_ENUM: return sizeof(int);
    case JDT_CONFIG_I64: return sizeof(int64_t);
    case JDT_CONFIG_FLOAT: return sizeof(double);
    case JDT_CONFIG_BOOL: return sizeof(bool);
    case JDT_CONFIG_STR: return sizeof(char *);
    case JDT_CONFIG_RULES: return sizeof(jdt_config_rules);
    }
    return 0;
}

START_TEST(test_schema_complete)
{
    const char *sections[] = {"run", "model", "mesh", "sharding", "data", "optimizer",
                              "precision", "checkpoint", "runtime", "dist"};
    int n = jdt_config_schema_count();
    ck_assert_int_gt(n, 60);
    ck_assert_ptr_null(jdt_config_schema_key(n));
    ck_assert_ptr_null(jdt_config_schema_key(-1));
    size_t spans[256][2];
    ck_assert_int_le(n, 256);
    for (int i = 0; i < n; i++) {
        const jdt_config_key *k = jdt_config_schema_key(i);
        ck_assert_msg(k->doc && strlen(k->doc) > 5, "%s has no doc", k->path);
        ck_assert_ptr_nonnull(k->def);
        ck_assert_ptr_eq(jdt_config_schema_find(k->path), k);
        bool known = false;
        for (size_t s = 0; s < JDT_ARRAY_LEN(sections); s++)
            known |= strncmp(k->path, sections[s], strlen(sections[s])) == 0 &&
                     k->path[strlen(sections[s])] == '.';
        ck_assert_msg(known, "%s is in no section", k->path);
        if (k->type == JDT_CONFIG_ENUM) ck_assert_ptr_nonnull(k->choices);
        spans[i][0] = k->offset;
        spans[i][1] = k->offset + field_size(k);
        ck_assert_uint_le(spans[i][1], offsetof(jdt_config, path));
        /* environment names are unique */
        char env_i[96], env_j[96];
        jdt_config_env_name(k, env_i, sizeof env_i);
        ck_assert_int_eq(strncmp(env_i, "JDT_", 4), 0);
        for (int j = 0; j < i; j++) {
            jdt_config_env_name(jdt_config_schema_key(j), env_j, sizeof env_j);
            ck_assert_msg(strcmp(env_i, env_j) != 0, "env name %s collides", env_i);
        }
    }
    /* every key owns a distinct, non-overlapping field */
    qsort(spans, (size_t)n, sizeof spans[0], cmp_size);
    for (int i = 1; i < n; i++)
        ck_assert_msg(spans[i][0] >= spans[i - 1][1], "fields overlap at offset %zu", spans[i][0]);
    for (size_t s = 0; s < JDT_ARRAY_LEN(sections); s++) {
        bool has = false;
        for (int i = 0; i < n; i++)
            has |= strncmp(jdt_config_schema_key(i)->path, sections[s], strlen(sections[s])) == 0;
        ck_assert_msg(has, "section %s has no keys", sections[s]);
    }
    /* the keys other subsystems code against exist */
    const char *required[] = {"run.steps", "model.n_kv_head", "mesh.fsdp", "sharding.rules",
                              "data.micro_batch_size", "optimizer.nan_policy", "precision.compute",
                              "checkpoint.save_on_signal", "runtime.remat", "dist.peer_timeout_s"};
    for (size_t i = 0; i < JDT_ARRAY_LEN(required); i++)
        ck_assert_msg(jdt_config_schema_find(required[i]) != NULL, "%s missing", required[i]);

    /* --schema output lists every key, with its default and env name */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    jdt_config_print_schema(f);
    fclose(f);
    for (int i = 0; i < n; i++) {
        const jdt_config_key *k = jdt_config_schema_key(i);
        char env[96];
        jdt_config_env_name(k, env, sizeof env);
        ck_assert_msg(strstr(buf, k->path) != NULL, "schema output lacks %s", k->path);
        ck_assert_msg(strstr(buf, env) != NULL, "schema output lacks %s", env);
    }
    free(buf);
    /* every key appears in the resolved YAML */
    jdt_config c;
    jdt_err e;
    ck_assert_int_eq(load_text("", &c, &e), JDT_OK);
    for (int i = 0; i < n; i++) {
        const char *leaf = strchr(jdt_config_schema_key(i)->path, '.') + 1;
        char needle[80];
        snprintf(needle, sizeof needle, "\n  %s:", leaf);
        ck_assert_msg(strstr(c.resolved_yaml, needle) != NULL, "yaml lacks %s", leaf);
    }
    jdt_config_free(&c);
}
END_TEST

/* ---- cross-field checks and derived values -------------------------------------------------- */

START_TEST(test_cross_field)
{
    jdt_config c;
    jdt_err e;
    EXPECT_ERROR(load_text("model:\n  n_embd: 100\n  n_head: 3\n", &c, &e), &e, "t.yaml:3:11",
                 "model.n_head", "n_embd = 100");
    EXPECT_ERROR(load_text("model:\n  n_head: 4\n  n_kv_head: 3\n", &c, &e), &e, "model.n_kv_head");
    /* a head width of its own frees n_embd from n_head (Qwen3-0.6B: C 1024, 16 heads of 128) */
    ck_assert_int_eq(load_text("model:\n  n_embd: 100\n  n_head: 3\n  head_dim: 32\n", &c, &e), JDT_OK);
    ck_assert_int_eq(jdt_config_head_dim(&c), 32);
    jdt_config_free(&c);
    EXPECT_ERROR(load_text("model:\n  pos: rope\n  head_dim: 15\n", &c, &e), &e, "model.pos",
                 "model.head_dim = 15");
    /* a gated activation is a gpt's: an mlp model would silently compute another */
    EXPECT_ERROR(load_text("model:\n  type: mlp\n  activation: geglu\n", &c, &e), &e, "t.yaml:3:15",
                 "model.activation", "geglu gates a gpt's MLP");
    EXPECT_ERROR(load_text("data:\n  batch_size: 32\n  micro_batch_size: 5\n", &c, &e), &e,
                 "t.yaml:3:21", "data.micro_batch_size", "batch_size = 32");
    EXPECT_ERROR(load_text("mesh:\n  data: 3\ndata:\n  batch_size: 32\n", &c, &e), &e,
                 "data.micro_batch_size", "data=3");
    EXPECT_ERROR(load_text("mesh:\n  fsdp: 2\ndist:\n  world_size: 4\n", &c, &e), &e, "dist.world_size",
                 "mesh has 2 devices");
    EXPECT_ERROR(load_text("mesh:\n  data: 2\ndist:\n  world_size: 2\n  rank: 2\n", &c, &e), &e, "dist.rank");
    /* defaults position: the message names the file */
    char *ov[] = {"mesh.tensor=3", "sharding.rules=[[batch, tensor]]"};
    EXPECT_ERROR(jdt_config_load_string("", "t.yaml", 2, ov, NULL, &c, &e), &e, "data.micro_batch_size",
                 "tensor=3");
    /* batch not sharded over data: a data axis of 3 is fine */
    ck_assert_int_eq(load_text("mesh:\n  data: 3\ndata:\n  batch_size: 32\nsharding:\n  rules: [[batch, fsdp]]\n",
                               &c, &e),
                     JDT_OK);
    jdt_config_free(&c);
}
END_TEST

/* The keys a job's ranks must agree on: per-process keys are skipped, the first other
 * difference is named, values read back as one line (jdt_world_agree's message). */
START_TEST(test_first_difference)
{
    jdt_config a, b;
    jdt_err e;
    ck_assert_int_eq(load_text("runtime: {threads: 2}\n", &a, &e), JDT_OK);
    ck_assert_int_eq(load_text("runtime: {threads: 1, cache_dir: /x}\ndist: {rank: 1}\n"
                               "data: {train_path: /a.h5}\n",
                               &b, &e),
                     JDT_OK);
    ck_assert_ptr_null(jdt_config_first_difference(&a, &b, true));
    const jdt_config_key *k = jdt_config_first_difference(&a, &b, false);
    ck_assert_ptr_nonnull(k);
    ck_assert_str_eq(k->path, "data.train_path");
    jdt_config_free(&b);
    ck_assert_int_eq(load_text("optimizer: {lr: 0.002}\nsharding: {rules: [[batch, [data, fsdp]],"
                               " [mlp, null]]}\nruntime: {threads: 1}\n",
                               &b, &e),
                     JDT_OK);
    k = jdt_config_first_difference(&a, &b, true);
    ck_assert_ptr_nonnull(k);
    ck_assert_str_eq(k->path, "sharding.rules"); /* schema order: sharding before optimizer */
    char buf[128];
    jdt_config_value_text(k, &b, buf, sizeof buf);
    ck_assert_str_eq(buf, "[[\"batch\", [data, fsdp]], [\"mlp\", null]]");
    jdt_config_value_text(jdt_config_schema_find("optimizer.lr"), &b, buf, sizeof buf);
    ck_assert_str_eq(buf, "0.002");
    jdt_config_value_text(jdt_config_schema_find("run.name"), &b, buf, 5);
    ck_assert_str_eq(buf, "\"run"); /* truncated, terminated */
    jdt_config_free(&b);
    ck_assert_int_eq(load_text("sharding: {rules: []}\n", &b, &e), JDT_OK);
    jdt_config_value_text(jdt_config_schema_find("sharding.rules"), &b, buf, sizeof buf);
    ck_assert_str_eq(buf, "[]");
    jdt_config_free(&a);
    jdt_config_free(&b);
    /* every listed per-process key names a schema key or section, and none of the keys that
     * shape the computation is among them */
    for (int i = 0; jdt_config_per_process_key(i); i++) {
        const char *p = jdt_config_per_process_key(i);
        size_t n = strlen(p);
        bool found = false;
        for (int j = 0; j < jdt_config_schema_count() && !found; j++)
            found = p[n - 1] == '.' ? strncmp(jdt_config_schema_key(j)->path, p, n) == 0
                                    : strcmp(jdt_config_schema_key(j)->path, p) == 0;
        ck_assert_msg(found, "per-process key %s is not in the schema", p);
    }
    const char *job[] = {"model.n_layer", "mesh.data", "sharding.rules", "data.batch_size",
                         "optimizer.lr", "precision.compute", "run.seed", "checkpoint.dir",
                         "runtime.backend", "runtime.bucket_mb", "runtime.remat"};
    for (size_t i = 0; i < JDT_ARRAY_LEN(job); i++)
        ck_assert_msg(!jdt_config_key_per_process(jdt_config_schema_find(job[i])), "%s", job[i]);
}
END_TEST

START_TEST(test_param_count)
{
    jdt_config c;
    jdt_err e;
    /* GPT-2 small: 124,439,808 parameters with the 50257-token vocabulary (published figure) */
    const char *gpt2 = "model:\n  vocab_size: 50257\n  seq_len: 1024\n  n_layer: 12\n  n_embd: 768\n"
                       "  n_head: 12\n";
    ck_assert_int_eq(load_text(gpt2, &c, &e), JDT_OK);
    ck_assert_int_eq(jdt_config_param_count(&c), 124439808LL);
    jdt_config_free(&c);
    /* MLP 784-256-256-10 with biases: 200,960 + 65,792 + 2,570 */
    ck_assert_int_eq(jdt_config_load("configs/mlp.yaml", 0, NULL, NULL, &c, &e), JDT_OK);
    ck_assert_int_eq(jdt_config_param_count(&c), 269322);
    jdt_config_free(&c);
    /* untying adds exactly a (C, V) head; rope drops the (T, C) position table */
    ck_assert_int_eq(load_text(gpt2, &c, &e), JDT_OK);
    int64_t tied = jdt_config_param_count(&c);
    c.model.tie_embeddings = false;
    ck_assert_int_eq(jdt_config_param_count(&c) - tied, 768LL * 50257);
    c.model.tie_embeddings = true;
    c.model.pos = JDT_POS_ROPE;
    ck_assert_int_eq(tied - jdt_config_param_count(&c), 1024LL * 768);
    jdt_config_free(&c);
}
END_TEST

START_TEST(test_alloc_failure_cleanup)
{
    /* fail the n-th allocation for every n a successful load makes: each must return NOMEM
     * cleanly (ASan/LSan catch leaks and bad frees) or succeed once n runs past the count */
    char *ov[] = {"model.n_layer=3", "sharding.rules=[[batch, data]]", "dist.port=5"};
    char *env[] = {"JDT_RUN_STEPS=4", NULL};
    int n_ok = 0;
    for (long n = 1; n < 5000 && n_ok == 0; n++) {
        jdt_config c;
        jdt_err e;
        jdt_alloc_fail_after(n);
        jdt_status st = jdt_config_load("configs/gpt2-124m.yaml", 3, ov, env, &c, &e);
        jdt_alloc_fail_after(0);
        if (st == JDT_OK) {
            n_ok++;
            ck_assert_int_eq(c.model.n_layer, 3);
            jdt_config_free(&c);
        } else {
            ck_assert_msg(st == JDT_ERR_NOMEM, "n=%ld: %s", n, e.msg);
        }
    }
    ck_assert_int_eq(n_ok, 1);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("config");
    TCase *tc = tcase_create("config");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_load_tiny);
    tcase_add_test(tc, test_all_configs_validate);
    tcase_add_test(tc, test_empty_is_defaults);
    tcase_add_test(tc, test_unknown_key_hint);
    tcase_add_test(tc, test_wrong_types);
    tcase_add_test(tc, test_out_of_range);
    tcase_add_test(tc, test_duplicate_key);
    tcase_add_test(tc, test_yaml_syntax);
    tcase_add_test(tc, test_missing_and_unreadable);
    tcase_add_test(tc, test_base_config_chain);
    tcase_add_test(tc, test_base_config_cycle);
    tcase_add_test(tc, test_gpt2_inherits_llm);
    tcase_add_test(tc, test_cli_overrides);
    tcase_add_test(tc, test_bad_override_syntax);
    tcase_add_test(tc, test_env_overrides);
    tcase_add_test(tc, test_round_trip);
    tcase_add_test(tc, test_schema_complete);
    tcase_add_test(tc, test_cross_field);
    tcase_add_test(tc, test_first_difference);
    tcase_add_test(tc, test_param_count);
    tcase_add_test(tc, test_alloc_failure_cleanup);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
