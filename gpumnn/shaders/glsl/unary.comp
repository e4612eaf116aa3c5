// Unary: out[i] = op(x[i]); -DOP=<unary id>.
// params: 0 count | 1 x_off | 2 out_off | 3..5 op params (float)
#include "common.glsl"
#include "activation.glsl"
layout(local_size_x = WG) in;
BUFFER_WO(0, dst);
BUFFER_RO(1, src);

void main() {
    int i = GLOBAL_ID();
    if (i >= PI(0)) return;
    dst[PI(2) + i] = apply_unary(OP, src[PI(1) + i], PF(3), PF(4), PF(5));
}
