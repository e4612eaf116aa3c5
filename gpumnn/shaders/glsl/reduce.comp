// Reduce: x viewed as [outer, size, inner] -> out [outer, inner]; -DOP=0 sum, 1 mean, 2 max, 3 min.
// -DWG_PER_ROW: one workgroup per output (long rows), else one invocation per output.
// params: 0 outer | 1 size | 2 inner | 3 x_off | 4 out_off
#include "common.glsl"
layout(local_size_x = WG) in;
BUFFER_WO(0, dst);
BUFFER_RO(1, src);
#ifdef WG_PER_ROW
#include "reduce_wg.glsl"
#endif

#if OP <= 1
#define INIT 0.0
#define COMBINE(a, b) ((a) + (b))
#define WG_REDUCE wg_sum
#elif OP == 2
#define INIT (-1.0 / 0.0)
#define COMBINE(a, b) max(a, b)
#define WG_REDUCE wg_max
#else
#define INIT (1.0 / 0.0)
#define COMBINE(a, b) min(a, b)
#define WG_REDUCE wg_min
#endif

void main() {
    int size = PI(1), inner = PI(2);
#ifdef WG_PER_ROW
    int row = GROUP_ID();
    if (row >= PI(0) * inner) return;  // uniform for the whole workgroup
    int o = row / inner, in_ = row % inner;
    int base = PI(3) + o * size * inner + in_;
    float acc = INIT;
    for (int s = int(gl_LocalInvocationID.x); s < size; s += WG)
        acc = COMBINE(acc, src[base + s * inner]);
    acc = WG_REDUCE(acc);
    if (gl_LocalInvocationID.x != 0u) return;
#else
    int row = GLOBAL_ID();
    if (row >= PI(0) * inner) return;
    int o = row / inner, in_ = row % inner;
    int base = PI(3) + o * size * inner + in_;
    float acc = INIT;
    for (int s = 0; s < size; ++s)
        acc = COMBINE(acc, src[base + s * inner]);
#endif
#if OP == 1
    acc /= float(size);
#endif
    dst[PI(4) + row] = acc;
}
