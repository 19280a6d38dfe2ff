/*
 * json.h — a small, strict JSON reader (RFC 8259) and string writer (prefix jdt_json_).
 *
 * Used for the files other tools hand us: Hugging Face tokenizer.json, GPT-2 encoder.json,
 * safetensors headers, config.json. Strict: no comments, no trailing commas, no leading zeros,
 * strings must be valid UTF-8 (escapes included: a lone surrogate is an error), nesting depth
 * at most 512, nothing but whitespace after the value. Errors name the source and line:col.
 *
 * The parse result is a tree of nodes living in one arena owned by the jdt_json_doc; every
 * pointer into it dies with jdt_json_doc_free. Objects keep their members in file order
 * (duplicate keys are kept; jdt_json_get returns the first).
 */
#ifndef JDT_JSON_H
#define JDT_JSON_H

#include "core/core.h"

#include <stdio.h>

typedef enum {
    JDT_JSON_NULL,
    JDT_JSON_FALSE,
    JDT_JSON_TRUE,
    JDT_JSON_NUMBER,
    JDT_JSON_STRING,
    JDT_JSON_ARRAY,
    JDT_JSON_OBJECT,
} jdt_json_type;

typedef struct jdt_json jdt_json;
struct jdt_json {
    jdt_json_type type;
    size_t len;      /* STRING: bytes (the text may hold NUL); ARRAY/OBJECT: number of children */
    double num;      /* NUMBER */
    const char *str; /* STRING: decoded UTF-8, NUL-terminated */
    const char *key; /* member of an OBJECT: its key (decoded, NUL-terminated) */
    size_t key_len;
    jdt_json *child; /* ARRAY/OBJECT: first child */
    jdt_json *next;  /* next sibling */
};

typedef struct jdt_json_doc jdt_json_doc;

/* Parses n_bytes of text; `what` names the source in error messages ("tokenizer.json").
 * On success *out owns the tree (free with jdt_json_doc_free). Errors: ERR_FORMAT with
 * "what:line:col: problem", ERR_NOMEM. */
jdt_status jdt_json_parse(const char *text, size_t n_bytes, const char *what, jdt_json_doc **out,
                          jdt_err *e);
/* Reads and parses a whole file. Errors as jdt_json_parse plus ERR_NOT_FOUND/ERR_IO. */
jdt_status jdt_json_parse_file(const char *path, jdt_json_doc **out, jdt_err *e);
/* The root value of a parsed document. */
const jdt_json *jdt_json_root(const jdt_json_doc *d);
/* jdt_json_doc_free(NULL) is a no-op. */
void jdt_json_doc_free(jdt_json_doc *d);

/* First member named key of an object, or NULL (also when obj is NULL or not an object). */
const jdt_json *jdt_json_get(const jdt_json *obj, const char *key);
/* The string of a STRING node, or NULL for any other node (or NULL). */
const char *jdt_json_str(const jdt_json *v);
/* True if v is a NUMBER holding an integer in [lo, hi]; then *out is set. */
bool jdt_json_int(const jdt_json *v, int64_t lo, int64_t hi, int64_t *out);

/* Writes s (n bytes of UTF-8) to f as a JSON string literal with quotes, escaping '"', '\\'
 * and control characters; other bytes are copied as they are. */
void jdt_json_write_string(FILE *f, const char *s, size_t n);

/* Reads a whole file into a jdt_malloc'd buffer with a NUL after the last byte. Errors:
 * ERR_NOT_FOUND, ERR_IO, ERR_NOMEM, each naming path. */
jdt_status jdt_io_read_all(const char *path, char **buf, size_t *n_bytes, jdt_err *e);

#endif /* JDT_JSON_H */
