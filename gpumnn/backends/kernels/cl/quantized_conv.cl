/* QuantizedConv2D (gpumnn.atomic): 8-bit NCHW in and out, an int32 sum per output and the
 * requantizing epilogue clip(rint(float(acc) * multiplier[oc]) + y_zero, lo, hi) in float32,
 * rint rounding half to even. One work item per output element, plain integer arithmetic.
 * Bytes move as uchar (CUDA's char signedness varies by host); -DX_SIGNED reads x as int8, the
 * weights are always int8; the output keeps the low byte of its int (the range clip makes it
 * the value). Padding adds nothing, as if it held x's zero point. */

#ifdef X_SIGNED
#define LOAD_X(p, i) (((int)(p)[i] ^ 0x80) - 0x80)
#else
#define LOAD_X(p, i) ((int)(p)[i])
#endif
#define LOAD_W(p, i) (((int)(p)[i] ^ 0x80) - 0x80)

/* Both kernels' arguments: the op's tensors (element offsets), its geometry and quantization. */
#define QCONV_ARGS \
    __global const uchar* x, const int x_off, __global const uchar* w, const int w_off, \
    __global const int* bias, const int b_off, __global const float* mult, const int m_off, \
    __global uchar* y, const int y_off, const int total, const int C, const int H, const int W, \
    const int OC, const int OH, const int OW, const int KH, const int KW, const int SH, const int SW, \
    const int PH, const int PW, const int DH, const int DW, const int G, const int x_zero, \
    const int y_zero, const int lo, const int hi

__kernel void quantized_conv2d(QCONV_ARGS)
{
    const int gid = get_global_id(0);
    if (gid >= total) return;
    const int ox = gid % OW, oy = (gid / OW) % OH, oc = (gid / (OW * OH)) % OC, n = gid / (OW * OH * OC);
    const int cg = C / G, g = oc / (OC / G);
    int acc = bias[b_off + oc];
    __global const uchar* plane = x + x_off + (n * C + g * cg) * H * W;
    __global const uchar* wk = w + w_off + oc * cg * KH * KW;
    for (int c = 0; c < cg; ++c) {
        for (int ky = 0; ky < KH; ++ky) {
            const int iy = oy * SH - PH + ky * DH;
            if (iy < 0 || iy >= H) continue;
            for (int kx = 0; kx < KW; ++kx) {
                const int ix = ox * SW - PW + kx * DW;
                if (ix < 0 || ix >= W) continue;
                acc += (LOAD_X(plane, (c * H + iy) * W + ix) - x_zero) * LOAD_W(wk, (c * KH + ky) * KW + kx);
            }
        }
    }
    const float scaled = clamp(rint((float)acc * mult[m_off + oc]) + (float)y_zero, (float)lo, (float)hi);
    y[y_off + gid] = (uchar)((int)scaled & 0xff);
}

/* The GPU family's kernel (every scheme but depthwise): per (image, group), global dim 2, the
 * implicit GEMM acc[oc][p] = sum_k W[oc][k] * (x(k, p) - x_zero) with k = (c, ky, kx) and
 * p = (oy, ox), on int32 tiles in local memory: a work-group of LX x LY work-items computes TM
 * output channels x TN pixels, each work-item a WM x WN block, TK-deep slices staged. */
#ifndef TM
#define TM 64
#endif
#ifndef TN
#define TN 64
#endif
#ifndef WM
#define WM 4
#endif
#ifndef WN
#define WN 4
#endif
#ifndef TK
#define TK 16
#endif
#define LX (TN / WN)
#define LY (TM / WM)
#define NT (LX * LY)

__kernel __attribute__((reqd_work_group_size(LX, LY, 1)))
void quantized_conv2d_tiled(QCONV_ARGS)
{
    __local int As[TK][TM + 1];
    __local int Bs[TK][TN];
    const int tx = get_local_id(0), ty = get_local_id(1), tid = ty * LX + tx;
    const int n0 = get_group_id(0) * TN, m0 = get_group_id(1) * TM;
    const int z = get_group_id(2), img = z / G, g = z - img * G;
    const int cg = C / G, ocg = OC / G, khw = KH * KW, K = cg * khw, P = OH * OW;
    __global const uchar* xb = x + x_off + (img * C + g * cg) * H * W;
    __global const uchar* wb = w + w_off + g * ocg * K;
    int acc[WM][WN];
    for (int i = 0; i < WM; ++i)
        for (int j = 0; j < WN; ++j) acc[i][j] = 0;
    for (int k0 = 0; k0 < K; k0 += TK) {
        for (int e = tid; e < TM * TK; e += NT) {
            const int mm = e / TK, kk = e - mm * TK;
            const int m = m0 + mm, k = k0 + kk;
            As[kk][mm] = (m < ocg && k < K) ? LOAD_W(wb, m * K + k) : 0;
        }
        for (int e = tid; e < TN * TK; e += NT) {
            const int kk = e / TN, nn = e - kk * TN;
            const int n = n0 + nn, k = k0 + kk;
            int v = 0;
            if (n < P && k < K) {
                const int c = k / khw, r = k - c * khw;
                const int i = r / KW, j = r - i * KW;
                const int oy = n / OW, ox = n - oy * OW;
                const int iy = oy * SH - PH + i * DH, ix = ox * SW - PW + j * DW;
                if (iy >= 0 && iy < H && ix >= 0 && ix < W) v = LOAD_X(xb, (c * H + iy) * W + ix) - x_zero;
            }
            Bs[kk][nn] = v;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int kk = 0; kk < TK; ++kk) {
            int a[WM], b[WN];
            for (int i = 0; i < WM; ++i) a[i] = As[kk][ty + i * LY];
            for (int j = 0; j < WN; ++j) b[j] = Bs[kk][tx + j * LX];
            for (int i = 0; i < WM; ++i)
                for (int j = 0; j < WN; ++j) acc[i][j] += a[i] * b[j];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    for (int i = 0; i < WM; ++i) {
        const int m = m0 + ty + i * LY;
        if (m >= ocg) continue;
        const int oc = g * ocg + m;
        const int add = bias[b_off + oc];
        const float scale = mult[m_off + oc];
        __global uchar* row = y + y_off + (img * OC + oc) * P;
        for (int j = 0; j < WN; ++j) {
            const int n = n0 + tx + j * LX;
            if (n >= P) continue;
            const float scaled = clamp(rint((float)(acc[i][j] + add) * scale) + (float)y_zero, (float)lo, (float)hi);
            row[n] = (uchar)((int)scaled & 0xff);
        }
    }
}
