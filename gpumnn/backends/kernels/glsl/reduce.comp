// Reduce: x viewed as [outer, size, inner] -> out [outer, inner]; -DOP=<reduce id> (order of
// gpumnn.atomic.REDUCE_OPS). -DIN_INT: x is int32 (sums wrap, the mean truncates), else float32.
// argmax / argmin write the int32 index of the first extreme (a NaN counts as one, as NumPy).
// -DWG_PER_ROW: one workgroup per output (long rows), else one invocation per output.
// params: 0 outer | 1 size | 2 inner | 3 x_off | 4 out_off
#define R_SUM 0
#define R_MEAN 1
#define R_MAX 2
#define R_MIN 3
#define R_ARGMAX 4
#define R_ARGMIN 5
#define ARG (OP >= R_ARGMAX)

#ifdef IN_INT
#define T int
#define WG_T int
#else
#define T float
#endif
#include "common.glsl"
layout(local_size_x = WG) in;
#ifdef IN_INT
BUFFER_RO_OF(int, 1, src);
#define LOWEST INT_MIN
#define HIGHEST INT_MAX
#define IS_NAN(v) false
#else
BUFFER_RO(1, src);
#define LOWEST (-1.0 / 0.0)
#define HIGHEST (1.0 / 0.0)
#define IS_NAN(v) isnan(v)
#endif
#if defined(IN_INT) || ARG
BUFFER_WO_OF(int, 0, dst);
#else
BUFFER_WO(0, dst);
#endif

#if OP <= R_MEAN
#define INIT T(0)
#define COMBINE(a, b) ((a) + (b))
#define WG_REDUCE wg_sum
#elif OP == R_MAX || OP == R_ARGMAX
#define INIT LOWEST
#define COMBINE(a, b) max(a, b)
#define WG_REDUCE wg_max
#else
#define INIT HIGHEST
#define COMBINE(a, b) min(a, b)
#define WG_REDUCE wg_min
#endif

#if ARG
// Does (w at j) beat (v at i)? A more extreme value, a NaN over a number, or the same at a lower index.
bool beats(T w, int j, T v, int i) {
#if OP == R_ARGMAX
    bool more = w > v;
#else
    bool more = w < v;
#endif
    bool same = w == v || (IS_NAN(w) && IS_NAN(v));
    return more || (IS_NAN(w) && !IS_NAN(v)) || (same && j < i);
}
#endif

#ifdef WG_PER_ROW
#if ARG
shared T wg_value[WG];
shared int wg_index[WG];

// The winning index over the workgroup's (value, index) pairs (uniform control flow only).
int wg_arg(T v, int idx) {
    uint lid = gl_LocalInvocationID.x;
    wg_value[lid] = v;
    wg_index[lid] = idx;
    memoryBarrierShared(); barrier();
    for (uint s = uint(WG) / 2u; s > 0u; s >>= 1) {
        if (lid < s && beats(wg_value[lid + s], wg_index[lid + s], wg_value[lid], wg_index[lid])) {
            wg_value[lid] = wg_value[lid + s];
            wg_index[lid] = wg_index[lid + s];
        }
        memoryBarrierShared(); barrier();
    }
    return wg_index[0];
}
#else
#include "reduce_wg.glsl"
#endif
#define START int(gl_LocalInvocationID.x)
#define STEP WG
#else
#define START 0
#define STEP 1
#endif

void main() {
    int size = PI(1), inner = PI(2);
#ifdef WG_PER_ROW
    int row = GROUP_ID();
    if (row >= PI(0) * inner) return;  // uniform for the whole workgroup
#else
    int row = GLOBAL_ID();
    if (row >= PI(0) * inner) return;
#endif
    int o = row / inner, in_ = row % inner;
    int base = PI(3) + o * size * inner + in_;
    T acc = INIT;
#if ARG
    int at = INT_MAX;
    for (int s = START; s < size; s += STEP) {
        T v = src[base + s * inner];
        if (beats(v, s, acc, at)) { acc = v; at = s; }
    }
#ifdef WG_PER_ROW
    at = wg_arg(acc, at);
    if (gl_LocalInvocationID.x != 0u) return;
#endif
    dst[PI(4) + row] = at;
#else
    for (int s = START; s < size; s += STEP)
        acc = COMBINE(acc, src[base + s * inner]);
#ifdef WG_PER_ROW
    acc = WG_REDUCE(acc);
    if (gl_LocalInvocationID.x != 0u) return;
#endif
#if OP == R_MEAN
    acc /= T(max(size, 1));
#endif
    dst[PI(4) + row] = acc;
#endif
}
