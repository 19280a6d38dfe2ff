/* placeholder */
typedef int jdt_cuda_emit_placeholder;
