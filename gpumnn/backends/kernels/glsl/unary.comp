// Unary: out[i] = op(x[i]); -DOP=<unary id>. -DIN_INT: x is int32 (the op computed on ints,
// atomic.INT_UNARY_OPS), else float32; -DOUT_INT: out is int32 (the result converted, a float
// truncated toward zero), else float32 (float16 with -DHALF, common.glsl). identity between dtypes
// is thus a Cast.
// params: 0 count | 1 x_off | 2 out_off | 3..5 op params (float; with IN_INT clip's int bounds)
#include "common.glsl"
#include "activation.glsl"
#include "int_math.glsl"
layout(local_size_x = WG) in;
#ifdef OUT_INT
BUFFER_WO_OF(int, 0, dst);
#define OUT_T int
#else
BUFFER_WO_F(0, dst);
#define OUT_T float
#endif
#ifdef IN_INT
BUFFER_RO_OF(int, 1, src);
#else
BUFFER_RO_F(1, src);
#endif

void main() {
    int i = GLOBAL_ID();
    if (i >= PI(0)) return;
#ifdef IN_INT
    int r = apply_unary_int(OP, src[PI(1) + i], PI(3), PI(4));
#else
    float r = apply_unary(OP, LOADF(src, PI(1) + i), PF(3), PF(4), PF(5));
#endif
#ifdef OUT_INT
    dst[PI(2) + i] = OUT_T(r);
#else
    STOREF(dst, PI(2) + i, float(r));
#endif
}
