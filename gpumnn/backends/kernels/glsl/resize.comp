// Resize of [planes, H, W] to [planes, OH, OW] by index/weight tables computed on the host
// (exactly as the reference does, in double precision): table = h0[OH] h1[OH] fh[OH] w0[OW] w1[OW] fw[OW].
// -DNEAREST uses h0/w0 only; otherwise bilinear.
// params: 0 total | 1 H | 2 W | 3 OH | 4 OW | 5 x_off | 6 out_off | 7 table_off
#include "common.glsl"
layout(local_size_x = WG) in;
BUFFER_WO(0, dst);
BUFFER_RO(1, src);
BUFFER_RO(2, table);

void main() {
    int i = GLOBAL_ID();
    if (i >= PI(0)) return;
    int H = PI(1), W = PI(2), OH = PI(3), OW = PI(4), tb = PI(7);
    int ox = i % OW;
    int t = i / OW;
    int oy = t % OH;
    int plane = t / OH;
    int xb = PI(5) + plane * H * W;
    int y0 = int(table[tb + oy]);
    int x0 = int(table[tb + 3 * OH + ox]);
#ifdef NEAREST
    dst[PI(6) + i] = src[xb + y0 * W + x0];
#else
    int y1 = int(table[tb + OH + oy]);
    float fy = table[tb + 2 * OH + oy];
    int x1 = int(table[tb + 3 * OH + OW + ox]);
    float fx = table[tb + 3 * OH + 2 * OW + ox];
    float top = src[xb + y0 * W + x0] * (1.0 - fx) + src[xb + y0 * W + x1] * fx;
    float bottom = src[xb + y1 * W + x0] * (1.0 - fx) + src[xb + y1 * W + x1] * fx;
    dst[PI(6) + i] = top * (1.0 - fy) + bottom * fy;
#endif
}
