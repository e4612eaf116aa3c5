// Select (Where): out[i] = cond[i . c_strides] != 0 ? a[i . a_strides] : b[i . b_strides] over a
// RANK-4 shape; cond is int32, a, b and out elements of any storage dtype (elements.glsl).
// -DNDIM=1..4 as in raster.comp.
// params: 0 total | 1..3 shape[1..3] | 4 c_off | 5..8 c_strides | 9 a_off | 10..13 a_strides
//         14 b_off | 15..18 b_strides | 19 out_off
#include "common.glsl"
#include "elements.glsl"
layout(local_size_x = WG) in;
OUT_BUFFER(0, dst);
BUFFER_RO_OF(int, 1, C);
IN_BUFFER(2, A);
IN_BUFFER(3, B);

uint element(int i) {
    INDEX4(i, i0, i1, i2, i3);
    bool c = C[PI(4) + i0 * PI(5) + i1 * PI(6) + i2 * PI(7) + i3 * PI(8)] != 0;
    return c ? IN_LOAD(A, PI(9) + i0 * PI(10) + i1 * PI(11) + i2 * PI(12) + i3 * PI(13))
             : IN_LOAD(B, PI(14) + i0 * PI(15) + i1 * PI(16) + i2 * PI(17) + i3 * PI(18));
}

ELEMENTS_MAIN(dst, PI(0), PI(19))
