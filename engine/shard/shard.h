/*
 * shard.h — the SPMD partitioner: the device mesh, logical-axis sharding rules, per-dim
 * placements and the pass that turns a global forward graph into this rank's local graph with
 * explicit collectives (see docs/sharding.md).
 *
 * Mesh. Three axes, outermost first: data, fsdp, tensor. A rank's coordinate is its row-major
 * index in that order, tensor innermost: rank = (d * F + f) * T + t. So the T ranks of one
 * tensor group are consecutive (one node with the launcher's and SLURM's block placement).
 *
 * Groups. A process group is named by a bitmask of mesh axes (bit JDT_MESH_DATA ...): the
 * ranks whose coordinates agree with this rank's on every axis outside the mask, ordered by
 * their row-major index over the masked axes. Collective ops in a partitioned graph carry that
 * mask as their group id; the trainer creates one comm group per mask it meets.
 *
 * Placement. Per dim, the mask of mesh axes it is split over (several axes split a dim in mesh
 * order, data outermost); plus `partial`, the axes over which the local values are partial
 * sums of the global value. Axes of size 1 never appear.
 *
 * Autodiff convention (graph.h): collectives transpose over the stacked per-rank values, so
 * the partitioned forward graph is differentiated as it is; the loss is seeded with
 * jdt_shard_loss_seed and each gradient is summed over the axes its parameter is not stored
 * split over (jdt_shard_grad_axes) — the data-parallel all-reduce is that rule on `data`.
 */
#ifndef JDT_SHARD_H
#define JDT_SHARD_H

#include "config/config.h"
#include "graph/graph.h"

typedef struct {
    int size[JDT_MESH_AXIS_COUNT];  /* devices along data, fsdp, tensor */
    int coord[JDT_MESH_AXIS_COUNT]; /* this rank's coordinate */
    int world_size, rank;
} jdt_mesh;

typedef struct {
    uint8_t dim[JDT_MAX_DIMS]; /* mesh-axis mask splitting each dim */
    uint8_t partial;           /* axes over which the value is a partial sum */
} jdt_placement;

/* Builds the mesh for world_size ranks from sizes (data, fsdp, tensor; at most one may be -1
 * and is filled in so that the product is world_size). Errors (ERR_CONFIG, one line naming the
 * mesh): two -1s, a size < 1, a product that is not world_size, rank out of range. */
jdt_status jdt_mesh_init(jdt_mesh *m, const int sizes[JDT_MESH_AXIS_COUNT], int world_size,
                         int rank, jdt_err *e);

/* Number of ranks in the group of axes mask `axes` (1 for mask 0). */
int jdt_mesh_group_size(const jdt_mesh *m, unsigned axes);
/* This rank's index within the group of `axes` (row-major over the masked coordinates). */
int jdt_mesh_group_index(const jdt_mesh *m, unsigned axes);
/* Writes the group's ranks in group order into ranks (jdt_mesh_group_size entries). */
void jdt_mesh_group_ranks(const jdt_mesh *m, unsigned axes, int *ranks);
/* Mask without the axes of size 1. */
unsigned jdt_mesh_live(const jdt_mesh *m, unsigned axes);
/* "data+tensor" style name of a mask ("none" for 0) into buf; returns buf. */
const char *jdt_mesh_axes_str(unsigned axes, char *buf, size_t n);

/* The placement of a leaf from the rules (MaxText logical_axis_rules semantics): for each dim
 * with a logical name, the first rule for that name whose mesh axes are all unused by earlier
 * dims of this tensor wins; no rule, or none that fits: replicated. Size-1 axes are dropped.
 * ERR_CONFIG (one line naming the tensor, dim and axis) when a dim does not divide evenly. */
jdt_status jdt_shard_leaf_placement(const jdt_mesh *m, const jdt_config_rules *rules,
                                    const jdt_tensor *t, jdt_placement *out, jdt_err *e);

/* Local shape of global shape s under placement p (each split dim divided by its ways). */
jdt_shape jdt_shard_local_shape(const jdt_mesh *m, const jdt_shape *s, const jdt_placement *p);
/* Offset of this rank's block along dim d of global shape s under p. */
int64_t jdt_shard_local_offset(const jdt_mesh *m, const jdt_shape *s, const jdt_placement *p,
                               int d);

/* Copies this rank's block of the whole f32 tensor src (global shape s, placement p) into
 * dst (the local shape, row-major). */
void jdt_shard_copy_block(const jdt_mesh *m, const jdt_shape *s, const jdt_placement *p,
                          const float *src, float *dst);

/* The mesh axes the rules split the logical axis `batch` over (first rule for "batch";
 * replicated if none), without size-1 axes. */
unsigned jdt_shard_batch_axes(const jdt_mesh *m, const jdt_config_rules *rules);

/* This rank's rows [*begin, *end) of a global batch of `rows` split evenly over those axes (by
 * its coordinate there: ranks that differ only in other axes, e.g. tensor, get the same rows). */
void jdt_shard_batch_rows(const jdt_mesh *m, const jdt_config_rules *rules, int64_t rows,
                          int64_t *begin, int64_t *end);

/* The ways the rules split the sequence dim of the (batch, seq) inputs (`[seq, tensor]`:
 * Megatron-LM's sequence parallelism), as the model's loss wants it (jdt_model_build_ex's
 * seq_ways): 1 when the sequence is whole, and also when the vocabulary is split over one of
 * the same axes (the head is then vocab-parallel on rows gathered whole). */
int jdt_shard_seq_ways(const jdt_mesh *m, const jdt_config_rules *rules);

/* A partitioned graph: the local graph and the map from global node ids. */
typedef struct {
    jdt_graph *g;              /* the local graph (owned by the caller after partitioning) */
    jdt_tensor **map;          /* (global graph's node count) local tensor of each global node */
    jdt_placement *place;      /* (same) its placement */
    int n_collectives;         /* collectives inserted */
} jdt_shard_result;

/*
 * Partitions the forward graph src for mesh m: every leaf gets its placement from the rules
 * (params, inputs) or is replicated (constants, scalar inputs); each op's partition rule picks
 * the placements it needs and the output's, and where an input has another placement the
 * collective is inserted (partial -> replicated all-reduce, split -> replicated all-gather;
 * replicated -> split is a local slice). Leaves keep their names and data pointers (callers
 * rebind data to local buffers). On success out->g is a new graph and out->map/place are
 * jdt_malloc'd arrays (free with jdt_shard_result_free). Errors: ERR_CONFIG (a rule does not
 * divide a dim), ERR_UNSUPPORTED (an op without a partition rule, naming it).
 */
jdt_status jdt_shard_partition(const jdt_mesh *m, const jdt_config_rules *rules,
                               const jdt_graph *src, jdt_shard_result *out, jdt_err *e);
void jdt_shard_result_free(jdt_shard_result *r);

/* Turns a local value with placement p into its replicated global value in g: all-reduce over
 * p.partial, all-gather every split dim. (Used for losses, metrics and the fallback rule.) */
jdt_tensor *jdt_shard_replicate(const jdt_mesh *m, jdt_graph *g, jdt_tensor *x,
                                const jdt_placement *p);

/* Scale for the local scalar loss (placement p) so that the per-rank objectives sum to the
 * global loss: 1 / (ranks over which the loss is replicated rather than partial). */
double jdt_shard_loss_seed(const jdt_mesh *m, const jdt_placement *p);

/* Axes over which a parameter's local gradient must be summed: the live axes it is not stored
 * split over (its storage placement p). */
unsigned jdt_shard_grad_axes(const jdt_mesh *m, const jdt_placement *p);

#endif /* JDT_SHARD_H */
