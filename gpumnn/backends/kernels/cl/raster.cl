/* Raster: fill, then one strided copy per region (offsets/strides in elements, may be <= 0).
 * Elements are ELEM_T (index.cl: 32-bit words, or 16-/8-bit elements with -DELEM) of any storage
 * dtype: copied, never converted; the fill arrives as the bits the host made of it
 * (atomic.fill_bits). */

__kernel void raster_fill(__global ELEM_T* dst, const int d_off, const int n, const uint value)
{
    const int i = get_global_id(0);
    if (i < n) dst[d_off + i] = (ELEM_T)value;
}

__kernel void raster_copy(__global const ELEM_T* src, const int s_off,
                          __global ELEM_T* dst, const int d_off,
                          const int n1, const int n2, const int n3, const int n,
                          const int ss0, const int ss1, const int ss2, const int ss3,
                          const int ds0, const int ds1, const int ds2, const int ds3)
{
    const int i = get_global_id(0);
    if (i >= n) return;
    int i0, i1, i2, i3;
    split4(i, n1, n2, n3, &i0, &i1, &i2, &i3);
    dst[d_off + i0 * ds0 + i1 * ds1 + i2 * ds2 + i3 * ds3] =
        src[s_off + i0 * ss0 + i1 * ss1 + i2 * ss2 + i3 * ss3];
}

/* GPUs: the strided regions of one source in one launch (global dim 1 = region), each region's
 * geometry one row of RASTER_REGION_WORDS ints of a table (the generated header defines it):
 * count, n1, n2, n3, s_off, d_off, ss0..ss3, ds0..ds3. The host merges only regions that write
 * disjoint elements (their order then does not matter): Winograd's 16 input-tile regions were
 * 16 launches. */
__kernel void raster_copy_regions(__global const ELEM_T* src, __global ELEM_T* dst, __global const int* table)
{
    __global const int* t = table + get_global_id(1) * RASTER_REGION_WORDS;
    const int i = get_global_id(0);
    if (i >= t[0]) return;
    int i0, i1, i2, i3;
    split4(i, t[1], t[2], t[3], &i0, &i1, &i2, &i3);
    dst[t[5] + i0 * t[10] + i1 * t[11] + i2 * t[12] + i3 * t[13]] =
        src[t[4] + i0 * t[6] + i1 * t[7] + i2 * t[8] + i3 * t[9]];
}

/* Common special case: a contiguous run (concat / slice of whole rows). */
__kernel void raster_copy_flat(__global const ELEM_T* src, const int s_off,
                               __global ELEM_T* dst, const int d_off, const int n)
{
    const int i = get_global_id(0);
    if (i < n) dst[d_off + i] = src[s_off + i];
}

#ifdef VEC
/* CPU devices: a work-item copies VEC elements of the innermost dim (vector load / store when
 * that dim is contiguous, else a gather / scatter) -- no integer division per element.
 * Global: (ceil(n3/VEC), n2, n0*n1). */
__kernel void raster_copy_vec(__global const ELEM_T* src, const int s_off,
                              __global ELEM_T* dst, const int d_off,
                              const int n1, const int n2, const int n3,
                              const int ss0, const int ss1, const int ss2, const int ss3,
                              const int ds0, const int ds1, const int ds2, const int ds3)
{
    const int i3 = get_global_id(0) * VEC, i2 = get_global_id(1), z = get_global_id(2);
    if (i3 >= n3) return;
    const int i1 = z % n1, i0 = z / n1;
    __global const ELEM_T* ps = src + s_off + i0 * ss0 + i1 * ss1 + i2 * ss2 + i3 * ss3;
    __global ELEM_T* pd = dst + d_off + i0 * ds0 + i1 * ds1 + i2 * ds2 + i3 * ds3;
    const int count = min(VEC, n3 - i3);
    if (count == VEC && ss3 == 1 && ds3 == 1) {
        VSTORE(VLOAD(0, ps), 0, pd);
    } else {
        for (int e = 0; e < count; ++e) pd[e * ds3] = ps[e * ss3];
    }
}
#endif
