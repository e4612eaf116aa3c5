// Softmax / LogSoftmax (-DLOG) of x viewed as [outer, size, inner] along the middle axis.
// -DWG_PER_ROW: one workgroup per row (long rows), else one invocation per row. float16 tensors
// with -DHALF (common.glsl).
// params: 0 outer | 1 size | 2 inner | 3 x_off | 4 out_off
#include "common.glsl"
layout(local_size_x = WG) in;
BUFFER_WO_F(0, dst);
BUFFER_RO_F(1, src);
#ifdef WG_PER_ROW
#include "reduce_wg.glsl"
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
#else
    int row = GLOBAL_ID();
#endif
    if (row >= PI(0) * inner) return;
    int o = row / inner, in_ = row % inner;
    int xb = PI(3) + o * size * inner + in_;
    int ob = PI(4) + o * size * inner + in_;
    float peak = -1.0 / 0.0;
    for (int s = START; s < size; s += STEP) peak = max(peak, LOADF(src, xb + s * inner));
#ifdef WG_PER_ROW
    peak = wg_max(peak);
#endif
    float total = 0.0;
    for (int s = START; s < size; s += STEP) total += exp(LOADF(src, xb + s * inner) - peak);
#ifdef WG_PER_ROW
    total = wg_sum(total);
#endif
#ifdef LOG
    float shift = peak + log(total);
    for (int s = START; s < size; s += STEP) STOREF(dst, ob + s * inner, LOADF(src, xb + s * inner) - shift);
#else
    float inv = 1.0 / total;
    for (int s = START; s < size; s += STEP) STOREF(dst, ob + s * inner, exp(LOADF(src, xb + s * inner) - peak) * inv);
#endif
}
