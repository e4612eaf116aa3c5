/* Winograd F(NH x NW, KH x KW) as three kernels around the tiled GEMM (gemm.cl), for GPUs: the
 * input transform writes the product's operand directly, one batched GEMM per position of the
 * alpha x alpha tile multiplies it by the transformed weights, and the output transform ends in
 * the bias and the activation. Needs activation.cl.
 *
 * Layouts (P = AH * AW positions, T = N * TH * TW tiles, t = (n * TH + ty) * TW + tx):
 *   U [P][OC][C]  transformed weights  U[a][b] = G_h W G_w^T      (winograd_weights, once)
 *   V [P][C][T]   transformed input    V[a][b] = B_h^T d B_w      (winograd_input)
 *   M [P][OC][T]  products             M[p] = U[p] V[p]           (gemm_dense, batch P)
 *   Y [N][OC][OH][OW]                  y = A_h^T m A_w + bias (+ residual, laid out as Y)  (winograd_output)
 * The matrices come in one buffer, each row-major as scheduler.winograd builds them:
 * B_h [AH][AH], B_w [AW][AW], A_h [AH][NH], A_w [AW][NW], G_h [AH][KH], G_w [AW][KW].
 * AH, AW, NH, NW are compile-time (unrolled loops, the tile in registers); an axis of a 1-wide
 * kernel has alpha = n = 1 (the identity). With -DHALF the weights, input, bias, residual and
 * output are float16 (index.cl); the transforms and products stay float32. */

#ifndef AH
#define AH 4
#endif
#ifndef AW
#define AW 4
#endif
#ifndef NH
#define NH 2
#endif
#ifndef NW
#define NW 2
#endif

#define B_H(i, a) mats[(i) * AH + (a)]
#define B_W(j, b) mats[AH * AH + (j) * AW + (b)]
#define A_H(a, r) mats[AH * AH + AW * AW + (a) * NH + (r)]
#define A_W(b, s) mats[AH * AH + AW * AW + AH * NH + (b) * NW + (s)]
#define G_OFF (AH * AH + AW * AW + AH * NH + AW * NW)

__kernel void winograd_weights(__global const DATA_T* w, const int w_off, __global const float* mats,
                               __global float* u, const int OC, const int C, const int KH, const int KW)
{
    const int gid = get_global_id(0);
    if (gid >= AH * AW * OC * C) return;
    const int c = gid % C, oc = (gid / C) % OC, p = gid / (C * OC);
    const int a = p / AW, b = p - a * AW;
    __global const float* g_h = mats + G_OFF;
    __global const float* g_w = g_h + AH * KH;
    __global const DATA_T* wk = w + w_off + (oc * C + c) * KH * KW;
    float acc = 0.0f;
    for (int i = 0; i < KH; ++i) {
        float row = 0.0f;
        for (int j = 0; j < KW; ++j) row = mad(LOADF(wk, i * KW + j), g_w[b * KW + j], row);
        acc = mad(g_h[a * KH + i], row, acc);
    }
    u[gid] = acc;
}

__kernel void winograd_input(__global const DATA_T* x, const int x_off, __global const float* mats,
                             __global float* v, const int C, const int H, const int W,
                             const int TH, const int TW, const int T, const int PH, const int PW)
{
    const int gid = get_global_id(0);
    if (gid >= C * T) return;
    const int c = gid / T, t = gid - c * T;
    const int tx = t % TW, ty = (t / TW) % TH, n = t / (TW * TH);
    __global const DATA_T* plane = x + x_off + (n * C + c) * H * W;
    const int y0 = ty * NH - PH, x0 = tx * NW - PW;
    float d[AH][AW];
    for (int i = 0; i < AH; ++i) {
        const int iy = y0 + i;
        for (int j = 0; j < AW; ++j) {
            const int ix = x0 + j;
            d[i][j] = (iy >= 0 && iy < H && ix >= 0 && ix < W) ? LOADF(plane, iy * W + ix) : 0.0f;
        }
    }
    float rows[AH][AW];  /* B_h^T d */
    for (int a = 0; a < AH; ++a)
        for (int j = 0; j < AW; ++j) {
            float s = 0.0f;
            for (int i = 0; i < AH; ++i) s = mad(B_H(i, a), d[i][j], s);
            rows[a][j] = s;
        }
    for (int a = 0; a < AH; ++a)
        for (int b = 0; b < AW; ++b) {
            float s = 0.0f;
            for (int j = 0; j < AW; ++j) s = mad(rows[a][j], B_W(j, b), s);
            v[((a * AW + b) * C + c) * T + t] = s;
        }
}

__kernel void winograd_output(__global const float* m, __global const float* mats,
                              __global const DATA_T* bias, const int bias_off, __global DATA_T* y, const int y_off,
                              const int OC, const int OH, const int OW, const int TH, const int TW, const int T,
                              const int has_bias, __global const DATA_T* res, const int res_off,
                              const int has_res, const int act, const float p0, const float p1, const float p2)
{
    const int gid = get_global_id(0);
    if (gid >= OC * T) return;
    const int oc = gid / T, t = gid - oc * T;
    const int tx = t % TW, ty = (t / TW) % TH, n = t / (TW * TH);
    float e[AH][AW];
    for (int a = 0; a < AH; ++a)
        for (int b = 0; b < AW; ++b) e[a][b] = m[((a * AW + b) * OC + oc) * T + t];
    float rows[NH][AW];  /* A_h^T m */
    for (int r = 0; r < NH; ++r)
        for (int b = 0; b < AW; ++b) {
            float s = 0.0f;
            for (int a = 0; a < AH; ++a) s = mad(A_H(a, r), e[a][b], s);
            rows[r][b] = s;
        }
    const float add = has_bias ? LOADF(bias, bias_off + oc) : 0.0f;
    __global DATA_T* out = y + y_off + (n * OC + oc) * OH * OW;
    __global const DATA_T* residual = res + res_off + (n * OC + oc) * OH * OW;
    for (int r = 0; r < NH; ++r) {
        const int oy = ty * NH + r;
        if (oy >= OH) break;
        for (int s = 0; s < NW; ++s) {
            const int ox = tx * NW + s;
            if (ox >= OW) break;
            float acc = add;
            for (int b = 0; b < AW; ++b) acc = mad(rows[r][b], A_W(b, s), acc);
            if (has_res) acc += LOADF(residual, oy * OW + ox);
            STOREF(apply_unary(act, acc, p0, p1, p2), out, oy * OW + ox);
        }
    }
}
