// Raster: one strided region copy per dispatch (or the fill of the whole output with -DFILL).
// Elements are 32-bit words of any storage dtype; the fill is the word atomic.fill_bits gives.
// -DNDIM=1..4: dimensions left after the host collapsed contiguous ones (fewer divisions).
// params: 0 total | 1..3 size[1..3] | 4 src_off | 5..8 src_strides | 9 dst_off | 10..13 dst_strides
// FILL params: 0 total | 1 dst_off | 2 the fill word
#include "common.glsl"
layout(local_size_x = WG) in;
BUFFER_WO_OF(uint, 0, dst);
#ifndef FILL
BUFFER_RO_OF(uint, 1, src);
#endif

void main() {
    int i = GLOBAL_ID();
    if (i >= PI(0)) return;
#ifdef FILL
    dst[PI(1) + i] = uint(PI(2));
#else
    INDEX4(i, i0, i1, i2, i3);
    int s = PI(4) + i0 * PI(5) + i1 * PI(6) + i2 * PI(7) + i3 * PI(8);
    int d = PI(9) + i0 * PI(10) + i1 * PI(11) + i2 * PI(12) + i3 * PI(13);
    dst[d] = src[s];
#endif
}
