// Pool2D over NCHW planes; -DMAX or average (-DCOUNT_PAD: divisor counts the padded window);
// float16 tensors with -DHALF (common.glsl).
// params: 0 total | 1 H | 2 W | 3 OH | 4 OW | 5 KH | 6 KW | 7 SH | 8 SW | 9 PT | 10 PL | 11 PB
//   12 PR | 13 x_off | 14 out_off
#include "common.glsl"
layout(local_size_x = WG) in;
BUFFER_WO_F(0, dst);
BUFFER_RO_F(1, src);

void main() {
    int i = GLOBAL_ID();
    if (i >= PI(0)) return;
    int H = PI(1), W = PI(2), OH = PI(3), OW = PI(4);
    int ox = i % OW;
    int t = i / OW;
    int oy = t % OH;
    int plane = t / OH;
    int hs = oy * PI(7) - PI(9), ws = ox * PI(8) - PI(10);
    int h0 = max(hs, 0), h1 = min(hs + PI(5), H);
    int w0 = max(ws, 0), w1 = min(ws + PI(6), W);
    int xb = PI(13) + plane * H * W;
#ifdef MAX
    float acc = -1.0 / 0.0;
    for (int y = h0; y < h1; ++y)
        for (int x = w0; x < w1; ++x) acc = max(acc, LOADF(src, xb + y * W + x));
#else
    float acc = 0.0;
    for (int y = h0; y < h1; ++y)
        for (int x = w0; x < w1; ++x) acc += LOADF(src, xb + y * W + x);
#ifdef COUNT_PAD
    int ch = min(hs + PI(5), H + PI(11)) - max(hs, -PI(9));
    int cw = min(ws + PI(6), W + PI(12)) - max(ws, -PI(10));
#else
    int ch = h1 - h0, cw = w1 - w0;
#endif
    acc *= 1.0 / float(max(ch * cw, 1));
#endif
    STOREF(dst, PI(14) + i, acc);
}
