/* Unary and Binary atomic ops (needs activation.cl and integer.cl).
 *
 * One kernel per (input dtype, output dtype), suffixed f (float32) / i (int32): the op is
 * computed in the input's type (APPLY), then converted to the output's (CONV: float to int32
 * truncates toward zero, as a Cast does). Unary params have the input's type (the host converts
 * clip's bounds for int32). A comparison of floats is computed as a float 1/0 and converted; the
 * fused activation of a float Binary runs before that conversion. The ff kernels' tensors are
 * DATA_T (index.cl: float16 with -DHALF, loaded by LOADF / stored by STOREF); the others' plain. */

#define SAME(v) (v)
#define PLAIN_LOAD(p, i) ((p)[i])
#define PLAIN_STORE(v, p, i) ((p)[i] = (v))

#define UNARY_KERNEL(SUF, TI, TO, PT, APPLY, CONV, LOAD, STORE)                               \
__kernel void unary_##SUF(__global const TI* x, const int x_off,                               \
                          __global TO* y, const int y_off, const int n,                        \
                          const int op, const PT p0, const PT p1, const PT p2)                 \
{                                                                                              \
    const int i = get_global_id(0);                                                            \
    if (i < n) STORE(CONV(APPLY(op, LOAD(x, x_off + i), p0, p1, p2)), y, y_off + i);           \
}

UNARY_KERNEL(ff, DATA_T, DATA_T, float, apply_unary, SAME, LOADF, STOREF)
UNARY_KERNEL(fi, float, int, float, apply_unary, convert_int_rtz, PLAIN_LOAD, PLAIN_STORE)
UNARY_KERNEL(ii, int, int, int, apply_unary_int, SAME, PLAIN_LOAD, PLAIN_STORE)
UNARY_KERNEL(if, int, float, int, apply_unary_int, convert_float, PLAIN_LOAD, PLAIN_STORE)

/* the epilogue of a Binary: the fused activation (float results only; the contract has none on int32) */
#define EPILOGUE_F(r) apply_unary(act, r, p0, p1, p2)
#define EPILOGUE_FI(r) convert_int_rtz(apply_unary(act, r, p0, p1, p2))

/* binary_SUF: out[i] = act(op(a[i . a_strides], b[i . b_strides])) over a RANK-4 shape
 * (d0, d1, d2, d3); binary_flat_SUF: both operands contiguous over the output (residual adds). */
#define BINARY_KERNELS(SUF, TI, TC, TO, APPLY, EPILOGUE, LOAD, STORE)                          \
__kernel void binary_##SUF(__global const TI* a, const int a_off,                              \
                           __global const TI* b, const int b_off,                              \
                           __global TO* out, const int o_off,                                  \
                           const int d1, const int d2, const int d3, const int n,              \
                           const int as0, const int as1, const int as2, const int as3,         \
                           const int bs0, const int bs1, const int bs2, const int bs3,         \
                           const int op, const int act, const float p0, const float p1, const float p2) \
{                                                                                              \
    const int i = get_global_id(0);                                                            \
    if (i >= n) return;                                                                        \
    int i0, i1, i2, i3;                                                                        \
    split4(i, d1, d2, d3, &i0, &i1, &i2, &i3);                                                 \
    const TC va = LOAD(a, a_off + i0 * as0 + i1 * as1 + i2 * as2 + i3 * as3);                  \
    const TC vb = LOAD(b, b_off + i0 * bs0 + i1 * bs1 + i2 * bs2 + i3 * bs3);                  \
    STORE(EPILOGUE(APPLY(op, va, vb)), out, o_off + i);                                        \
}                                                                                              \
__kernel void binary_flat_##SUF(__global const TI* a, const int a_off,                         \
                                __global const TI* b, const int b_off,                         \
                                __global TO* out, const int o_off, const int n,                \
                                const int op, const int act, const float p0, const float p1, const float p2) \
{                                                                                              \
    const int i = get_global_id(0);                                                            \
    if (i < n) STORE(EPILOGUE(APPLY(op, LOAD(a, a_off + i), LOAD(b, b_off + i))), out, o_off + i); \
}

BINARY_KERNELS(ff, DATA_T, float, DATA_T, apply_binary, EPILOGUE_F, LOADF, STOREF)
BINARY_KERNELS(fi, float, float, int, apply_binary, EPILOGUE_FI, PLAIN_LOAD, PLAIN_STORE)
BINARY_KERNELS(ii, int, int, int, apply_binary_int, SAME, PLAIN_LOAD, PLAIN_STORE)

#ifdef VEC
/* ---- CPU devices: VEC elements per work-item (see activation.cl) ---- */

__kernel void unary_vec(__global const float* x, const int x_off,
                        __global float* y, const int y_off, const int n,
                        const int op, const float p0, const float p1, const float p2)
{
    const int i = get_global_id(0) * VEC;
    if (i + VEC <= n) {
        VSTORE(apply_unary_v(op, VLOAD(0, x + x_off + i), p0, p1, p2), 0, y + y_off + i);
    } else {
        for (int e = i; e < n; ++e) y[y_off + e] = apply_unary(op, x[x_off + e], p0, p1, p2);
    }
}

/* Load VEC elements ``stride`` apart: a vector load, a broadcast, or a gather. */
inline VT load_strided(__global const float* p, const int stride)
{
    if (stride == 1) return VLOAD(0, p);
    if (stride == 0) return (VT)(p[0]);
    float tmp[VEC];
    for (int e = 0; e < VEC; ++e) tmp[e] = p[e * stride];
    return VLOAD(0, tmp);
}

/* Binary over (d0, d1, d2, d3) with the output contiguous; a work-item covers VEC elements of
 * the innermost dim. Global: (ceil(d3/VEC), d2, d0*d1). */
__kernel void binary_vec(__global const float* a, const int a_off,
                         __global const float* b, const int b_off,
                         __global float* out, const int o_off,
                         const int d1, const int d2, const int d3,
                         const int as0, const int as1, const int as2, const int as3,
                         const int bs0, const int bs1, const int bs2, const int bs3,
                         const int op, const int act, const float p0, const float p1, const float p2)
{
    const int i3 = get_global_id(0) * VEC, i2 = get_global_id(1), z = get_global_id(2);
    if (i3 >= d3) return;
    const int i1 = z % d1, i0 = z / d1;
    __global const float* pa = a + a_off + i0 * as0 + i1 * as1 + i2 * as2 + i3 * as3;
    __global const float* pb = b + b_off + i0 * bs0 + i1 * bs1 + i2 * bs2 + i3 * bs3;
    __global float* po = out + o_off + ((z * d2) + i2) * d3 + i3;
    if (i3 + VEC <= d3) {
        const VT r = apply_binary_v(op, load_strided(pa, as3), load_strided(pb, bs3));
        VSTORE(apply_unary_v(act, r, p0, p1, p2), 0, po);
    } else {
        for (int e = 0; e < d3 - i3; ++e)
            po[e] = apply_unary(act, apply_binary(op, pa[e * as3], pb[e * bs3]), p0, p1, p2);
    }
}
#endif
