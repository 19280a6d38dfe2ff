/*
 * bpe.c — byte-level BPE (see bpe.h): loading tokenizer.json / vocab.bpe + encoder.json,
 * encoding (PCRE2 pre-tokenizer, rank-ordered merges with a heap, a piece cache), decoding,
 * training and writing tokenizer.json.
 *
 * Tokens are kept as raw bytes (the ByteLevel alphabet's characters mapped back to the bytes
 * they stand for), so decoding is concatenation and the merge tables work on ids only.
 *
 * SentencePiece-style BPE (Llama 2, Mistral, Gemma: model.byte_fallback, "▁" for a space, no
 * ByteLevel) is kept the same way: a token's "▁" is stored as the space it stands for and
 * "<0xNN>" as byte NN, so decoding is concatenation too. Its pieces start from the text's
 * characters (those the vocabulary lacks become their bytes' <0xNN> tokens), not its bytes.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "datasets/bpe.h"
#include "io/json.h"

#include <ctype.h>
#include <errno.h>
#include <pcre2.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum {
    CACHE_SLOTS = 1 << 16,        /* piece cache: open-addressing slots (power of two) */
    CACHE_MAX_PIECE = 128,        /* longer pieces are not cached */
    CACHE_ARENA = 4 << 20,        /* bytes of keys/ids before the cache is cleared */
    MAX_ID = (1 << 30),           /* ids must stay below this */
};
/* spm_prepend: none; the Prepend("▁") normalizer (every segment, even one starting with "▁");
 * Metaspace's prepend_scheme always, first (a segment not starting with "▁"; first: only the
 * text's first) */
enum { PREPEND_NONE, PREPEND_NORMALIZER, PREPEND_ALWAYS, PREPEND_FIRST };
#define SPM_SPACE "\xE2\x96\x81" /* U+2581 LOWER ONE EIGHTH BLOCK, SentencePiece's space */

/* The bytes of the space at s[i] of s[0..n): 1 for ' ', 3 for a literal "▁" (which a
 * SentencePiece-style file's normalizer leaves as its space), 0 for none. */
static inline int spm_space_len(const char *s, size_t i, size_t n)
{
    if (s[i] == ' ') return 1;
    return i + 3 <= n && memcmp(s + i, SPM_SPACE, 3) == 0 ? 3 : 0;
}

/* Whether s[0..n) is a byte-fallback token "<0xNN>" (its byte into *b). */
static bool spm_byte_token(const char *s, size_t n, unsigned *b)
{
    if (n != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>' || !isxdigit((unsigned char)s[3]) ||
        !isxdigit((unsigned char)s[4]))
        return false;
    return sscanf(s + 3, "%2X", b) == 1;
}
#define NONE UINT32_MAX
#define EMPTY_KEY UINT64_MAX

typedef struct {
    uint32_t id;
    uint32_t off, len; /* content in the blob */
    bool special;
} added_tok;

typedef struct {
    uint64_t hash;
    uint32_t key_off, key_len; /* bytes in cache_bytes */
    uint32_t ids_off, n_ids;   /* ids in cache_ids */
} cache_slot;

typedef struct {
    uint32_t rank, pos;
} heap_ent;

struct jdt_bpe {
    int n_vocab;
    uint32_t *tok_off, *tok_len; /* [n_vocab] raw bytes of each id in blob */
    uint8_t *is_added;           /* [n_vocab] */
    char *blob;
    size_t blob_len, blob_cap;
    uint32_t byte_id[256]; /* id of each single byte */

    uint32_t *vmap; /* raw bytes -> id for ordinary (not added) tokens; NONE = empty */
    size_t vmap_cap;

    uint64_t *mkey, *mval; /* merges: (a << 32 | b) -> (rank << 32 | merged id) */
    size_t mcap;
    uint32_t *merge_a, *merge_b; /* by rank */
    int n_merges;

    added_tok *added;
    int n_added;
    uint8_t added_first[256]; /* 1 if some added token starts with this byte */

    char *regex; /* NULL: no split, each segment is one piece */
    bool add_prefix_space, ignore_merges;
    pcre2_code *re;
    pcre2_match_data *md;
    bool jit;

    char *json_text; /* the tokenizer.json this was loaded from, if any */
    size_t json_len;
    /* the special tokens its post-processor's template puts before a text (JDT_BPE_MAX_PREFIX
     * at most); n_prefix -1 when the template names a token that is not an added one */
    uint32_t prefix_ids[JDT_BPE_MAX_PREFIX];
    int n_prefix;
    char prefix_bad[64];

    cache_slot *cache;
    size_t cache_used;
    char *cache_bytes;
    size_t cb_len;
    uint32_t *cache_ids;
    size_t ci_len;

    /* scratch for merging one piece */
    uint32_t *s_id;
    int32_t *s_prev, *s_next;
    heap_ent *heap;
    size_t s_cap;
    char *prefix_buf;
    size_t prefix_cap;

    /* SentencePiece-style BPE (spm): the <0xNN> ids (byte_id holds them), "▁" stored as ' ' */
    bool spm;
    uint8_t *is_fb; /* [n_vocab] 1 for a <0xNN> byte-fallback token (kept out of vmap) */
    int spm_prepend; /* PREPEND_*: where a "▁" goes before a segment */
    bool spm_split;  /* Metaspace split: a piece starts at each "▁" */
    bool spm_words;  /* no token holds a "▁" after another character: a piece starts at each
                      * "▁" after another character, as no merge can cross there */
    bool seg_first;  /* the segment being split starts the text */
    bool spm_replaced; /* a Replace(" " -> "▁") normalizer: no space reaches the pre-tokenizer */

    /* normalizer NFC (Qwen2): ICU, applied to each segment between added tokens */
    const UNormalizer2 *nfc;
    UChar *u16_in, *u16_out;
    char *nfc_buf;
    size_t nfc_cap; /* bytes of input the buffers are sized for */

    /* progress of a long encode or count (jdt_bpe_set_progress): MB of the caller's text done */
    jdt_progress *prog;
    size_t prog_seg_base, prog_seg_len; /* the current segment in the caller's text */
    size_t prog_next;                   /* report again once the split reaches this offset */
};

/* ---- the ByteLevel alphabet ---------------------------------------------------------------- */

/* GPT-2's bytes_to_unicode: printable bytes stand for themselves, the other 68 bytes are
 * U+0100.. in byte order. */
static unsigned byte_to_cp(unsigned b)
{
    static unsigned table[256];
    static int ready; /* computed on first use; the same values on every thread */
    if (!ready) {
        unsigned n = 0;
        for (unsigned i = 0; i < 256; i++) {
            bool printable = (i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174);
            table[i] = printable ? i : 256 + n++;
        }
        ready = 1;
    }
    return table[b];
}

static int cp_to_byte(unsigned cp)
{
    if (cp < 256) {
        bool printable = (cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174);
        return printable ? (int)cp : -1;
    }
    if (cp < 256 + 68) { /* the n-th non-printable byte */
        unsigned n = cp - 256;
        for (unsigned i = 0; i < 256; i++) {
            bool printable = (i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174);
            if (!printable && n-- == 0) return (int)i;
        }
    }
    return -1;
}

/* Maps a ByteLevel-alphabet UTF-8 string back to raw bytes (out holds at least n bytes).
 * Returns the byte count, or -1 if s has a character outside the alphabet. */
static long from_byte_level(const char *s, size_t n, char *out)
{
    size_t o = 0;
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned cp;
        int l;
        if (p[i] < 0x80) {
            cp = p[i];
            l = 1;
        } else if ((p[i] & 0xE0) == 0xC0 && i + 1 < n) {
            cp = ((p[i] & 0x1Fu) << 6) | (p[i + 1] & 0x3Fu);
            l = 2;
        } else {
            return -1;
        }
        int b = cp_to_byte(cp);
        if (b < 0) return -1;
        out[o++] = (char)b;
        i += (size_t)l;
    }
    return (long)o;
}

/* Writes raw bytes as the ByteLevel alphabet's UTF-8 into f. */
static void put_byte_level(FILE *f, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned cp = byte_to_cp((unsigned char)s[i]);
        if (cp < 0x80) {
            if (cp == '"' || cp == '\\') fputc('\\', f);
            fputc((int)cp, f);
        } else {
            fputc((int)(0xC0 | (cp >> 6)), f);
            fputc((int)(0x80 | (cp & 0x3F)), f);
        }
    }
}

/* ---- hashing and tables ------------------------------------------------------------------- */

static inline uint64_t hash_bytes(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0x100000001b3ull);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        h = (h ^ v) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    uint64_t v = 0;
    memcpy(&v, p, n);
    h = (h ^ v) * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 29;
    return h;
}

static inline uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n) c <<= 1;
    return c;
}

static uint32_t vmap_find(const jdt_bpe *t, const char *s, size_t n)
{
    if (!t->vmap) return NONE;
    size_t mask = t->vmap_cap - 1;
    for (size_t i = hash_bytes(s, n) & mask;; i = (i + 1) & mask) {
        uint32_t id = t->vmap[i];
        if (id == NONE) return NONE;
        if (t->tok_len[id] == n && memcmp(t->blob + t->tok_off[id], s, n) == 0) return id;
    }
}

/* Builds vmap over every ordinary id; a duplicate byte string is an error (returns its id). */
static jdt_status vmap_build(jdt_bpe *t, const char *what, jdt_err *e)
{
    t->vmap_cap = pow2_at_least((size_t)t->n_vocab * 2 + 16);
    t->vmap = jdt_malloc(t->vmap_cap * sizeof *t->vmap);
    if (!t->vmap) return jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", what);
    memset(t->vmap, 0xFF, t->vmap_cap * sizeof *t->vmap);
    size_t mask = t->vmap_cap - 1;
    for (int id = 0; id < t->n_vocab; id++) {
        if (t->is_added[id] || t->tok_off[id] == NONE || (t->is_fb && t->is_fb[id])) continue;
        const char *s = t->blob + t->tok_off[id];
        size_t n = t->tok_len[id];
        size_t i = hash_bytes(s, n) & mask;
        for (; t->vmap[i] != NONE; i = (i + 1) & mask) {
            uint32_t o = t->vmap[i];
            if (t->tok_len[o] == n && memcmp(t->blob + t->tok_off[o], s, n) == 0)
                return jdt_err_set(e, JDT_ERR_FORMAT, "%s: ids %u and %d are the same token", what,
                                   o, id);
        }
        t->vmap[i] = (uint32_t)id;
    }
    return JDT_OK;
}

static bool merge_find(const jdt_bpe *t, uint32_t a, uint32_t b, uint32_t *rank, uint32_t *id)
{
    uint64_t k = (uint64_t)a << 32 | b;
    size_t mask = t->mcap - 1;
    for (size_t i = hash_u64(k) & mask;; i = (i + 1) & mask) {
        if (t->mkey[i] == EMPTY_KEY) return false;
        if (t->mkey[i] == k) {
            *rank = (uint32_t)(t->mval[i] >> 32);
            *id = (uint32_t)t->mval[i];
            return true;
        }
    }
}

/* Adds merge (a, b) -> id with the next rank; a pair already present keeps its first rank
 * (as `tokenizers` does). */
static jdt_status merge_add(jdt_bpe *t, uint32_t a, uint32_t b, uint32_t id, jdt_err *e)
{
    uint64_t k = (uint64_t)a << 32 | b;
    size_t mask = t->mcap - 1;
    size_t i = hash_u64(k) & mask;
    for (; t->mkey[i] != EMPTY_KEY; i = (i + 1) & mask)
        if (t->mkey[i] == k) return JDT_OK;
    t->mkey[i] = k;
    t->mval[i] = (uint64_t)t->n_merges << 32 | id;
    t->merge_a[t->n_merges] = a;
    t->merge_b[t->n_merges] = b;
    t->n_merges++;
    (void)e;
    return JDT_OK;
}

static jdt_status merges_alloc(jdt_bpe *t, size_t n, const char *what, jdt_err *e)
{
    t->mcap = pow2_at_least(n * 2 + 16);
    t->mkey = jdt_malloc(t->mcap * sizeof *t->mkey);
    t->mval = jdt_malloc(t->mcap * sizeof *t->mval);
    t->merge_a = jdt_malloc((n + 1) * sizeof *t->merge_a);
    t->merge_b = jdt_malloc((n + 1) * sizeof *t->merge_b);
    if (!t->mkey || !t->mval || !t->merge_a || !t->merge_b)
        return jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", what);
    memset(t->mkey, 0xFF, t->mcap * sizeof *t->mkey);
    return JDT_OK;
}

/* Appends n bytes to the blob; returns the offset or NONE on OOM. */
static uint32_t blob_add(jdt_bpe *t, const char *s, size_t n)
{
    if (t->blob_len + n + 1 > t->blob_cap) {
        size_t c = t->blob_cap ? t->blob_cap : 1 << 16;
        while (c < t->blob_len + n + 1) c *= 2;
        if (c >= NONE) return NONE;
        char *b = jdt_realloc(t->blob, c);
        if (!b) return NONE;
        t->blob = b;
        t->blob_cap = c;
    }
    uint32_t off = (uint32_t)t->blob_len;
    memcpy(t->blob + off, s, n);
    t->blob_len += n;
    t->blob[t->blob_len] = 0;
    return off;
}

static jdt_status vocab_alloc(jdt_bpe *t, int n_vocab, const char *what, jdt_err *e)
{
    t->n_vocab = n_vocab;
    t->tok_off = jdt_malloc((size_t)n_vocab * sizeof *t->tok_off);
    t->tok_len = jdt_calloc((size_t)n_vocab, sizeof *t->tok_len);
    t->is_added = jdt_calloc((size_t)n_vocab, 1);
    if (!t->tok_off || !t->tok_len || !t->is_added)
        return jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", what);
    memset(t->tok_off, 0xFF, (size_t)n_vocab * sizeof *t->tok_off);
    return JDT_OK;
}

/* ---- setup shared by loading and training ------------------------------------------------- */

static jdt_status compile_regex(jdt_bpe *t, const char *what, jdt_err *e)
{
    if (!t->regex || t->re) return JDT_OK;
    int err;
    PCRE2_SIZE at;
    t->re = pcre2_compile((PCRE2_SPTR)t->regex, PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &at, NULL);
    if (!t->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return jdt_err_set(e, JDT_ERR_FORMAT, "%s: pre-tokenizer regex does not compile at offset %zu: %s",
                           what, (size_t)at, (const char *)msg);
    }
    t->jit = pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE) == 0;
    t->md = pcre2_match_data_create_from_pattern(t->re, NULL);
    if (!t->md) return jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", what);
    return JDT_OK;
}

/* Checks the byte tokens and the added-token table, builds vmap and the cache. */
static jdt_status finish_setup(jdt_bpe *t, const char *what, jdt_err *e)
{
    jdt_status st;
    /* spm: whether any ordinary token holds a space after another byte (a SentencePiece
     * vocabulary split at whitespace has "▁" only at a token's start, or runs of them) */
    t->spm_words = t->spm;
    for (int id = 0; id < t->n_vocab && t->spm_words; id++) {
        if (t->is_added[id] || t->tok_off[id] == NONE || t->is_fb[id]) continue;
        const char *b = t->blob + t->tok_off[id];
        for (uint32_t k = 1; k < t->tok_len[id]; k++)
            if (b[k] == ' ' && b[k - 1] != ' ') t->spm_words = false;
    }
    for (int b = 0; b < 256 && t->spm; b++) /* load_vocab set them */
        if (t->byte_id[b] == NONE)
            return jdt_err_set(e, JDT_ERR_FORMAT,
                               "%s: byte_fallback without the vocabulary's token <0x%02X> (every "
                               "byte needs one)",
                               what, b);
    for (int b = 0; b < 256 && !t->spm; b++) {
        char c = (char)b;
        uint32_t id = vmap_find(t, &c, 1);
        if (id == NONE)
            return jdt_err_set(e, JDT_ERR_FORMAT,
                               "%s: the vocabulary has no token for byte 0x%02x "
                               "(not a byte-level BPE?)",
                               what, b);
        t->byte_id[b] = id;
    }
    memset(t->added_first, 0, sizeof t->added_first);
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].len) t->added_first[(unsigned char)t->blob[t->added[i].off]] = 1;
    if ((st = compile_regex(t, what, e))) return st;
    t->cache = jdt_calloc(CACHE_SLOTS, sizeof *t->cache);
    t->cache_bytes = jdt_malloc(CACHE_ARENA);
    t->cache_ids = jdt_malloc(CACHE_ARENA);
    if (!t->cache || !t->cache_bytes || !t->cache_ids)
        return jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", what);
    return JDT_OK;
}

void jdt_bpe_free(jdt_bpe *t)
{
    if (!t) return;
    jdt_free(t->tok_off);
    jdt_free(t->tok_len);
    jdt_free(t->is_added);
    jdt_free(t->is_fb);
    jdt_free(t->blob);
    jdt_free(t->vmap);
    jdt_free(t->mkey);
    jdt_free(t->mval);
    jdt_free(t->merge_a);
    jdt_free(t->merge_b);
    jdt_free(t->added);
    jdt_free(t->regex);
    if (t->md) pcre2_match_data_free(t->md);
    if (t->re) pcre2_code_free(t->re);
    jdt_free(t->json_text);
    jdt_free(t->cache);
    jdt_free(t->cache_bytes);
    jdt_free(t->cache_ids);
    jdt_free(t->s_id);
    jdt_free(t->s_prev);
    jdt_free(t->s_next);
    jdt_free(t->heap);
    jdt_free(t->prefix_buf);
    jdt_free(t->u16_in);
    jdt_free(t->u16_out);
    jdt_free(t->nfc_buf);
    jdt_free(t);
}

int jdt_bpe_vocab_size(const jdt_bpe *t) { return t->n_vocab; }

int jdt_bpe_special_id(const jdt_bpe *t, const char *s)
{
    size_t n = strlen(s);
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && memcmp(t->blob + t->added[i].off, s, n) == 0)
            return (int)t->added[i].id;
    return -1;
}

const char *jdt_bpe_token_bytes(const jdt_bpe *t, uint32_t id, size_t *n)
{
    if (id >= (uint32_t)t->n_vocab || t->tok_off[id] == NONE) {
        *n = 0;
        return "";
    }
    *n = t->tok_len[id];
    return t->blob + t->tok_off[id];
}

size_t jdt_bpe_decode(const jdt_bpe *t, const uint32_t *ids, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l;
        const char *s = jdt_bpe_token_bytes(t, ids[i], &l);
        if (o < cap) memcpy(out + o, s, l < cap - o ? l : cap - o);
        o += l;
    }
    return o;
}

/* ---- encoding ------------------------------------------------------------------------------ */

typedef struct {
    uint32_t **ids;
    size_t *n, *cap;
} id_vec;

static jdt_status push_ids(id_vec *v, const uint32_t *ids, size_t n, jdt_err *e)
{
    if (*v->n + n > *v->cap) {
        size_t c = *v->cap ? *v->cap : 1024;
        while (c < *v->n + n) c *= 2;
        uint32_t *p = jdt_realloc(*v->ids, c * sizeof *p);
        if (!p) return jdt_err_set(e, JDT_ERR_NOMEM, "bpe: out of memory (%zu ids)", c);
        *v->ids = p;
        *v->cap = c;
    }
    memcpy(*v->ids + *v->n, ids, n * sizeof *ids);
    *v->n += n;
    return JDT_OK;
}

static bool heap_less(heap_ent a, heap_ent b)
{
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void heap_push(heap_ent *h, size_t *n, heap_ent x)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(x, h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
}

static heap_ent heap_pop(heap_ent *h, size_t *n)
{
    heap_ent top = h[0], x = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(h[c + 1], h[c])) c++;
        if (!heap_less(h[c], x)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = x;
    return top;
}

static void push_pair(const jdt_bpe *t, heap_ent *h, size_t *nh, int32_t i)
{
    int32_t j = t->s_next[i];
    if (j < 0) return;
    uint32_t rank, id;
    if (merge_find(t, t->s_id[i], t->s_id[j], &rank, &id))
        heap_push(h, nh, (heap_ent){rank, (uint32_t)i});
}

static int utf8_seq_len(const unsigned char *p, const unsigned char *end);

/* A SentencePiece-style piece's first symbols into t->s_id (room for 3n): each character's
 * token (a "▁" in the text is the space token, as tokenizers' Replace normalizer leaves it),
 * or where the vocabulary has none, its bytes' <0xNN> tokens (a byte that starts no valid
 * UTF-8 sequence is a character of its own). Returns how many. */
static int32_t spm_symbols(const jdt_bpe *t, const char *p, size_t n)
{
    const unsigned char *u = (const unsigned char *)p, *end = u + n;
    int32_t k = 0;
    for (size_t i = 0; i < n;) {
        int l = utf8_seq_len(u + i, end);
        if (l <= 0) l = 1;
        const bool space = spm_space_len(p, i, n) == l;
        uint32_t id = vmap_find(t, space ? " " : p + i, space ? 1 : (size_t)l);
        const unsigned char *bytes = space ? (const unsigned char *)SPM_SPACE : u + i;
        if (id != NONE) {
            t->s_id[k++] = id;
        } else { /* a space the vocabulary lacks falls back to the bytes of its "▁" */
            for (int b = 0; b < (space ? 3 : l); b++) t->s_id[k++] = t->byte_id[bytes[b]];
        }
        i += (size_t)l;
    }
    return k;
}

/* Merges the bytes of one piece; leaves the ids in order in t->s_id[0..*n_out). */
static jdt_status bpe_piece(jdt_bpe *t, const char *p, size_t n, size_t *n_out, jdt_err *e)
{
    const size_t need = t->spm ? 3 * n : n; /* spm: a space may fall back to 3 bytes */
    if (need > t->s_cap) {
        size_t c = pow2_at_least(need);
        jdt_free(t->s_id);
        jdt_free(t->s_prev);
        jdt_free(t->s_next);
        jdt_free(t->heap);
        t->s_id = jdt_malloc(c * sizeof *t->s_id);
        t->s_prev = jdt_malloc(c * sizeof *t->s_prev);
        t->s_next = jdt_malloc(c * sizeof *t->s_next);
        t->heap = jdt_malloc(c * 2 * sizeof *t->heap);
        t->s_cap = c;
        if (!t->s_id || !t->s_prev || !t->s_next || !t->heap) {
            t->s_cap = 0;
            return jdt_err_set(e, JDT_ERR_NOMEM, "bpe: out of memory");
        }
    }
    int32_t N = (int32_t)n;
    if (t->spm) {
        N = spm_symbols(t, p, n);
    } else {
        for (int32_t i = 0; i < N; i++) t->s_id[i] = t->byte_id[(unsigned char)p[i]];
    }
    for (int32_t i = 0; i < N; i++) {
        t->s_prev[i] = i - 1;
        t->s_next[i] = i + 1 < N ? i + 1 : -1;
    }
    /* the heap never holds more than 2n entries: n-1 at first, at most 2 pushes per merge */
    size_t nh = 0;
    for (int32_t i = 0; i + 1 < N; i++) push_pair(t, t->heap, &nh, i);
    while (nh) {
        heap_ent h = heap_pop(t->heap, &nh);
        int32_t i = (int32_t)h.pos;
        if (t->s_id[i] == NONE) continue;
        int32_t j = t->s_next[i];
        if (j < 0) continue;
        uint32_t rank, id;
        if (!merge_find(t, t->s_id[i], t->s_id[j], &rank, &id) || rank != h.rank) continue;
        t->s_id[i] = id;
        t->s_id[j] = NONE;
        t->s_next[i] = t->s_next[j];
        if (t->s_next[j] >= 0) t->s_prev[t->s_next[j]] = i;
        if (t->s_prev[i] >= 0) push_pair(t, t->heap, &nh, t->s_prev[i]);
        push_pair(t, t->heap, &nh, i);
    }
    size_t o = 0;
    for (int32_t i = 0; i >= 0; i = t->s_next[i]) t->s_id[o++] = t->s_id[i];
    *n_out = o;
    return JDT_OK;
}

static void cache_clear(jdt_bpe *t)
{
    memset(t->cache, 0, CACHE_SLOTS * sizeof *t->cache);
    t->cache_used = 0;
    t->cb_len = 0;
    t->ci_len = 0;
}

static jdt_status encode_piece(jdt_bpe *t, const char *p, size_t n, id_vec *out, jdt_err *e)
{
    if (n == 1 && !t->spm) return push_ids(out, &t->byte_id[(unsigned char)p[0]], 1, e);
    if (t->ignore_merges) {
        uint32_t id = vmap_find(t, p, n);
        if (id != NONE) return push_ids(out, &id, 1, e);
    }
    uint64_t h = 0;
    size_t slot = 0;
    bool cacheable = n <= CACHE_MAX_PIECE;
    if (cacheable) {
        h = hash_bytes(p, n) | 1; /* hash 0 marks an empty slot */
        for (slot = h & (CACHE_SLOTS - 1);; slot = (slot + 1) & (CACHE_SLOTS - 1)) {
            cache_slot *c = &t->cache[slot];
            if (!c->hash) break;
            if (c->hash == h && c->key_len == n && memcmp(t->cache_bytes + c->key_off, p, n) == 0)
                return push_ids(out, t->cache_ids + c->ids_off, c->n_ids, e);
        }
    }
    size_t m = 0;
    jdt_status st = bpe_piece(t, p, n, &m, e);
    if (st) return st;
    if (cacheable) {
        if (t->cache_used * 2 >= CACHE_SLOTS || t->cb_len + n > CACHE_ARENA ||
            (t->ci_len + m) * sizeof(uint32_t) > CACHE_ARENA) {
            cache_clear(t);
            for (slot = h & (CACHE_SLOTS - 1); t->cache[slot].hash;) slot = (slot + 1) & (CACHE_SLOTS - 1);
        }
        cache_slot *c = &t->cache[slot];
        c->hash = h;
        c->key_off = (uint32_t)t->cb_len;
        c->key_len = (uint32_t)n;
        c->ids_off = (uint32_t)t->ci_len;
        c->n_ids = (uint32_t)m;
        memcpy(t->cache_bytes + t->cb_len, p, n);
        memcpy(t->cache_ids + t->ci_len, t->s_id, m * sizeof *t->s_id);
        t->cb_len += n;
        t->ci_len += m;
        t->cache_used++;
    }
    return push_ids(out, t->s_id, m, e);
}

typedef jdt_status (*piece_fn)(jdt_bpe *t, const char *p, size_t n, void *ctx, jdt_err *e);

enum { PROGRESS_STEP = 1 << 20 }; /* bytes of split text between progress reports */

/* Reports offset `from` of the n-byte split buffer of the current segment as MB of the caller's
 * text (normalisation may change the segment's length: scaled back to the original's). */
static void progress_at(jdt_bpe *t, size_t from, size_t n)
{
    double done = (double)t->prog_seg_base + (double)t->prog_seg_len * (double)from / (double)n;
    jdt_progress_update(t->prog, done / 1048576.0);
    t->prog_next = from + PROGRESS_STEP;
}

/* Splits one segment (no added tokens in it) into pieces with the regex: matches and the gaps
 * between them, in order. */
static jdt_status split_segment(jdt_bpe *t, const char *s, size_t n, piece_fn fn, void *ctx,
                                jdt_err *e)
{
    if (n == 0) return JDT_OK;
    const bool starts_space = spm_space_len(s, 0, n) > 0;
    const bool prefix = t->spm ? t->spm_prepend == PREPEND_NORMALIZER ||
                                     (t->spm_prepend == PREPEND_ALWAYS && !starts_space) ||
                                     (t->spm_prepend == PREPEND_FIRST && t->seg_first && !starts_space)
                               : t->add_prefix_space && s[0] != ' ';
    if (prefix) {
        if (n + 1 > t->prefix_cap) {
            char *b = jdt_realloc(t->prefix_buf, n + 1);
            if (!b) return jdt_err_set(e, JDT_ERR_NOMEM, "bpe: out of memory");
            t->prefix_buf = b;
            t->prefix_cap = n + 1;
        }
        t->prefix_buf[0] = ' ';
        memcpy(t->prefix_buf + 1, s, n);
        s = t->prefix_buf;
        n++;
    }
    jdt_status st;
    if (t->spm && (t->spm_split || t->spm_words)) {
        /* Metaspace split: each "▁" (a space here) starts a piece; without it, a "▁" after
         * another character does (spm_words: the same tokens as the segment in one piece) */
        size_t a = 0;
        bool prev_space = false;
        for (size_t i = 0; i <= n;) {
            const int sp = i < n ? spm_space_len(s, i, n) : 0;
            if (i == n || (sp && i > a && (t->spm_split || !prev_space))) {
                if (i > a && (st = fn(t, s + a, i - a, ctx, e))) return st;
                a = i;
                if (t->prog && i >= t->prog_next) progress_at(t, i, n);
            }
            prev_space = sp > 0;
            i += sp > 1 ? (size_t)sp : 1; /* a literal "▁" whole */
        }
        return JDT_OK;
    }
    if (!t->re) return fn(t, s, n, ctx, e);
    size_t gap = 0, from = 0;
    while (from < n) {
        int rc = t->jit ? pcre2_jit_match(t->re, (PCRE2_SPTR)s, n, from, 0, t->md, NULL)
                        : pcre2_match(t->re, (PCRE2_SPTR)s, n, from, 0, t->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return jdt_err_set(e, JDT_ERR_INTERNAL, "bpe: regex match failed: %s", (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(t->md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* an empty match is no piece: search again one character on */
            from = ms + 1;
            while (from < n && ((unsigned char)s[from] & 0xC0) == 0x80) from++;
            continue;
        }
        if (ms > gap && (st = fn(t, s + gap, ms - gap, ctx, e))) return st;
        if ((st = fn(t, s + ms, me - ms, ctx, e))) return st;
        gap = from = me;
        if (t->prog && from >= t->prog_next) progress_at(t, from, n);
    }
    if (gap < n && (st = fn(t, s + gap, n - gap, ctx, e))) return st;
    return JDT_OK;
}

/* Finds the leftmost, longest added token in s[from..n); returns its index or -1. */
static int find_added(const jdt_bpe *t, const char *s, size_t n, size_t from, size_t *at)
{
    if (!t->n_added) return -1;
    for (size_t i = from; i < n; i++) {
        if (!t->added_first[(unsigned char)s[i]]) continue;
        int best = -1;
        for (int k = 0; k < t->n_added; k++) {
            const added_tok *a = &t->added[k];
            if (a->len && a->len <= n - i && memcmp(s + i, t->blob + a->off, a->len) == 0 &&
                (best < 0 || a->len > t->added[best].len))
                best = k;
        }
        if (best >= 0) {
            *at = i;
            return best;
        }
    }
    return -1;
}

/* Length of the valid UTF-8 sequence at p (1..4), or 0 if invalid. */
static int utf8_seq_len(const unsigned char *p, const unsigned char *end)
{
    unsigned c = p[0];
    int n = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3 : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
    if (!n || end - p < n) return 0;
    for (int i = 1; i < n; i++)
        if ((p[i] & 0xC0) != 0x80) return 0;
    if ((c == 0xE0 && p[1] < 0xA0) || (c == 0xED && p[1] > 0x9F) || (c == 0xF0 && p[1] < 0x90) ||
        (c == 0xF4 && p[1] > 0x8F))
        return 0; /* overlong, surrogate, above U+10FFFF */
    return n;
}

/* NFC of s[0..n) into t->nfc_buf (*out, *n_out). Runs of valid UTF-8 are normalized by ICU;
 * bytes that are not valid UTF-8 are copied as they are (so they still round-trip). ASCII is
 * already NFC and is returned as it is. */
static jdt_status nfc_segment(jdt_bpe *t, const char *s, size_t n, const char **out, size_t *n_out, jdt_err *e)
{
    size_t k = 0;
    while (k < n && !((unsigned char)s[k] & 0x80)) k++;
    if (k == n) {
        *out = s;
        *n_out = n;
        return JDT_OK;
    }
    if (n > (size_t)INT32_MAX / 4) return jdt_err_set(e, JDT_ERR_INVALID, "bpe: NFC segment over 512 MiB");
    if (n + 16 > t->nfc_cap) {
        size_t c = n + 16;
        jdt_free(t->u16_in);
        jdt_free(t->u16_out);
        jdt_free(t->nfc_buf);
        t->u16_in = jdt_malloc(c * sizeof(UChar));
        t->u16_out = jdt_malloc(3 * c * sizeof(UChar));
        t->nfc_buf = jdt_malloc(9 * c);
        t->nfc_cap = c;
        if (!t->u16_in || !t->u16_out || !t->nfc_buf) {
            t->nfc_cap = 0;
            return jdt_err_set(e, JDT_ERR_NOMEM, "bpe: out of memory");
        }
    }
    const unsigned char *p = (const unsigned char *)s, *end = p + n;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        int l;
        while (j < n && (l = utf8_seq_len(p + j, end)) > 0) j += (size_t)l;
        if (j > i) {
            UErrorCode err = U_ZERO_ERROR;
            int32_t n16 = 0, m16 = 0, m8 = 0;
            u_strFromUTF8(t->u16_in, (int32_t)t->nfc_cap, &n16, s + i, (int32_t)(j - i), &err);
            if (U_SUCCESS(err))
                m16 = unorm2_normalize(t->nfc, t->u16_in, n16, t->u16_out, (int32_t)(3 * t->nfc_cap), &err);
            if (U_SUCCESS(err))
                u_strToUTF8(t->nfc_buf + o, (int32_t)(9 * t->nfc_cap - o), &m8, t->u16_out, m16, &err);
            if (U_FAILURE(err))
                return jdt_err_set(e, JDT_ERR_INTERNAL, "bpe: NFC normalization failed: %s", u_errorName(err));
            o += (size_t)m8;
            i = j;
        }
        while (i < n && utf8_seq_len(p + i, end) == 0) t->nfc_buf[o++] = s[i++];
    }
    *out = t->nfc_buf;
    *n_out = o;
    return JDT_OK;
}

typedef jdt_status (*added_fn)(jdt_bpe *t, uint32_t id, void *ctx, jdt_err *e);

static jdt_status for_each_piece(jdt_bpe *t, const char *s, size_t n, piece_fn fn, added_fn afn,
                                 void *ctx, jdt_err *e)
{
    size_t pos = 0;
    jdt_status st;
    while (pos < n) {
        size_t at = n;
        int k = find_added(t, s, n, pos, &at);
        const char *seg = s + pos;
        size_t n_seg = at - pos;
        t->prog_seg_base = pos;
        t->prog_seg_len = n_seg;
        t->seg_first = pos == 0;
        t->prog_next = PROGRESS_STEP;
        if (t->nfc && n_seg && (st = nfc_segment(t, seg, n_seg, &seg, &n_seg, e))) return st;
        if ((st = split_segment(t, seg, n_seg, fn, ctx, e))) return st;
        if (k < 0) break;
        if ((st = afn(t, t->added[k].id, ctx, e))) return st;
        pos = at + t->added[k].len;
    }
    return JDT_OK;
}

static jdt_status enc_piece_cb(jdt_bpe *t, const char *p, size_t n, void *ctx, jdt_err *e)
{
    return encode_piece(t, p, n, ctx, e);
}

static jdt_status enc_added_cb(jdt_bpe *t, uint32_t id, void *ctx, jdt_err *e)
{
    return push_ids(ctx, &id, 1, e);
}

void jdt_bpe_set_progress(jdt_bpe *t, jdt_progress *prog)
{
    t->prog = prog;
}

jdt_status jdt_bpe_encode(jdt_bpe *t, const char *text, size_t n, uint32_t **ids, size_t *n_ids,
                          size_t *cap, jdt_err *e)
{
    id_vec v = {ids, n_ids, cap};
    return for_each_piece(t, text, n, enc_piece_cb, enc_added_cb, &v, e);
}

/* ---- loading ------------------------------------------------------------------------------- */

static jdt_status add_added(jdt_bpe *t, uint32_t id, const char *s, size_t n, bool special,
                            const char *what, jdt_err *e)
{
    added_tok *a = jdt_realloc(t->added, (size_t)(t->n_added + 1) * sizeof *a);
    if (!a) return jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", what);
    t->added = a;
    uint32_t off = blob_add(t, s, n);
    if (off == NONE) return jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", what);
    a[t->n_added++] = (added_tok){id, off, (uint32_t)n, special};
    return JDT_OK;
}

/* A SentencePiece-style token's bytes into out (at least n bytes): each "▁" (U+2581) becomes
 * the space it stands for; "<0xNN>" becomes byte NN, and with t, id is marked as the fallback
 * for byte NN. Returns the byte count. */
static long from_spm(jdt_bpe *t, const char *s, size_t n, char *out, uint32_t id)
{
    unsigned b;
    if (spm_byte_token(s, n, &b)) {
        out[0] = (char)b;
        if (t) {
            t->is_fb[id] = 1;
            t->byte_id[b] = id;
        }
        return 1;
    }
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        const int sp = spm_space_len(s, i, n);
        out[o++] = sp ? ' ' : s[i];
        i += sp ? (size_t)sp : 1;
    }
    return (long)o;
}

/* Fills ids from a {"token": id} object (the vocab of tokenizer.json or encoder.json). Added
 * tokens must already be in t->added (their ids keep the added content). */
static jdt_status load_vocab(jdt_bpe *t, const jdt_json *vocab, const char *what, jdt_err *e)
{
    if (!vocab || vocab->type != JDT_JSON_OBJECT)
        return jdt_err_set(e, JDT_ERR_FORMAT, "%s: no vocab object", what);
    int64_t max_id = -1;
    for (const jdt_json *c = vocab->child; c; c = c->next) {
        int64_t id;
        if (!jdt_json_int(c, 0, MAX_ID - 1, &id))
            return jdt_err_set(e, JDT_ERR_FORMAT, "%s: vocab entry \"%s\" has no valid id", what, c->key);
        if (id > max_id) max_id = id;
    }
    for (int i = 0; i < t->n_added; i++)
        if ((int64_t)t->added[i].id > max_id) max_id = t->added[i].id;
    jdt_status st = vocab_alloc(t, (int)(max_id + 1), what, e);
    if (st) return st;
    if (t->spm) {
        if (!(t->is_fb = jdt_calloc((size_t)t->n_vocab, 1)))
            return jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", what);
        for (int b = 0; b < 256; b++) t->byte_id[b] = NONE;
    }
    for (int i = 0; i < t->n_added; i++) {
        uint32_t id = t->added[i].id;
        t->is_added[id] = 1;
        t->tok_off[id] = t->added[i].off;
        t->tok_len[id] = t->added[i].len;
    }
    char *raw = NULL;
    size_t raw_cap = 0;
    for (const jdt_json *c = vocab->child; c; c = c->next) {
        uint32_t id = (uint32_t)c->num;
        if (t->is_added[id]) continue;
        if (t->tok_off[id] != NONE) {
            jdt_free(raw);
            return jdt_err_set(e, JDT_ERR_FORMAT, "%s: id %u is given to two vocab entries", what, id);
        }
        if (c->key_len + 1 > raw_cap) {
            raw_cap = c->key_len + 64;
            char *r = jdt_realloc(raw, raw_cap);
            if (!r) {
                jdt_free(raw);
                return jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", what);
            }
            raw = r;
        }
        long n = t->spm ? from_spm(t, c->key, c->key_len, raw, id) : from_byte_level(c->key, c->key_len, raw);
        /* a token outside the ByteLevel alphabet keeps its text (it can only come from a
         * special-looking entry that is not listed as added) */
        uint32_t off = n < 0 ? blob_add(t, c->key, c->key_len) : blob_add(t, raw, (size_t)n);
        if (off == NONE) {
            jdt_free(raw);
            return jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", what);
        }
        t->tok_off[id] = off;
        t->tok_len[id] = n < 0 ? (uint32_t)c->key_len : (uint32_t)n;
    }
    jdt_free(raw);
    return vmap_build(t, what, e);
}

/* Looks up one side of a merge given in the ByteLevel alphabet (or with "▁" for spaces: spm).
 * A byte-fallback token is not found: no merge makes or extends one. */
static uint32_t merge_part(jdt_bpe *t, const char *s, size_t n, char *raw)
{
    unsigned b;
    if (t->spm && spm_byte_token(s, n, &b)) return NONE;
    long m = t->spm ? from_spm(NULL, s, n, raw, 0) : from_byte_level(s, n, raw);
    return m < 0 ? NONE : vmap_find(t, raw, (size_t)m);
}

static jdt_status add_merge_str(jdt_bpe *t, const char *a, size_t na, const char *b, size_t nb,
                                long line, const char *what, jdt_err *e)
{
    char raw[2048];
    if (na + nb > sizeof raw / 2)
        return jdt_err_set(e, JDT_ERR_FORMAT, "%s: merge %ld is too long", what, line);
    uint32_t ia = merge_part(t, a, na, raw), ib = merge_part(t, b, nb, raw);
    if (ia == NONE || ib == NONE)
        return jdt_err_set(e, JDT_ERR_FORMAT, "%s: merge %ld (\"%.*s %.*s\"): '%.*s' is not in the vocab",
                           what, line, (int)na, a, (int)nb, b, ia == NONE ? (int)na : (int)nb,
                           ia == NONE ? a : b);
    size_t la = t->tok_len[ia], lb = t->tok_len[ib];
    memcpy(raw, t->blob + t->tok_off[ia], la);
    memcpy(raw + la, t->blob + t->tok_off[ib], lb);
    uint32_t id = vmap_find(t, raw, la + lb);
    if (id == NONE)
        return jdt_err_set(e, JDT_ERR_FORMAT, "%s: merge %ld (\"%.*s %.*s\"): the merged token is not in the vocab",
                           what, line, (int)na, a, (int)nb, b);
    return merge_add(t, ia, ib, id, e);
}

/* A SentencePiece-style BPE's pre-tokenizer: none (the segment is one piece), or Metaspace
 * ("▁" for spaces, which ours already are; prepend_scheme always / first / never, or the older
 * add_prefix_space; split: a piece starts at each "▁"), or after a Replace(" " -> "▁")
 * normalizer a Split on " ", which finds none (transformers' Gemma conversion writes one). */
static jdt_status parse_spm_pre_tokenizer(jdt_bpe *t, const jdt_json *pt, const char *what, jdt_err *e)
{
    if (!pt || pt->type == JDT_JSON_NULL) return JDT_OK;
    const char *type = jdt_json_str(jdt_json_get(pt, "type"));
    const char *split_on = jdt_json_str(jdt_json_get(jdt_json_get(pt, "pattern"), "String"));
    const jdt_json *inv = jdt_json_get(pt, "invert");
    if (t->spm_replaced && type && strcmp(type, "Split") == 0 && split_on && strcmp(split_on, " ") == 0 &&
        !(inv && inv->type == JDT_JSON_TRUE))
        return JDT_OK;
    const char *rep = jdt_json_str(jdt_json_get(pt, "replacement"));
    if (!type || strcmp(type, "Metaspace") != 0 || (rep && strcmp(rep, SPM_SPACE) != 0))
        return jdt_err_set(e, JDT_ERR_UNSUPPORTED,
                           "%s: pre-tokenizer '%s' is not supported with byte_fallback (only none or "
                           "Metaspace with replacement \"\u2581\")",
                           what, type ? type : "?");
    if (t->spm_prepend != PREPEND_NONE)
        return jdt_err_set(e, JDT_ERR_UNSUPPORTED, "%s: both a Prepend normalizer and a Metaspace pre-tokenizer",
                           what);
    const char *scheme = jdt_json_str(jdt_json_get(pt, "prepend_scheme"));
    const jdt_json *aps = jdt_json_get(pt, "add_prefix_space");
    if (scheme && strcmp(scheme, "first") == 0)
        t->spm_prepend = PREPEND_FIRST;
    else if (scheme && strcmp(scheme, "never") == 0)
        t->spm_prepend = PREPEND_NONE;
    else if ((scheme && strcmp(scheme, "always") == 0) || (!scheme && (!aps || aps->type == JDT_JSON_TRUE)))
        t->spm_prepend = PREPEND_ALWAYS;
    else if (scheme)
        return jdt_err_set(e, JDT_ERR_UNSUPPORTED, "%s: Metaspace prepend_scheme '%s' is not supported", what,
                           scheme);
    const jdt_json *split = jdt_json_get(pt, "split");
    t->spm_split = !split || split->type == JDT_JSON_TRUE;
    return JDT_OK;
}

static jdt_status parse_pre_tokenizer(jdt_bpe *t, const jdt_json *pt, const char *what, jdt_err *e)
{
    if (t->spm) return parse_spm_pre_tokenizer(t, pt, what, e);
    const char *type = jdt_json_str(jdt_json_get(pt, "type"));
    if (!pt || pt->type == JDT_JSON_NULL || !type)
        return jdt_err_set(e, JDT_ERR_UNSUPPORTED,
                           "%s: pre_tokenizer must be ByteLevel (or Split + ByteLevel) for a "
                           "byte-level BPE; this file has none",
                           what);
    const jdt_json *items = pt;
    size_t n_items = 1;
    if (strcmp(type, "Sequence") == 0) {
        const jdt_json *arr = jdt_json_get(pt, "pretokenizers");
        if (!arr || arr->type != JDT_JSON_ARRAY)
            return jdt_err_set(e, JDT_ERR_FORMAT, "%s: pre_tokenizer Sequence without pretokenizers", what);
        items = arr->child;
        n_items = arr->len;
    }
    bool have_byte_level = false;
    const jdt_json *it = items;
    for (size_t k = 0; k < n_items; k++, it = it->next) {
        const char *ty = jdt_json_str(jdt_json_get(it, "type"));
        if (!ty) return jdt_err_set(e, JDT_ERR_FORMAT, "%s: pre_tokenizer without a type", what);
        if (strcmp(ty, "ByteLevel") == 0) {
            if (have_byte_level)
                return jdt_err_set(e, JDT_ERR_UNSUPPORTED, "%s: two ByteLevel pre-tokenizers", what);
            have_byte_level = true;
            const jdt_json *ur = jdt_json_get(it, "use_regex"), *aps = jdt_json_get(it, "add_prefix_space");
            bool use_regex = !ur || ur->type == JDT_JSON_TRUE;
            t->add_prefix_space = !aps || aps->type == JDT_JSON_TRUE;
            if (use_regex) {
                if (t->regex)
                    return jdt_err_set(e, JDT_ERR_UNSUPPORTED,
                                       "%s: a Split pre-tokenizer followed by ByteLevel with "
                                       "use_regex: true (two regex splits) is not supported",
                                       what);
                if (!(t->regex = jdt_strdup(JDT_BPE_GPT2_REGEX)))
                    return jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", what);
            }
        } else if (strcmp(ty, "Split") == 0) {
            if (t->regex || have_byte_level)
                return jdt_err_set(e, JDT_ERR_UNSUPPORTED,
                                   "%s: only one Split pre-tokenizer, before ByteLevel, is supported", what);
            const char *re = jdt_json_str(jdt_json_get(jdt_json_get(it, "pattern"), "Regex"));
            const char *beh = jdt_json_str(jdt_json_get(it, "behavior"));
            const jdt_json *inv = jdt_json_get(it, "invert");
            if (!re)
                return jdt_err_set(e, JDT_ERR_UNSUPPORTED, "%s: Split pre-tokenizer without a Regex pattern", what);
            if (!beh || strcmp(beh, "Isolated") != 0 || (inv && inv->type == JDT_JSON_TRUE))
                return jdt_err_set(e, JDT_ERR_UNSUPPORTED,
                                   "%s: Split pre-tokenizer with behavior '%s'%s (only Isolated, "
                                   "invert false, is supported)",
                                   what, beh ? beh : "?", inv && inv->type == JDT_JSON_TRUE ? ", invert true" : "");
            if (!(t->regex = jdt_strdup(re))) return jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", what);
        } else {
            return jdt_err_set(e, JDT_ERR_UNSUPPORTED,
                               "%s: pre-tokenizer '%s' is not supported (byte-level BPE needs "
                               "ByteLevel, optionally after one Split)",
                               what, ty);
        }
    }
    if (!have_byte_level)
        return jdt_err_set(e, JDT_ERR_UNSUPPORTED,
                           "%s: no ByteLevel pre-tokenizer: this is not a byte-level BPE "
                           "(SentencePiece-style tokenizers are not supported)",
                           what);
    return JDT_OK;
}

/* A TemplateProcessing post-processor in pp (it, or one of a Sequence's), or NULL. */
static const jdt_json *template_processing(const jdt_json *pp)
{
    const char *type = jdt_json_str(jdt_json_get(pp, "type"));
    if (type && strcmp(type, "TemplateProcessing") == 0) return pp;
    const jdt_json *list = type && strcmp(type, "Sequence") == 0 ? jdt_json_get(pp, "processors") : NULL;
    for (const jdt_json *q = list && list->type == JDT_JSON_ARRAY ? list->child : NULL; q; q = q->next) {
        const jdt_json *tp = template_processing(q);
        if (tp) return tp;
    }
    return NULL;
}

/* The special tokens of the post-processor pp's "single" template before the text's piece
 * ("Sequence" A) into t->prefix_ids, after the added tokens are known. */
static void read_template(jdt_bpe *t, const jdt_json *pp)
{
    const jdt_json *tp = pp ? template_processing(pp) : NULL;
    const jdt_json *single = tp ? jdt_json_get(tp, "single") : NULL;
    for (const jdt_json *it = single && single->type == JDT_JSON_ARRAY ? single->child : NULL; it; it = it->next) {
        const jdt_json *sp = jdt_json_get(it, "SpecialToken");
        if (!sp) break;
        const char *name = jdt_json_str(jdt_json_get(sp, "id"));
        const int id = name ? jdt_bpe_special_id(t, name) : -1;
        if (id < 0) {
            snprintf(t->prefix_bad, sizeof t->prefix_bad, "%s", name ? name : "?");
            t->n_prefix = -1;
            return;
        }
        if (t->n_prefix < JDT_BPE_MAX_PREFIX) t->prefix_ids[t->n_prefix++] = (uint32_t)id;
    }
}

jdt_status jdt_bpe_prompt_prefix(const jdt_bpe *t, const uint32_t **ids, int *n, jdt_err *e)
{
    *ids = t->prefix_ids;
    *n = t->n_prefix > 0 ? t->n_prefix : 0;
    if (t->n_prefix < 0)
        return jdt_err_set(e, JDT_ERR_FORMAT, "tokenizer.json: the post-processor's template names '%s', not a token of it",
                           t->prefix_bad);
    return JDT_OK;
}

static jdt_status load_tokenizer_json(jdt_bpe *t, const char *path, jdt_err *e)
{
    jdt_json_doc *doc = NULL;
    char *text;
    size_t n;
    jdt_status st = jdt_io_read_all(path, &text, &n, e);
    if (st) return st;
    t->json_text = text;
    t->json_len = n;
    if ((st = jdt_json_parse(text, n, path, &doc, e))) return st;
    const jdt_json *root = jdt_json_root(doc);
    const jdt_json *model = jdt_json_get(root, "model");
    const char *mtype = jdt_json_str(jdt_json_get(model, "type"));
    if (!model || model->type != JDT_JSON_OBJECT) {
        st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: no \"model\" object (not a tokenizer.json?)", path);
        goto out;
    }
    if (mtype && strcmp(mtype, "BPE") != 0) {
        st = jdt_err_set(e, JDT_ERR_UNSUPPORTED, "%s: model type '%s' is not supported (only BPE)", path, mtype);
        goto out;
    }
    /* byte_fallback: a SentencePiece-style BPE (Llama 2, Mistral, Gemma), not a byte-level one */
    const jdt_json *bf = jdt_json_get(model, "byte_fallback");
    t->spm = bf && bf->type == JDT_JSON_TRUE;
    const jdt_json *norm = jdt_json_get(root, "normalizer");
    if (norm && norm->type != JDT_JSON_NULL) {
        /* none, NFC, or a Sequence of those; with byte_fallback also Replace(" " -> "▁"), which
         * our spaces already are, and Prepend("▁") */
        const char *nt = jdt_json_str(jdt_json_get(norm, "type"));
        const jdt_json *seq = jdt_json_get(norm, "normalizers");
        const jdt_json *items = norm;
        size_t n_items = 1;
        if (nt && strcmp(nt, "Sequence") == 0 && seq && seq->type == JDT_JSON_ARRAY) {
            items = seq->child;
            n_items = seq->len;
        }
        for (size_t k = 0; k < n_items; k++, items = items->next) {
            const char *it = jdt_json_str(jdt_json_get(items, "type"));
            const char *rs = jdt_json_str(jdt_json_get(jdt_json_get(items, "pattern"), "String"));
            const char *rc = jdt_json_str(jdt_json_get(items, "content"));
            const char *pp = jdt_json_str(jdt_json_get(items, "prepend"));
            if (t->spm && it && strcmp(it, "Replace") == 0 && rs && rc && strcmp(rs, " ") == 0 &&
                strcmp(rc, SPM_SPACE) == 0) {
                t->spm_replaced = true;
                continue;
            }
            if (t->spm && it && strcmp(it, "Prepend") == 0 && pp && strcmp(pp, SPM_SPACE) == 0) {
                t->spm_prepend = PREPEND_NORMALIZER;
                continue;
            }
            if (!it || strcmp(it, "NFC") != 0) {
                st = jdt_err_set(e, JDT_ERR_UNSUPPORTED,
                                 "%s: normalizer '%s' is not supported (only none or NFC; with byte_fallback "
                                 "also Replace(\" \" -> \"\u2581\") and Prepend(\"\u2581\"))",
                                 path, it ? it : "?");
                goto out;
            }
            UErrorCode err = U_ZERO_ERROR;
            t->nfc = unorm2_getNFCInstance(&err);
            if (U_FAILURE(err)) {
                st = jdt_err_set(e, JDT_ERR_INTERNAL, "%s: ICU NFC: %s", path, u_errorName(err));
                goto out;
            }
        }
    }
    const jdt_json *dropout = jdt_json_get(model, "dropout");
    if (dropout && dropout->type != JDT_JSON_NULL && !(dropout->type == JDT_JSON_NUMBER && dropout->num == 0)) {
        st = jdt_err_set(e, JDT_ERR_UNSUPPORTED, "%s: BPE dropout is not supported", path);
        goto out;
    }
    const char *keys[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int k = 0; k < 2; k++) {
        const char *v = jdt_json_str(jdt_json_get(model, keys[k]));
        if (v && v[0]) {
            st = jdt_err_set(e, JDT_ERR_UNSUPPORTED, "%s: model.%s '%s' is not supported", path, keys[k], v);
            goto out;
        }
    }
    const jdt_json *im = jdt_json_get(model, "ignore_merges");
    t->ignore_merges = im && im->type == JDT_JSON_TRUE;
    if ((st = parse_pre_tokenizer(t, jdt_json_get(root, "pre_tokenizer"), path, e)) ||
        (st = compile_regex(t, path, e)))
        goto out;

    const jdt_json *added = jdt_json_get(root, "added_tokens");
    if (added && added->type == JDT_JSON_ARRAY) {
        for (const jdt_json *a = added->child; a; a = a->next) {
            int64_t id;
            const jdt_json *content = jdt_json_get(a, "content");
            if (!jdt_json_int(jdt_json_get(a, "id"), 0, MAX_ID - 1, &id) || !content ||
                content->type != JDT_JSON_STRING || content->len == 0) {
                st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: added_tokens entry without an id or content", path);
                goto out;
            }
            const jdt_json *sp = jdt_json_get(a, "special");
            if ((st = add_added(t, (uint32_t)id, content->str, content->len, sp && sp->type == JDT_JSON_TRUE, path, e)))
                goto out;
        }
    } else if (added && added->type != JDT_JSON_NULL) {
        st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: added_tokens is not an array", path);
        goto out;
    }
    read_template(t, jdt_json_get(root, "post_processor"));
    if ((st = load_vocab(t, jdt_json_get(model, "vocab"), path, e))) goto out;
    const jdt_json *merges = jdt_json_get(model, "merges");
    if (!merges || merges->type != JDT_JSON_ARRAY) {
        st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: model.merges is missing or not an array", path);
        goto out;
    }
    if ((st = merges_alloc(t, merges->len, path, e))) goto out;
    long line = 0;
    for (const jdt_json *m = merges->child; m; m = m->next, line++) {
        if (m->type == JDT_JSON_STRING) {
            const char *sp = memchr(m->str, ' ', m->len);
            if (!sp || memchr(sp + 1, ' ', m->len - (size_t)(sp + 1 - m->str))) {
                st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: merge %ld \"%s\" is not two tokens split by one space",
                                 path, line, m->str);
                goto out;
            }
            st = add_merge_str(t, m->str, (size_t)(sp - m->str), sp + 1, m->len - (size_t)(sp + 1 - m->str), line, path, e);
        } else if (m->type == JDT_JSON_ARRAY && m->len == 2 && m->child->type == JDT_JSON_STRING &&
                   m->child->next->type == JDT_JSON_STRING) {
            st = add_merge_str(t, m->child->str, m->child->len, m->child->next->str, m->child->next->len, line, path, e);
        } else {
            st = jdt_err_set(e, JDT_ERR_FORMAT, "%s: merge %ld is neither \"a b\" nor [\"a\", \"b\"]", path, line);
        }
        if (st) goto out;
    }
    st = finish_setup(t, path, e);
out:
    jdt_json_doc_free(doc);
    return st;
}

static jdt_status load_gpt2_pair(jdt_bpe *t, const char *bpe_path, const char *enc_path, jdt_err *e)
{
    jdt_json_doc *doc = NULL;
    char *text = NULL;
    size_t n;
    jdt_status st = jdt_json_parse_file(enc_path, &doc, e);
    if (st) return st;
    const jdt_json *vocab = jdt_json_root(doc);
    const jdt_json *eot = jdt_json_get(vocab, "<|endoftext|>");
    int64_t eot_id;
    if (jdt_json_int(eot, 0, MAX_ID - 1, &eot_id) &&
        (st = add_added(t, (uint32_t)eot_id, "<|endoftext|>", 13, true, enc_path, e)))
        goto out;
    if ((st = load_vocab(t, vocab, enc_path, e))) goto out;
    if (!(t->regex = jdt_strdup(JDT_BPE_GPT2_REGEX))) {
        st = jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", bpe_path);
        goto out;
    }
    if ((st = jdt_io_read_all(bpe_path, &text, &n, e))) goto out;
    size_t n_lines = 1;
    for (size_t i = 0; i < n; i++) n_lines += text[i] == '\n';
    if ((st = merges_alloc(t, n_lines, bpe_path, e))) goto out;
    long line = 0;
    for (char *p = text, *end = text + n; p < end;) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *le = nl ? nl : end;
        line++;
        size_t len = (size_t)(le - p);
        if (len && p[len - 1] == '\r') len--;
        if (len == 0 || (line == 1 && p[0] == '#')) {
            p = le + 1;
            continue;
        }
        char *sp = memchr(p, ' ', len);
        if (!sp || memchr(sp + 1, ' ', len - (size_t)(sp + 1 - p))) {
            st = jdt_err_set(e, JDT_ERR_FORMAT, "%s:%ld: not two tokens split by one space", bpe_path, line);
            goto out;
        }
        if ((st = add_merge_str(t, p, (size_t)(sp - p), sp + 1, len - (size_t)(sp + 1 - p), line, bpe_path, e)))
            goto out;
        p = le + 1;
    }
    st = finish_setup(t, bpe_path, e);
out:
    jdt_free(text);
    jdt_json_doc_free(doc);
    return st;
}

static char *sibling(const char *path, const char *name)
{
    const char *slash = strrchr(path, '/');
    size_t d = slash ? (size_t)(slash - path + 1) : 0;
    char *r = jdt_malloc(d + strlen(name) + 1);
    if (!r) return NULL;
    memcpy(r, path, d);
    strcpy(r + d, name);
    return r;
}

jdt_status jdt_bpe_load(const char *path, jdt_bpe **out, jdt_err *e)
{
    *out = NULL;
    jdt_bpe *t = jdt_calloc(1, sizeof *t);
    char *a = NULL, *b = NULL;
    if (!t) return jdt_err_set(e, JDT_ERR_NOMEM, "out of memory");
    jdt_status st;
    size_t n = strlen(path);
    if (access(path, F_OK) != 0) {
        st = jdt_err_set(e, JDT_ERR_NOT_FOUND, "tokenizer %s: %s", path, strerror(errno));
    } else if (n >= 4 && strcmp(path + n - 4, ".bpe") == 0) {
        if (!(a = sibling(path, "encoder.json"))) goto oom;
        st = load_gpt2_pair(t, path, a, e);
    } else if (n >= 5 && strcmp(path + n - 5, ".json") == 0) {
        st = load_tokenizer_json(t, path, e);
    } else {
        size_t l = n + 20;
        if (!(a = jdt_malloc(l)) || !(b = jdt_malloc(l))) goto oom;
        snprintf(a, l, "%s/tokenizer.json", path);
        if (access(a, F_OK) == 0) {
            st = load_tokenizer_json(t, a, e);
        } else {
            snprintf(a, l, "%s/vocab.bpe", path);
            snprintf(b, l, "%s/encoder.json", path);
            if (access(a, F_OK) == 0)
                st = load_gpt2_pair(t, a, b, e);
            else
                st = jdt_err_set(e, JDT_ERR_NOT_FOUND,
                                 "tokenizer %s: neither tokenizer.json nor vocab.bpe + encoder.json "
                                 "(or %s is not a directory)",
                                 path, path);
        }
    }
    jdt_free(a);
    jdt_free(b);
    if (st) {
        jdt_bpe_free(t);
        return st;
    }
    *out = t;
    return JDT_OK;
oom:
    jdt_free(a);
    jdt_free(b);
    jdt_bpe_free(t);
    return jdt_err_set(e, JDT_ERR_NOMEM, "out of memory");
}

/* ---- writing tokenizer.json ----------------------------------------------------------------- */

static void put_token(FILE *f, const jdt_bpe *t, uint32_t id)
{
    fputc('"', f);
    put_byte_level(f, t->blob + t->tok_off[id], t->tok_len[id]);
    fputc('"', f);
}

jdt_status jdt_bpe_save(const jdt_bpe *t, const char *path, jdt_err *e)
{
    size_t l = strlen(path) + 8;
    char *tmp = jdt_malloc(l);
    if (!tmp) return jdt_err_set(e, JDT_ERR_NOMEM, "out of memory");
    snprintf(tmp, l, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        jdt_status st = jdt_err_set(e, JDT_ERR_IO, "%s: %s", tmp, strerror(errno));
        jdt_free(tmp);
        return st;
    }
    if (t->json_text) {
        fwrite(t->json_text, 1, t->json_len, f);
    } else {
        fputs("{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n  \"added_tokens\": [", f);
        for (int i = 0; i < t->n_added; i++) {
            const added_tok *a = &t->added[i];
            fprintf(f, "%s\n    {\"id\": %u, \"content\": ", i ? "," : "", a->id);
            jdt_json_write_string(f, t->blob + a->off, a->len);
            fprintf(f, ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
                       "\"normalized\": false, \"special\": %s}",
                    a->special ? "true" : "false");
        }
        fputs("\n  ],\n  \"normalizer\": null,\n", f);
        const char *aps = t->add_prefix_space ? "true" : "false";
        if (t->regex && strcmp(t->regex, JDT_BPE_GPT2_REGEX) != 0) {
            fputs("  \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [\n"
                  "    {\"type\": \"Split\", \"pattern\": {\"Regex\": ", f);
            jdt_json_write_string(f, t->regex, strlen(t->regex));
            fprintf(f, "}, \"behavior\": \"Isolated\", \"invert\": false},\n"
                       "    {\"type\": \"ByteLevel\", \"add_prefix_space\": %s, \"trim_offsets\": false, "
                       "\"use_regex\": false}]},\n", aps);
        } else {
            fprintf(f, "  \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": %s, "
                       "\"trim_offsets\": true, \"use_regex\": %s},\n", aps, t->regex ? "true" : "false");
        }
        fputs("  \"post_processor\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, "
              "\"trim_offsets\": false, \"use_regex\": true},\n"
              "  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, "
              "\"trim_offsets\": true, \"use_regex\": true},\n", f);
        fprintf(f, "  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": null,\n"
                   "    \"continuing_subword_prefix\": null,\n    \"end_of_word_suffix\": null,\n"
                   "    \"fuse_unk\": false,\n    \"byte_fallback\": false,\n    \"ignore_merges\": %s,\n"
                   "    \"vocab\": {", t->ignore_merges ? "true" : "false");
        bool first = true;
        for (int id = 0; id < t->n_vocab; id++) {
            if (t->tok_off[id] == NONE) continue;
            fputs(first ? "\n      " : ",\n      ", f);
            first = false;
            if (t->is_added[id])
                jdt_json_write_string(f, t->blob + t->tok_off[id], t->tok_len[id]);
            else
                put_token(f, t, (uint32_t)id);
            fprintf(f, ": %d", id);
        }
        fputs("\n    },\n    \"merges\": [", f);
        for (int r = 0; r < t->n_merges; r++) {
            fputs(r ? ",\n      \"" : "\n      \"", f);
            put_byte_level(f, t->blob + t->tok_off[t->merge_a[r]], t->tok_len[t->merge_a[r]]);
            fputc(' ', f);
            put_byte_level(f, t->blob + t->tok_off[t->merge_b[r]], t->tok_len[t->merge_b[r]]);
            fputc('"', f);
        }
        fputs("\n    ]\n  }\n}\n", f);
    }
    jdt_status st = JDT_OK;
    if (fflush(f) != 0 || ferror(f) || fsync(fileno(f)) != 0)
        st = jdt_err_set(e, JDT_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
    if (fclose(f) != 0 && st == JDT_OK) st = jdt_err_set(e, JDT_ERR_IO, "%s: %s", tmp, strerror(errno));
    if (st == JDT_OK && rename(tmp, path) != 0)
        st = jdt_err_set(e, JDT_ERR_IO, "%s: rename: %s", path, strerror(errno));
    if (st) remove(tmp);
    jdt_free(tmp);
    return st;
}

/* ---- training ------------------------------------------------------------------------------ */

typedef struct {
    uint64_t key; /* EMPTY_KEY = free */
    int64_t count;
    uint32_t *words; /* words that contained the pair when it was counted (may repeat or be
                      * stale: checked when used) */
    uint32_t n_words, cap_words;
} pair_ent;

typedef struct {
    int64_t count;
    uint32_t a, b;
} pq_ent;

typedef struct {
    /* unique pieces: bytes -> word index */
    uint32_t *wmap;
    size_t wmap_cap;
    char *wbytes;
    size_t wb_len, wb_cap;
    uint32_t *w_off, *w_len; /* bytes of each word */
    int64_t *w_count;
    size_t n_words, words_cap;
    /* symbols of each word (shrinking in place) */
    uint32_t *syms;
    uint32_t *s_off, *s_len;
    /* pair counts */
    pair_ent *pairs;
    size_t pcap, p_used;
    pq_ent *pq;
    size_t pq_n, pq_cap;
    uint32_t *touched;
    size_t n_touched, touched_cap;
    uint32_t *w_stamp; /* [n_words]: last merge that visited the word */
} trainer;

static bool grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 1024;
    while (c < need) c *= 2;
    void *q = jdt_realloc(*p, c * elem);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

static jdt_status count_word(jdt_bpe *t, const char *p, size_t n, void *ctx, jdt_err *e)
{
    trainer *tr = ctx;
    if (tr->n_words * 2 >= tr->wmap_cap) {
        size_t c = tr->wmap_cap ? tr->wmap_cap * 2 : 1 << 16;
        uint32_t *m = jdt_malloc(c * sizeof *m);
        if (!m) return jdt_err_set(e, JDT_ERR_NOMEM, "bpe train: out of memory");
        memset(m, 0xFF, c * sizeof *m);
        for (size_t w = 0; w < tr->n_words; w++) {
            size_t i = hash_bytes(tr->wbytes + tr->w_off[w], tr->w_len[w]) & (c - 1);
            while (m[i] != NONE) i = (i + 1) & (c - 1);
            m[i] = (uint32_t)w;
        }
        jdt_free(tr->wmap);
        tr->wmap = m;
        tr->wmap_cap = c;
    }
    size_t mask = tr->wmap_cap - 1, i = hash_bytes(p, n) & mask;
    for (; tr->wmap[i] != NONE; i = (i + 1) & mask) {
        uint32_t w = tr->wmap[i];
        if (tr->w_len[w] == n && memcmp(tr->wbytes + tr->w_off[w], p, n) == 0) {
            tr->w_count[w]++;
            return JDT_OK;
        }
    }
    size_t wc = tr->words_cap, wc2 = tr->words_cap, wc3 = tr->words_cap;
    if (!grow((void **)&tr->wbytes, &tr->wb_cap, tr->wb_len + n, 1) ||
        !grow((void **)&tr->w_off, &wc, tr->n_words + 1, sizeof *tr->w_off) ||
        !grow((void **)&tr->w_len, &wc2, tr->n_words + 1, sizeof *tr->w_len) ||
        !grow((void **)&tr->w_count, &wc3, tr->n_words + 1, sizeof *tr->w_count))
        return jdt_err_set(e, JDT_ERR_NOMEM, "bpe train: out of memory");
    tr->words_cap = wc;
    if (tr->wb_len + n >= NONE) return jdt_err_set(e, JDT_ERR_INVALID, "bpe train: over 4 GiB of distinct pieces");
    memcpy(tr->wbytes + tr->wb_len, p, n);
    uint32_t w = (uint32_t)tr->n_words++;
    tr->w_off[w] = (uint32_t)tr->wb_len;
    tr->w_len[w] = (uint32_t)n;
    tr->w_count[w] = 1;
    tr->wb_len += n;
    tr->wmap[i] = w;
    (void)t;
    return JDT_OK;
}

static jdt_status skip_added(jdt_bpe *t, uint32_t id, void *ctx, jdt_err *e) { return JDT_OK; }

static pair_ent *pair_slot(trainer *tr, uint32_t a, uint32_t b)
{
    uint64_t k = (uint64_t)a << 32 | b;
    size_t mask = tr->pcap - 1;
    size_t i = hash_u64(k) & mask;
    while (tr->pairs[i].key != EMPTY_KEY && tr->pairs[i].key != k) i = (i + 1) & mask;
    return &tr->pairs[i];
}

static bool pq_less(pq_ent x, pq_ent y) /* x before y: larger count, then smaller (a, b) */
{
    if (x.count != y.count) return x.count > y.count;
    if (x.a != y.a) return x.a < y.a;
    return x.b < y.b;
}

static bool pq_push(trainer *tr, pq_ent x)
{
    if (!grow((void **)&tr->pq, &tr->pq_cap, tr->pq_n + 1, sizeof *tr->pq)) return false;
    size_t i = tr->pq_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!pq_less(x, tr->pq[p])) break;
        tr->pq[i] = tr->pq[p];
        i = p;
    }
    tr->pq[i] = x;
    return true;
}

static pq_ent pq_pop(trainer *tr)
{
    pq_ent top = tr->pq[0], x = tr->pq[--tr->pq_n];
    size_t i = 0, n = tr->pq_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && pq_less(tr->pq[c + 1], tr->pq[c])) c++;
        if (!pq_less(tr->pq[c], x)) break;
        tr->pq[i] = tr->pq[c];
        i = c;
    }
    if (n) tr->pq[i] = x;
    return top;
}

/* Adds delta to pair (a, b), growing the table as needed; remembers the pair as touched and,
 * for a positive delta, word w as one that holds it. */
static bool pair_add(trainer *tr, uint32_t a, uint32_t b, int64_t delta, uint32_t w)
{
    if ((tr->p_used + 1) * 2 > tr->pcap) {
        size_t c = tr->pcap ? tr->pcap * 2 : 1 << 16;
        pair_ent *np = jdt_malloc(c * sizeof *np);
        if (!np) return false;
        for (size_t i = 0; i < c; i++) np[i].key = EMPTY_KEY;
        for (size_t i = 0; i < tr->pcap; i++) {
            if (tr->pairs[i].key == EMPTY_KEY) continue;
            size_t j = hash_u64(tr->pairs[i].key) & (c - 1);
            while (np[j].key != EMPTY_KEY) j = (j + 1) & (c - 1);
            np[j] = tr->pairs[i];
        }
        jdt_free(tr->pairs);
        tr->pairs = np;
        tr->pcap = c;
    }
    pair_ent *s = pair_slot(tr, a, b);
    if (s->key == EMPTY_KEY) {
        memset(s, 0, sizeof *s);
        s->key = (uint64_t)a << 32 | b;
        tr->p_used++;
    }
    s->count += delta;
    if (delta > 0 && (s->n_words == 0 || s->words[s->n_words - 1] != w)) {
        if (s->n_words == s->cap_words) {
            uint32_t c = s->cap_words ? s->cap_words * 2 : 4;
            uint32_t *nw = jdt_realloc(s->words, (size_t)c * sizeof *nw);
            if (!nw) return false;
            s->words = nw;
            s->cap_words = c;
        }
        s->words[s->n_words++] = w;
    }
    if (!grow((void **)&tr->touched, &tr->touched_cap, tr->n_touched + 2, sizeof *tr->touched)) return false;
    tr->touched[tr->n_touched++] = a;
    tr->touched[tr->n_touched++] = b;
    return true;
}

static void trainer_free(trainer *tr)
{
    for (size_t i = 0; i < tr->pcap; i++)
        if (tr->pairs[i].key != EMPTY_KEY) jdt_free(tr->pairs[i].words);
    jdt_free(tr->w_stamp);
    jdt_free(tr->wmap);
    jdt_free(tr->wbytes);
    jdt_free(tr->w_off);
    jdt_free(tr->w_len);
    jdt_free(tr->w_count);
    jdt_free(tr->syms);
    jdt_free(tr->s_off);
    jdt_free(tr->s_len);
    jdt_free(tr->pairs);
    jdt_free(tr->pq);
    jdt_free(tr->touched);
}

/* Pushes the current count of every touched pair (stale heap entries are skipped on pop). */
static bool push_touched(trainer *tr)
{
    for (size_t i = 0; i < tr->n_touched; i += 2) {
        pair_ent *s = pair_slot(tr, tr->touched[i], tr->touched[i + 1]);
        if (s->key != EMPTY_KEY && s->count > 0 &&
            !pq_push(tr, (pq_ent){s->count, tr->touched[i], tr->touched[i + 1]}))
            return false;
    }
    tr->n_touched = 0;
    return true;
}

jdt_status jdt_bpe_train(const char *text, size_t n_bytes, int vocab_size, bool progress,
                         jdt_bpe **out, jdt_err *e)
{
    *out = NULL;
    if (vocab_size < 257 || vocab_size > (1 << 24))
        return jdt_err_set(e, JDT_ERR_INVALID, "bpe train: vocab_size %d outside [257, 16777216]", vocab_size);
    const char *what = "bpe train";
    jdt_bpe *t = jdt_calloc(1, sizeof *t);
    trainer tr;
    memset(&tr, 0, sizeof tr);
    if (!t) return jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", what);
    jdt_status st;
    const uint32_t eot = (uint32_t)vocab_size - 1;
    if ((st = vocab_alloc(t, vocab_size, what, e))) goto out;
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        if ((t->tok_off[b] = blob_add(t, &c, 1)) == NONE) goto oom;
        t->tok_len[b] = 1;
    }
    if ((st = add_added(t, eot, "<|endoftext|>", 13, true, what, e))) goto out;
    t->tok_off[eot] = t->added[0].off;
    t->tok_len[eot] = 13;
    t->is_added[eot] = 1;
    if (!(t->regex = jdt_strdup(JDT_BPE_GPT2_REGEX))) goto oom;
    /* ids 256.. are filled as merges are made; the maps are rebuilt at the end */
    if ((st = vmap_build(t, what, e)) || (st = finish_setup(t, what, e))) goto out;
    jdt_progress prog;
    if (progress) {
        jdt_progress_begin(&prog, "BPE training: counting words", (double)n_bytes / 1048576.0, "MB");
        t->prog = &prog;
    }
    st = for_each_piece(t, text, n_bytes, count_word, skip_added, &tr, e);
    if (progress) {
        jdt_progress_end(&prog);
        t->prog = NULL;
    }
    if (st) goto out;
    if ((st = merges_alloc(t, (size_t)vocab_size, what, e))) goto out;

    /* symbols: every word starts as its bytes (ids 0..255 are the bytes) */
    if (!(tr.syms = jdt_malloc((tr.wb_len + 1) * sizeof *tr.syms)) ||
        !(tr.s_off = jdt_malloc((tr.n_words + 1) * sizeof *tr.s_off)) ||
        !(tr.s_len = jdt_malloc((tr.n_words + 1) * sizeof *tr.s_len)) ||
        !(tr.w_stamp = jdt_calloc(tr.n_words + 1, sizeof *tr.w_stamp)))
        goto oom;
    for (size_t w = 0; w < tr.n_words; w++) {
        tr.s_off[w] = tr.w_off[w];
        tr.s_len[w] = tr.w_len[w];
        for (uint32_t i = 0; i < tr.w_len[w]; i++)
            tr.syms[tr.w_off[w] + i] = (unsigned char)tr.wbytes[tr.w_off[w] + i];
        const uint32_t *s = tr.syms + tr.s_off[w];
        for (uint32_t i = 0; i + 1 < tr.s_len[w]; i++)
            if (!pair_add(&tr, s[i], s[i + 1], tr.w_count[w], (uint32_t)w)) goto oom;
    }
    if (!push_touched(&tr)) goto oom;
    uint32_t next_id = 256;
    char *buf = NULL;
    size_t buf_cap = 0;
    if (progress) jdt_progress_begin(&prog, "BPE training: merges", (double)(eot - 256), "merges");
    while (next_id < eot && tr.pq_n) {
        pq_ent best = pq_pop(&tr);
        pair_ent *s = pair_slot(&tr, best.a, best.b);
        if (s->key == EMPTY_KEY || s->count != best.count) continue; /* stale */
        if (best.count < 2) break;
        uint32_t a = best.a, b = best.b, z = next_id++;
        if (progress) jdt_progress_update(&prog, (double)(next_id - 256));
        size_t la = t->tok_len[a], lb = t->tok_len[b];
        if (!grow((void **)&buf, &buf_cap, la + lb, 1)) goto oom_buf;
        memcpy(buf, t->blob + t->tok_off[a], la);
        memcpy(buf + la, t->blob + t->tok_off[b], lb);
        uint32_t off = blob_add(t, buf, la + lb);
        if (off == NONE) goto oom_buf;
        t->tok_off[z] = off;
        t->tok_len[z] = (uint32_t)(la + lb);
        t->merge_a[t->n_merges] = a;
        t->merge_b[t->n_merges] = b;
        t->n_merges++;
        /* only the words listed for (a, b) can hold it; the list is taken over because
         * pair_add may grow the table (moving s) and appends to lists while we walk it */
        uint32_t *list = s->words, n_list = s->n_words;
        s->words = NULL;
        s->n_words = s->cap_words = 0;
        for (uint32_t li = 0; li < n_list; li++) {
            uint32_t w = list[li];
            if (tr.w_stamp[w] == z) continue; /* listed twice */
            tr.w_stamp[w] = z;
            uint32_t *sy = tr.syms + tr.s_off[w], L = tr.s_len[w];
            bool has = false;
            for (uint32_t i = 0; i + 1 < L; i++)
                if (sy[i] == a && sy[i + 1] == b) {
                    has = true;
                    break;
                }
            if (!has) continue;
            int64_t c = tr.w_count[w];
            for (uint32_t i = 0; i + 1 < L; i++)
                if (!pair_add(&tr, sy[i], sy[i + 1], -c, w)) goto oom_list;
            uint32_t o = 0;
            for (uint32_t i = 0; i < L; i++) {
                if (i + 1 < L && sy[i] == a && sy[i + 1] == b) {
                    sy[o++] = z;
                    i++;
                } else {
                    sy[o++] = sy[i];
                }
            }
            tr.s_len[w] = o;
            for (uint32_t i = 0; i + 1 < o; i++)
                if (!pair_add(&tr, sy[i], sy[i + 1], c, w)) goto oom_list;
        }
        jdt_free(list);
        if (!push_touched(&tr)) goto oom_buf;
        continue;
    oom_list:
        jdt_free(list);
        goto oom_buf;
    }
    jdt_free(buf);
    if (progress) jdt_progress_end(&prog);
    /* the special token takes the id after the last merge (the vocabulary shrinks if training
     * stopped early) */
    uint32_t final_eot = next_id;
    t->tok_off[final_eot] = t->added[0].off;
    t->tok_len[final_eot] = 13;
    t->is_added[final_eot] = 1;
    if (final_eot != eot) {
        t->is_added[eot] = 0;
        t->tok_off[eot] = NONE;
    }
    t->added[0].id = final_eot;
    t->n_vocab = (int)final_eot + 1;
    /* rebuild the lookup tables over the final vocabulary */
    jdt_free(t->vmap);
    t->vmap = NULL;
    memset(t->mkey, 0xFF, t->mcap * sizeof *t->mkey);
    int nm = t->n_merges;
    t->n_merges = 0;
    for (int r = 0; r < nm; r++)
        merge_add(t, t->merge_a[r], t->merge_b[r], 256 + (uint32_t)r, e);
    if ((st = vmap_build(t, what, e))) goto out;
    cache_clear(t);
    trainer_free(&tr);
    *out = t;
    return JDT_OK;
oom_buf:
    jdt_free(buf);
    if (progress) jdt_progress_end(&prog);
oom:
    st = jdt_err_set(e, JDT_ERR_NOMEM, "%s: out of memory", what);
out:
    trainer_free(&tr);
    jdt_bpe_free(t);
    return st;
}
