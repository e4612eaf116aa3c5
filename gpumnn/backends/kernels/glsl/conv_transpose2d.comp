// ConvTranspose2D (NCHW, weight [C, OC/G, KH, KW]) as a gather: one invocation per output.
// out[n,oc,oy,ox] = bias + sum x[n,c,iy,ix] * w[c,oc',ky,kx] with oy = iy*SH - PT + ky*DH.
// params: 0 total | 1 C | 2 H | 3 W | 4 OC | 5 OH | 6 OW | 7 C/G | 8 OC/G | 9 KH | 10 KW
//   11 SH | 12 SW | 13 PT | 14 PL | 15 DH | 16 DW | 17 x_off | 18 w_off | 19 b_off | 20 out_off
//   22..24 activation params
#include "common.glsl"
#define ACT_P 22
#include "activation.glsl"
layout(local_size_x = WG) in;
BUFFER_WO(0, dst);
BUFFER_RO(1, X);
BUFFER_RO(2, Wt);
BUFFER_RO(3, bias);

void main() {
    int i = GLOBAL_ID();
    if (i >= PI(0)) return;
    int H = PI(2), W = PI(3), OH = PI(5), OW = PI(6), CG = PI(7), OCG = PI(8), KH = PI(9), KW = PI(10);
    int SH = PI(11), SW = PI(12), DH = PI(15), DW = PI(16);
    int ox = i % OW;
    int t = i / OW;
    int oy = t % OH;
    t /= OH;
    int oc = t % PI(4);
    int n = t / PI(4);
    int g = oc / OCG, ocl = oc % OCG;
    float acc = 0.0;
    for (int ky = 0; ky < KH; ++ky) {
        int ty = oy + PI(13) - ky * DH;
        if (ty < 0 || ty % SH != 0) continue;
        int iy = ty / SH;
        if (iy >= H) continue;
        for (int kx = 0; kx < KW; ++kx) {
            int tx = ox + PI(14) - kx * DW;
            if (tx < 0 || tx % SW != 0) continue;
            int ix = tx / SW;
            if (ix >= W) continue;
            int xi = PI(17) + ((n * PI(1) + g * CG) * H + iy) * W + ix;
            int wi = PI(18) + ((g * CG) * OCG + ocl) * KH * KW + ky * KW + kx;
            for (int c = 0; c < CG; ++c)
                acc += X[xi + c * H * W] * Wt[wi + c * OCG * KH * KW];
        }
    }
#ifdef HAS_BIAS
    acc += bias[PI(19) + oc];
#endif
    dst[PI(20) + i] = EPILOGUE(acc);
}
