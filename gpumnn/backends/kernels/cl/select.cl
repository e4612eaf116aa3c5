/* Select (Where): out[i] = cond[i . c_strides] != 0 ? a[i . a_strides] : b[i . b_strides] over a
 * RANK-4 shape (d0, d1, d2, d3); cond is int32, a / b / out ELEM_T (index.cl) of any storage dtype. */

__kernel void select_words(__global const int* cond, const int c_off,
                           __global const ELEM_T* a, const int a_off,
                           __global const ELEM_T* b, const int b_off,
                           __global ELEM_T* out, const int o_off,
                           const int d1, const int d2, const int d3, const int n,
                           const int cs0, const int cs1, const int cs2, const int cs3,
                           const int as0, const int as1, const int as2, const int as3,
                           const int bs0, const int bs1, const int bs2, const int bs3)
{
    const int i = get_global_id(0);
    if (i >= n) return;
    int i0, i1, i2, i3;
    split4(i, d1, d2, d3, &i0, &i1, &i2, &i3);
    out[o_off + i] = cond[c_off + i0 * cs0 + i1 * cs1 + i2 * cs2 + i3 * cs3] != 0
        ? a[a_off + i0 * as0 + i1 * as1 + i2 * as2 + i3 * as3]
        : b[b_off + i0 * bs0 + i1 * bs1 + i2 * bs2 + i3 * bs3];
}
