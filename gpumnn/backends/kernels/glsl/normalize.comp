// Normalize: rows of x [outer, size]: (x - mean) / sqrt(var + eps), then * scale + bias (-DAFFINE).
// -DWG_PER_ROW: one workgroup per row, else one invocation per row. float16 tensors with -DHALF
// (common.glsl).
// params: 0 outer | 1 size | 2 x_off | 3 out_off | 4 eps (float) | 5 scale_off | 6 bias_off
#include "common.glsl"
layout(local_size_x = WG) in;
BUFFER_WO_F(0, dst);
BUFFER_RO_F(1, src);
BUFFER_RO_F(2, scale);
BUFFER_RO_F(3, shift);
#ifdef WG_PER_ROW
#include "reduce_wg.glsl"
#define START int(gl_LocalInvocationID.x)
#define STEP WG
#else
#define START 0
#define STEP 1
#endif

void main() {
    int size = PI(1);
#ifdef WG_PER_ROW
    int row = GROUP_ID();
#else
    int row = GLOBAL_ID();
#endif
    if (row >= PI(0)) return;
    int xb = PI(2) + row * size;
    int ob = PI(3) + row * size;
    float total = 0.0;
    for (int s = START; s < size; s += STEP) total += LOADF(src, xb + s);
#ifdef WG_PER_ROW
    total = wg_sum(total);
#endif
    float mean = total / float(size);
    float sq = 0.0;
    for (int s = START; s < size; s += STEP) { float d = LOADF(src, xb + s) - mean; sq += d * d; }
#ifdef WG_PER_ROW
    sq = wg_sum(sq);
#endif
    float denom = sqrt(sq / float(size) + PF(4));
    for (int s = START; s < size; s += STEP) {
        float v = (LOADF(src, xb + s) - mean) / denom;
#ifdef AFFINE
        v = v * LOADF(scale, PI(5) + s) + LOADF(shift, PI(6) + s);
#endif
        STOREF(dst, ob + s, v);
    }
}
