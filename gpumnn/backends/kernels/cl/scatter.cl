/* Scatter (ScatterND / ScatterElements) on out [rows, inner], after the host copied data into
 * out: row index[j] (negative counted from the end, out of range clamped, as Gather) receives
 * updates[j] (needs activation.cl and integer.cl for the reductions). */

inline int scatter_row(__global const int* index, const int j, const int rows)
{
    int r = index[j];
    if (r < 0) r += rows;
    return clamp(r, 0, rows - 1);
}

/* reduction none: one work-item per update element, copied as ELEM_T (index.cl); with a repeated row one
 * write wins (ONNX leaves the order undefined). */
__kernel void scatter_set(__global const int* index, const int i_off, __global const ELEM_T* upd, const int u_off,
                          __global ELEM_T* out, const int o_off, const int rows, const int inner, const int count)
{
    const int gid = get_global_id(0);
    if (gid >= count * inner) return;
    const int j = gid / inner, i = gid - j * inner;
    out[o_off + scatter_row(index + i_off, j, rows) * inner + i] = upd[u_off + gid];
}

/* add / mul / max / min (the Binary op id ``op``): one work-item per column i of inner combines
 * the updates in order j = 0, 1, .. -- repeated rows accumulate, in NumPy's ufunc.at order, with
 * no atomics (the columns are independent). */
#define SCATTER_REDUCE_KERNEL(SUF, T, APPLY)                                                   \
__kernel void scatter_reduce_##SUF(__global const int* index, const int i_off,                 \
                                   __global const T* upd, const int u_off,                     \
                                   __global T* out, const int o_off,                           \
                                   const int rows, const int inner, const int count, const int op) \
{                                                                                              \
    const int i = get_global_id(0);                                                            \
    if (i >= inner) return;                                                                    \
    for (int j = 0; j < count; ++j) {                                                          \
        __global T* p = out + o_off + scatter_row(index + i_off, j, rows) * inner + i;         \
        *p = APPLY(op, *p, upd[u_off + j * inner + i]);                                        \
    }                                                                                          \
}

SCATTER_REDUCE_KERNEL(f, float, apply_binary)
SCATTER_REDUCE_KERNEL(i, int, apply_binary_int)
