// Max pooling of 8-bit elements (Pool2D max on uint8, or int8 with -DX_SIGNED; elements.glsl:
// IN_BYTES = OUT_BYTES = 1): the largest element of the window clipped to the input, copied (every
// window holds one: lowering refuses padding as wide as the kernel). One invocation per output
// element (per word of a packed output).
// params: 0 total | 1 H | 2 W | 3 OH | 4 OW | 5 KH | 6 KW | 7 SH | 8 SW | 9 PT | 10 PL | 11 x_off
//   12 out_off
#include "common.glsl"
#include "elements.glsl"
layout(local_size_x = WG) in;
OUT_BUFFER(0, dst);
IN_BUFFER(1, src);

#ifdef X_SIGNED
#define LOAD_Q(i) bitfieldExtract(int(IN_LOAD(src, i)), 0, 8)
#else
#define LOAD_Q(i) int(IN_LOAD(src, i))
#endif

uint element(int i) {
    int H = PI(1), W = PI(2), OH = PI(3), OW = PI(4);
    int ox = i % OW;
    int t = i / OW;
    int oy = t % OH;
    int plane = t / OH;
    int hs = oy * PI(7) - PI(9), ws = ox * PI(8) - PI(10);
    int h0 = max(hs, 0), h1 = min(hs + PI(5), H);
    int w0 = max(ws, 0), w1 = min(ws + PI(6), W);
    int xb = PI(11) + plane * H * W;
    int acc = -256;
    for (int y = h0; y < h1; ++y)
        for (int x = w0; x < w1; ++x) acc = max(acc, LOAD_Q(xb + y * W + x));
    return uint(acc) & 0xffu;
}

ELEMENTS_MAIN(dst, PI(0), PI(12))
