// Raster: one strided region copy per dispatch (or the fill of the whole output with -DFILL).
// Elements of any storage dtype are copied as their bits (elements.glsl: -DIN_BYTES/-DOUT_BYTES
// for the narrow ones); the fill is the bits atomic.fill_bits gives.
// -DNDIM=1..4: dimensions left after the host collapsed contiguous ones (fewer divisions).
// -DDST_CONTIGUOUS: the region's destination is the run dst_off + i (a packed output is then
// written a word per invocation; see elements.glsl).
// params: 0 total | 1..3 size[1..3] | 4 src_off | 5..8 src_strides | 9 dst_off | 10..13 dst_strides
// FILL params: 0 total | 1 dst_off | 2 the fill bits
#include "common.glsl"
#include "elements.glsl"
layout(local_size_x = WG) in;
OUT_BUFFER(0, dst);
#ifndef FILL
IN_BUFFER(1, src);
#endif

#ifdef FILL
uint element(int i) { return uint(PI(2)); }
ELEMENTS_MAIN(dst, PI(0), PI(1))
#elif defined(DST_CONTIGUOUS)
uint element(int i) {
    INDEX4(i, i0, i1, i2, i3);
    return IN_LOAD(src, PI(4) + i0 * PI(5) + i1 * PI(6) + i2 * PI(7) + i3 * PI(8));
}
ELEMENTS_MAIN(dst, PI(0), PI(9))
#else
void main() {
    int i = GLOBAL_ID();
    if (i >= PI(0)) return;
    INDEX4(i, i0, i1, i2, i3);
    int s = PI(4) + i0 * PI(5) + i1 * PI(6) + i2 * PI(7) + i3 * PI(8);
    int d = PI(9) + i0 * PI(10) + i1 * PI(11) + i2 * PI(12) + i3 * PI(13);
    OUT_STORE(dst, d, IN_LOAD(src, s));
}
#endif
