/* Gather with run-time indices: data [outer, axis, inner], indices int32 [count] (negative
 * counted from the end) -> out [outer, count, inner], copied as ELEM_T (index.cl). Out-of-range
 * indices are clamped (the reference raises; a kernel cannot). */

__kernel void gather(__global const ELEM_T* data, const int d_off, __global const int* idx, const int i_off,
                     __global ELEM_T* y, const int y_off,
                     const int outer, const int axis, const int inner, const int count)
{
    const int gid = get_global_id(0);
    if (gid >= outer * count * inner) return;
    int o, j, i;
    split3(gid, count, inner, &o, &j, &i);
    int k = idx[i_off + j];
    if (k < 0) k += axis;
    k = clamp(k, 0, axis - 1);
    y[y_off + gid] = data[d_off + (o * axis + k) * inner + i];
}
