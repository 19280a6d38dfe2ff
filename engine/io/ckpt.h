/*
 * ckpt.h — HDF5 checkpoints (engine/io, prefix jdt_ckpt_). Layout: docs/checkpoints.md.
 *
 * A checkpoint is a directory <ckpt_dir>/step_000123/ holding state.h5: every tensor under its
 * stable global name ("/params/blocks.0.attn.wq", "/opt/m/...") with its GLOBAL shape and
 * dtype, row-major, plus root attributes format="jdt-ckpt", version (JDT_CKPT_VERSION), step,
 * rng_state, data_position and the resolved config text. It is written as step_000123.tmp/,
 * fsync'd, and renamed into place: a directory named step_NNN exists only once it is complete, so a
 * crash mid-save never yields a checkpoint that looks whole. Leftover *.tmp directories are ignored
 * by resume and removed by the next save.
 *
 * Shaped for sharding: the writer takes tensors as (name, dtype, global shape, local slice
 * offset/extent, pointer to the slice) and the reader reads any slice of a named tensor, so a
 * job can restore onto a different mesh. One process passes slices that together cover every
 * tensor (usually one whole-tensor slice each); several processes each pass their own slices
 * and a barrier (see jdt_ckpt_save_opts), and state.h5 then maps the rank files as HDF5
 * virtual datasets.
 */
#ifndef JDT_IO_CKPT_H
#define JDT_IO_CKPT_H

#include "core/core.h"

#define JDT_CKPT_FORMAT "jdt-ckpt"
#define JDT_CKPT_VERSION 2 /* 2: root attribute meta_checksum; 1 is still read */
#define JDT_CKPT_FILE "state.h5"
#define JDT_CKPT_MAX_DIMS 8

/* A tensor slice to write, or (for jdt_ckpt_read) the slice wanted. */
typedef struct {
    const char *name; /* global name: "params/wte" ('/' separates groups; a
                         leading '/' is optional); [A-Za-z0-9_.-/] only */
    jdt_dtype dtype;
    int ndim;                          /* 0 (scalar) .. JDT_CKPT_MAX_DIMS */
    int64_t shape[JDT_CKPT_MAX_DIMS];  /* global shape, every dim >= 1 */
    int64_t offset[JDT_CKPT_MAX_DIMS]; /* start of the slice per dim */
    int64_t extent[JDT_CKPT_MAX_DIMS]; /* slice size per dim; all zero: the whole tensor */
    const void *data;                  /* save: the slice, row-major (extent); read: unused */
} jdt_ckpt_tensor;

typedef struct {
    int64_t step;
    uint64_t rng_state;      /* the trainer's RNG state: it writes run.seed (its streams are
                                keyed on seed, index and step, so nothing else is needed) */
    int64_t data_position;   /* the next global batch index of the data stream */
    const char *config_text; /* the resolved config (YAML); NULL is stored as "" */
} jdt_ckpt_meta;

typedef struct {
    int keep_last; /* after a successful save, delete all but the newest keep_last complete
                      checkpoints (never the one just saved); <= 0 keeps all */
    /* Called after each tensor is written to the temp directory (n_done of n_total); for
     * progress logs, and tests that kill the writer mid-save. May be NULL. */
    void (*on_progress)(void *ctx, size_t n_done, size_t n_total);
    void *progress_ctx;
    /* Multi-process save (world_size > 1): each rank passes only the slices it owns (exactly
     * one rank passes each piece of a replicated tensor) and writes them to
     * step_N.tmp/rank_<rank>.h5; rank 0 then checks that the slices of all ranks are disjoint
     * and cover every tensor, writes state.h5 whose datasets are HDF5 virtual datasets over the
     * rank files (h5py and jdt_ckpt_read see whole tensors), and commits by rename. barrier
     * must block until every rank has called it (the dist layer's barrier); it is called three
     * times, by every rank, even after a local error. world_size <= 1: single process. */
    int rank;
    int world_size;
    jdt_status (*barrier)(void *ctx, jdt_err *e);
    void *barrier_ctx;
} jdt_ckpt_save_opts;

/* Writes checkpoint meta->step into ckpt_dir (created if missing) atomically: temp dir, fsync
 * of the files and the directories, rename; replaces an existing checkpoint of the same step
 * by an atomic exchange. Removes leftover *.tmp directories first and prunes to
 * opts->keep_last after. opts may be NULL. If saved_path is non-NULL it receives the final
 * directory (jdt_malloc'd; caller frees). Errors name the file and tensor: ERR_INVALID (bad
 * name, shape, slice outside the tensor, overlapping or missing coverage, duplicate name with
 * another shape), ERR_IO. On error nothing named step_NNN is created. Multi-process
 * (opts->world_size > 1): every rank calls it with the same meta, in the same order relative to
 * other collective calls; ckpt_dir must be on a file system all ranks share. Rank 0's status
 * is the checkpoint's status (it alone checks coverage and commits; JDT_OK once committed, even
 * if the last barrier then fails); other ranks report their own write errors and failed
 * barriers only, so the trainer should agree on the outcome (e.g. an all-reduce). */
jdt_status jdt_ckpt_save(const char *ckpt_dir, const jdt_ckpt_meta *meta,
                         const jdt_ckpt_tensor *tensors, size_t n_tensors,
                         const jdt_ckpt_save_opts *opts, char **saved_path, jdt_err *e);

/* Checks, before training starts, that ckpt_dir (created if missing) is writable and has room
 * for one checkpoint of these tensors (the same upper bound jdt_ckpt_save reserves, the data
 * pointers are not read): ERR_IO "checkpoint directory D is not writable: Permission denied"
 * or "... has no room for one checkpoint: No space left on device: needs X, Y free there".
 * Leaves nothing behind. Any rank may call it; no collective. */
jdt_status jdt_ckpt_preflight(const char *ckpt_dir, const jdt_ckpt_meta *meta,
                              const jdt_ckpt_tensor *tensors, size_t n_tensors, jdt_err *e);

/* Finds the newest complete checkpoint in ckpt_dir (a step_NNN directory with a state.h5;
 * *.tmp are ignored). Returns JDT_OK with *path (jdt_malloc'd) and *step (may be NULL), or
 * ERR_NOT_FOUND if there is none (or ckpt_dir does not exist). */
jdt_status jdt_ckpt_find_latest(const char *ckpt_dir, char **path, int64_t *step, jdt_err *e);

/* Resolves a `resume:` setting. "auto": the newest checkpoint in ckpt_dir, or *path = NULL
 * (start fresh) if there is none. "" or "none": *path = NULL. Anything else is a checkpoint
 * directory, which must exist (ERR_NOT_FOUND naming it otherwise). */
jdt_status jdt_ckpt_resolve(const char *resume, const char *ckpt_dir, char **path, jdt_err *e);

/* Deletes all but the newest `keep` complete checkpoints in ckpt_dir (keep <= 0: none). */
jdt_status jdt_ckpt_prune(const char *ckpt_dir, int keep, jdt_err *e);

typedef struct jdt_ckpt jdt_ckpt;

/* Opens a checkpoint (a step directory, or its state.h5) and checks format and version.
 * ERR_NOT_FOUND (missing), ERR_FORMAT (not HDF5, truncated, wrong format/version, missing
 * attribute), each naming the file. On success the caller owns *out. */
jdt_status jdt_ckpt_open(const char *path, jdt_ckpt **out, jdt_err *e);

/* The checkpoint's metadata; config_text points into c (valid until close). */
void jdt_ckpt_get_meta(const jdt_ckpt *c, jdt_ckpt_meta *out);

/* Returns the names of all tensors (sorted; jdt_malloc'd array of jdt_malloc'd strings,
 * without the leading '/'; free each and the array). */
jdt_status jdt_ckpt_list(jdt_ckpt *c, char ***names, size_t *n_names, jdt_err *e);

/* Looks up a tensor: dtype, ndim and global shape (shape has JDT_CKPT_MAX_DIMS slots).
 * ERR_NOT_FOUND naming the file and tensor if absent. */
jdt_status jdt_ckpt_tensor_info(jdt_ckpt *c, const char *name, jdt_dtype *dtype, int *ndim,
                                int64_t *shape, jdt_err *e);

/* Reads the slice want->offset/extent (all-zero extent: whole tensor) of tensor want->name
 * into dst (row-major over the extent). want->dtype, ndim and shape are what the caller
 * expects and are checked: ERR_NOT_FOUND (missing tensor), ERR_SHAPE (other shape, or slice
 * out of bounds), ERR_FORMAT (other dtype, corrupt data: checksums are verified), all naming
 * the file and tensor. */
jdt_status jdt_ckpt_read(jdt_ckpt *c, const jdt_ckpt_tensor *want, void *dst, jdt_err *e);

/* Closes c. NULL is a no-op. */
void jdt_ckpt_close(jdt_ckpt *c);

#endif /* JDT_IO_CKPT_H */
