/* Reduce, Softmax and Normalize: input viewed as [outer, size, inner].
 * *_cols kernels: one work-item per (outer, inner) walks the size axis (coalesced over inner).
 * *_rows kernels (inner == 1): one work-group of RWG work-items per row, tree reduction in
 * local memory -- for long rows and few of them. */

#define RWG 64
#define ROP_SUM 0
#define ROP_MEAN 1
#define ROP_MAX 2
#define ROP_MIN 3

inline float reduce_init(const int op)
{
    return op == ROP_MAX ? -INFINITY : (op == ROP_MIN ? INFINITY : 0.0f);
}

inline float reduce_step(const int op, const float acc, const float v)
{
    switch (op) {
    case ROP_MAX: return (v > acc || isnan(v)) ? v : acc;
    case ROP_MIN: return (v < acc || isnan(v)) ? v : acc;
    default:      return acc + v;
    }
}

/* Tree reduction of scratch[0..RWG) into scratch[0]; every work-item returns the result. */
inline float group_reduce(__local float* scratch, const int lid, const float value, const int op)
{
    scratch[lid] = value;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = RWG / 2; s > 0; s >>= 1) {
        if (lid < s) scratch[lid] = reduce_step(op, scratch[lid], scratch[lid + s]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    const float r = scratch[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return r;
}

__kernel void reduce_cols(__global const float* x, const int x_off, __global float* y, const int y_off,
                          const int outer, const int size, const int inner, const int op)
{
    const int gid = get_global_id(0);
    if (gid >= outer * inner) return;
    const int o = gid / inner, i = gid - o * inner;
    __global const float* p = x + x_off + o * size * inner + i;
    float acc = reduce_init(op);
    for (int s = 0; s < size; ++s) acc = reduce_step(op, acc, p[s * inner]);
    if (op == ROP_MEAN) acc /= (float)size;
    y[y_off + gid] = acc;
}

__kernel void reduce_rows(__global const float* x, const int x_off, __global float* y, const int y_off,
                          const int size, const int op)
{
    __local float scratch[RWG];
    const int row = get_group_id(0), lid = get_local_id(0);
    __global const float* p = x + x_off + row * size;
    float acc = reduce_init(op);
    for (int s = lid; s < size; s += RWG) acc = reduce_step(op, acc, p[s]);
    acc = group_reduce(scratch, lid, acc, op == ROP_MEAN ? ROP_SUM : op);
    if (lid == 0) y[y_off + row] = op == ROP_MEAN ? acc / (float)size : acc;
}

__kernel void softmax_cols(__global const float* x, const int x_off, __global float* y, const int y_off,
                           const int outer, const int size, const int inner, const int log_mode)
{
    const int gid = get_global_id(0);
    if (gid >= outer * inner) return;
    const int o = gid / inner, i = gid - o * inner;
    const int base = o * size * inner + i;
    __global const float* p = x + x_off + base;
    __global float* q = y + y_off + base;
    float peak = -INFINITY;
    for (int s = 0; s < size; ++s) peak = fmax(peak, p[s * inner]);
    float total = 0.0f;
    if (log_mode) {
        for (int s = 0; s < size; ++s) total += exp(p[s * inner] - peak);
        const float lt = log(total);
        for (int s = 0; s < size; ++s) q[s * inner] = p[s * inner] - peak - lt;
    } else {
        for (int s = 0; s < size; ++s) { const float e = exp(p[s * inner] - peak); q[s * inner] = e; total += e; }
        const float inv = 1.0f / total;
        for (int s = 0; s < size; ++s) q[s * inner] *= inv;
    }
}

__kernel void softmax_rows(__global const float* x, const int x_off, __global float* y, const int y_off,
                           const int size, const int log_mode)
{
    __local float scratch[RWG];
    const int row = get_group_id(0), lid = get_local_id(0);
    __global const float* p = x + x_off + row * size;
    __global float* q = y + y_off + row * size;
    float peak = -INFINITY;
    for (int s = lid; s < size; s += RWG) peak = fmax(peak, p[s]);
    peak = group_reduce(scratch, lid, peak, ROP_MAX);
    float total = 0.0f;
    for (int s = lid; s < size; s += RWG) total += exp(p[s] - peak);
    total = group_reduce(scratch, lid, total, ROP_SUM);
    if (log_mode) {
        const float lt = log(total);
        for (int s = lid; s < size; s += RWG) q[s] = p[s] - peak - lt;
    } else {
        const float inv = 1.0f / total;
        for (int s = lid; s < size; s += RWG) q[s] = exp(p[s] - peak) * inv;
    }
}

/* Normalize: (x - mean) / sqrt(var + eps) [* scale + shift] per row of length size. */
#define NORM_IO_ARGS \
    __global const float* x, const int x_off, __global float* y, const int y_off, \
    __global const float* scale, const int scale_off, __global const float* shift, const int shift_off

/* The output of one row: q[s] = (p[s] - mean) * inv [* scale[s] + shift[s]] for s = s0,
 * s0 + step, .. < size. */
inline void normalize_span(__global const float* p, __global float* q, const int s0, const int step,
                           const int size, const float mean, const float inv, const int has_affine,
                           __global const float* scale, __global const float* shift)
{
    for (int s = s0; s < size; s += step) {
        float v = (p[s] - mean) * inv;
        if (has_affine) v = v * scale[s] + shift[s];
        q[s] = v;
    }
}

__kernel void normalize_rows(NORM_IO_ARGS, const int size, const float eps, const int has_affine)
{
    __local float scratch[RWG];
    const int row = get_group_id(0), lid = get_local_id(0);
    __global const float* p = x + x_off + row * size;
    __global float* q = y + y_off + row * size;
    float sum = 0.0f;
    for (int s = lid; s < size; s += RWG) sum += p[s];
    const float mean = group_reduce(scratch, lid, sum, ROP_SUM) / (float)size;
    float sq = 0.0f;
    for (int s = lid; s < size; s += RWG) { const float d = p[s] - mean; sq += d * d; }
    const float var = group_reduce(scratch, lid, sq, ROP_SUM) / (float)size;
    const float inv = 1.0f / sqrt(var + eps);
    normalize_span(p, q, lid, RWG, size, mean, inv, has_affine, scale + scale_off, shift + shift_off);
}

/* Short rows: one work-item per row. */
__kernel void normalize_item(NORM_IO_ARGS, const int outer, const int size, const float eps, const int has_affine)
{
    const int row = get_global_id(0);
    if (row >= outer) return;
    __global const float* p = x + x_off + row * size;
    __global float* q = y + y_off + row * size;
    float sum = 0.0f;
    for (int s = 0; s < size; ++s) sum += p[s];
    const float mean = sum / (float)size;
    float sq = 0.0f;
    for (int s = 0; s < size; ++s) { const float d = p[s] - mean; sq += d * d; }
    const float inv = 1.0f / sqrt(sq / (float)size + eps);
    normalize_span(p, q, 0, 1, size, mean, inv, has_affine, scale + scale_off, shift + shift_off);
}

#ifdef VEC
/* ---- CPU devices: one work-item per row (or per VEC columns), VEC-wide vector loops, no
 * barriers (a work-group barrier is emulated, slowly, on a CPU). ---- */

inline float hreduce(const int op, const VT v)
{
    float tmp[VEC];
    VSTORE(v, 0, tmp);
    float acc = tmp[0];
    for (int e = 1; e < VEC; ++e) acc = reduce_step(op, acc, tmp[e]);
    return acc;
}

inline VT reduce_step_v(const int op, const VT acc, const VT v)
{
    switch (op) {
    case ROP_MAX: return (v > acc || isnan(v)) ? v : acc;
    case ROP_MIN: return (v < acc || isnan(v)) ? v : acc;
    default:      return acc + v;
    }
}

/* Reduce a row of ``size`` contiguous elements. */
inline float row_reduce(const int op, __global const float* p, const int size)
{
    VT acc = (VT)(reduce_init(op));
    const int sv = size / VEC * VEC;
    for (int s = 0; s < sv; s += VEC) acc = reduce_step_v(op, acc, VLOAD(0, p + s));
    float r = hreduce(op, acc);
    for (int s = sv; s < size; ++s) r = reduce_step(op, r, p[s]);
    return r;
}

__kernel void reduce_rows_vec(__global const float* x, const int x_off, __global float* y, const int y_off,
                              const int outer, const int size, const int op)
{
    const int row = get_global_id(0);
    if (row >= outer) return;
    const float r = row_reduce(op == ROP_MEAN ? ROP_SUM : op, x + x_off + row * size, size);
    y[y_off + row] = op == ROP_MEAN ? r / (float)size : r;
}

/* inner >= VEC: a work-item reduces VEC adjacent columns. Global: (ceil(inner/VEC), outer). */
__kernel void reduce_cols_vec(__global const float* x, const int x_off, __global float* y, const int y_off,
                              const int size, const int inner, const int op)
{
    const int i = get_global_id(0) * VEC, o = get_global_id(1);
    if (i >= inner) return;
    __global const float* p = x + x_off + o * size * inner + i;
    __global float* q = y + y_off + o * inner + i;
    if (i + VEC <= inner) {
        VT acc = (VT)(reduce_init(op));
        for (int s = 0; s < size; ++s) acc = reduce_step_v(op, acc, VLOAD(0, p + s * inner));
        if (op == ROP_MEAN) acc /= (VT)((float)size);
        VSTORE(acc, 0, q);
    } else {
        for (int e = 0; e < inner - i; ++e) {
            float acc = reduce_init(op);
            for (int s = 0; s < size; ++s) acc = reduce_step(op, acc, p[s * inner + e]);
            q[e] = op == ROP_MEAN ? acc / (float)size : acc;
        }
    }
}

__kernel void softmax_rows_vec(__global const float* x, const int x_off, __global float* y, const int y_off,
                               const int outer, const int size, const int log_mode)
{
    const int row = get_global_id(0);
    if (row >= outer) return;
    __global const float* p = x + x_off + row * size;
    __global float* q = y + y_off + row * size;
    const int sv = size / VEC * VEC;
    const float peak = row_reduce(ROP_MAX, p, size);
    VT tv = (VT)(0.0f);
    for (int s = 0; s < sv; s += VEC) tv += exp(VLOAD(0, p + s) - peak);
    float total = hreduce(ROP_SUM, tv);
    for (int s = sv; s < size; ++s) total += exp(p[s] - peak);
    if (log_mode) {
        const float sub = peak + log(total);
        for (int s = 0; s < sv; s += VEC) VSTORE(VLOAD(0, p + s) - sub, 0, q + s);
        for (int s = sv; s < size; ++s) q[s] = p[s] - sub;
    } else {
        const float inv = 1.0f / total;
        for (int s = 0; s < sv; s += VEC) VSTORE(exp(VLOAD(0, p + s) - peak) * inv, 0, q + s);
        for (int s = sv; s < size; ++s) q[s] = exp(p[s] - peak) * inv;
    }
}

/* inner >= VEC: softmax of VEC adjacent columns at once. Global: (ceil(inner/VEC), outer). */
__kernel void softmax_cols_vec(__global const float* x, const int x_off, __global float* y, const int y_off,
                               const int size, const int inner, const int log_mode)
{
    const int i = get_global_id(0) * VEC, o = get_global_id(1);
    if (i >= inner) return;
    if (i + VEC > inner) {   /* ragged edge: scalar columns */
        for (int e = i; e < inner; ++e) {
            __global const float* p = x + x_off + o * size * inner + e;
            __global float* q = y + y_off + o * size * inner + e;
            float peak = -INFINITY, total = 0.0f;
            for (int s = 0; s < size; ++s) peak = fmax(peak, p[s * inner]);
            for (int s = 0; s < size; ++s) total += exp(p[s * inner] - peak);
            const float lt = log(total), inv = 1.0f / total;
            for (int s = 0; s < size; ++s)
                q[s * inner] = log_mode ? p[s * inner] - peak - lt : exp(p[s * inner] - peak) * inv;
        }
        return;
    }
    __global const float* p = x + x_off + o * size * inner + i;
    __global float* q = y + y_off + o * size * inner + i;
    VT peak = (VT)(-INFINITY), total = (VT)(0.0f);
    for (int s = 0; s < size; ++s) peak = fmax(peak, VLOAD(0, p + s * inner));
    for (int s = 0; s < size; ++s) total += exp(VLOAD(0, p + s * inner) - peak);
    if (log_mode) {
        const VT sub = peak + log(total);
        for (int s = 0; s < size; ++s) VSTORE(VLOAD(0, p + s * inner) - sub, 0, q + s * inner);
    } else {
        const VT inv = (VT)(1.0f) / total;
        for (int s = 0; s < size; ++s) VSTORE(exp(VLOAD(0, p + s * inner) - peak) * inv, 0, q + s * inner);
    }
}

__kernel void normalize_rows_vec(NORM_IO_ARGS, const int outer, const int size, const float eps,
                                 const int has_affine)
{
    const int row = get_global_id(0);
    if (row >= outer) return;
    __global const float* p = x + x_off + row * size;
    __global float* q = y + y_off + row * size;
    const int sv = size / VEC * VEC;
    const float mean = row_reduce(ROP_SUM, p, size) / (float)size;
    VT sq = (VT)(0.0f);
    for (int s = 0; s < sv; s += VEC) { const VT d = VLOAD(0, p + s) - mean; sq = mad(d, d, sq); }
    float var = hreduce(ROP_SUM, sq);
    for (int s = sv; s < size; ++s) { const float d = p[s] - mean; var += d * d; }
    const float inv = 1.0f / sqrt(var / (float)size + eps);
    for (int s = 0; s < sv; s += VEC) {
        VT v = (VLOAD(0, p + s) - mean) * inv;
        if (has_affine) v = mad(v, VLOAD(0, scale + scale_off + s), VLOAD(0, shift + shift_off + s));
        VSTORE(v, 0, q + s);
    }
    normalize_span(p, q, sv, 1, size, mean, inv, has_affine, scale + scale_off, shift + shift_off);
}
#endif
