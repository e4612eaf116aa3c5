/* CumSum: input viewed as [outer, size, inner]; one work-item per (outer, inner) runs along the
 * size axis (backwards when reverse), writing each sum before (exclusive) or after (inclusive)
 * adding its own element, in order, as NumPy's cumsum. Reading an element before writing its
 * output also makes an in-place run correct. int32 sums wrap (computed on uint). */

#define ADD_F(a, b) ((a) + (b))
#define ADD_I(a, b) as_int(as_uint(a) + as_uint(b))

#define CUMSUM_KERNEL(SUF, T, ADD)                                                             \
__kernel void cumsum_##SUF(__global const T* x, const int x_off, __global T* y, const int y_off,  \
                           const int outer, const int size, const int inner,                   \
                           const int exclusive, const int reverse)                             \
{                                                                                              \
    const int gid = get_global_id(0);                                                          \
    if (gid >= outer * inner) return;                                                          \
    const int o = gid / inner, i = gid - o * inner;                                            \
    const int step = reverse ? -inner : inner;                                                 \
    int k = o * size * inner + i + (reverse ? (size - 1) * inner : 0);                         \
    T acc = (T)(0);                                                                            \
    for (int s = 0; s < size; ++s, k += step) {                                                \
        const T v = x[x_off + k];                                                              \
        if (exclusive) { y[y_off + k] = acc; acc = ADD(acc, v); }                              \
        else { acc = ADD(acc, v); y[y_off + k] = acc; }                                        \
    }                                                                                          \
}

CUMSUM_KERNEL(f, float, ADD_F)
CUMSUM_KERNEL(i, int, ADD_I)
