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

/* The contract's requantization of an int32 sum, as the output's byte. */
inline uchar requantized(const int acc, const float multiplier, const int y_zero, const int lo, const int hi)
{
    return (uchar)((int)clamp(rint((float)acc * multiplier) + (float)y_zero, (float)lo, (float)hi) & 0xff);
}

/* The tiled kernels' store: the work-item's block of acc, each output channel oc's sum plus
 * ADD(oc), requantized into its row of y (an image's channels of P pixels, those of group g). */
#define STORE_TILE(ADD)                                                              \
    for (int i = 0; i < WM; ++i) {                                                   \
        const int m = m0 + ty + i * LY;                                              \
        if (m >= ocg) continue;                                                      \
        const int oc = g * ocg + m;                                                  \
        const int add = ADD(oc);                                                     \
        const float scale = mult[m_off + oc];                                        \
        __global uchar* row = y + y_off + (img * OC + oc) * P;                       \
        for (int j = 0; j < WN; ++j) {                                               \
            const int n = n0 + tx + j * LX;                                          \
            if (n < P) row[n] = requantized(acc[i][j] + add, scale, y_zero, lo, hi); \
        }                                                                            \
    }

/* The kernels' arguments: the op's tensors (element offsets), its geometry and quantization. */
#define QCONV_ARGS \
    __global const uchar* x, const int x_off, __global const uchar* w, const int w_off, \
    __global const int* bias, const int b_off, QCONV_REST
#define QCONV_REST \
    __global const float* mult, const int m_off, \
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
    y[y_off + gid] = requantized(acc, mult[m_off + oc], y_zero, lo, hi);
}

/* The GPU family's kernel (every scheme but depthwise): per (image, group), global dim 2, the
 * implicit GEMM acc[oc][p] = sum_k W[oc][k] * (x(k, p) - x_zero) with k = (c, ky, kx) and
 * p = (oy, ox), on int32 tiles in local memory: a work-group of LX x LY work-items computes TM
 * output channels x TN pixels, each work-item a WM x WN block, TK-deep slices staged. */

__kernel __attribute__((reqd_work_group_size(LX, LY, 1)))
void quantized_conv2d_tiled(QCONV_ARGS)
{
    __local int As[TK][TM + 1];
    __local int Bs[TK][TN];
    TILE_START(int)
    const int z = get_group_id(2), img = z / G, g = z - img * G;
    const int cg = C / G, ocg = OC / G, khw = KH * KW, K = cg * khw, P = OH * OW;
    __global const uchar* xb = x + x_off + (img * C + g * cg) * H * W;
    __global const uchar* wb = w + w_off + g * ocg * K;
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
        TILE_PRODUCTS(int, TK, INT_MAC)
        barrier(CLK_LOCAL_MEM_FENCE);
    }
#define BIAS_OF(oc) bias[b_off + (oc)]
    STORE_TILE(BIAS_OF)
}

#ifdef INT8_DOT
/* -DINT8_DOT: the GPU family's implicit GEMM on integer dot products, four multiply-adds per
 * instruction: cl_khr_integer_dot_product's dot_4x8packed_ss_int, which CUDA's prelude maps to
 * __dp4a. Both operands are words of four signed bytes, k + t at bits 8t: the weights packed once
 * by quantized_pack_weights, x's bytes as int8 lanes (uint8 ones moved down by 128, x ^ 0x80),
 * padding as x_zero's lane; the packed bias holds (X_SHIFT - x_zero) * sum_k W[oc][k], so
 * acc + bias = bias + sum_k W[oc][k] * (x - x_zero) exactly, in wrapping int32. */
#if !defined(__opencl_c_integer_dot_product_input_4x8bit_packed)
#error -DINT8_DOT needs cl_khr_integer_dot_product with 4x8-bit packed inputs
#endif
#ifdef X_SIGNED
#define X_LANE_FLIP 0u
#define X_SHIFT 0
#else
#define X_LANE_FLIP 0x80u
#define X_SHIFT 128
#endif
/* acc += the dot product of words a and b (CUDA's prelude: one __dp4a with acc as its addend) */
#ifndef DOT4_ADD
#define DOT4_ADD(acc, a, b) ((acc) += dot_4x8packed_ss_int(a, b))
#endif
#define TQ (TK / 4)
#if TK % 4 != 0
#error TK must be a multiple of 4
#endif

/* One work item per output channel: packed[oc] = the bias with the shift folded in, then from
 * packed[OC] the weights as [OC][ceil(K / 4)] words, zero-padded past K. */
__kernel void quantized_pack_weights(__global const uchar* w, const int w_off, __global const int* bias,
                                     const int b_off, __global uint* packed, const int OC, const int K,
                                     const int x_zero)
{
    const int oc = get_global_id(0);
    if (oc >= OC) return;
    const int KQ = (K + 3) / 4;
    __global const uchar* row = w + w_off + oc * K;
    uint sum = 0;
    for (int q = 0; q < KQ; ++q) {
        uint word = 0;
        for (int t = 0; t < 4 && 4 * q + t < K; ++t) {
            word |= (uint)row[4 * q + t] << (8 * t);
            sum += (uint)LOAD_W(row, 4 * q + t);
        }
        packed[OC + oc * KQ + q] = word;
    }
    packed[oc] = (uint)bias[b_off + oc] + (uint)(X_SHIFT - x_zero) * sum;
}

__kernel __attribute__((reqd_work_group_size(LX, LY, 1)))
void quantized_conv2d_dot(__global const uchar* x, const int x_off, __global const uint* packed, QCONV_REST)
{
    __local uint As[TQ][TM + 1];
    __local uint Bs[TQ][TN];
    TILE_START(int)
    const int z = get_group_id(2), img = z / G, g = z - img * G;
    const int cg = C / G, ocg = OC / G, khw = KH * KW, K = cg * khw, KQ = (K + 3) / 4, P = OH * OW;
    __global const uchar* xb = x + x_off + (img * C + g * cg) * H * W;
    __global const uint* wq = packed + OC + g * ocg * KQ;
    const uint zero_lane = ((uint)x_zero & 0xffu) ^ X_LANE_FLIP;
    for (int q0 = 0; q0 < KQ; q0 += TQ) {
        for (int e = tid; e < TM * TQ; e += NT) {
            const int mm = e / TQ, qq = e - mm * TQ;
            const int m = m0 + mm, q = q0 + qq;
            As[qq][mm] = (m < ocg && q < KQ) ? wq[m * KQ + q] : 0u;
        }
        for (int e = tid; e < TN * TQ; e += NT) {
            const int qq = e / TN, nn = e - qq * TN;
            const int n = n0 + nn, k = 4 * (q0 + qq);
            uint word = 0;
            if (n < P) {
                const int oy = n / OW, ox = n - oy * OW;
                for (int t = 0; t < 4 && k + t < K; ++t) {
                    const int c = (k + t) / khw, r = (k + t) - c * khw;
                    const int i = r / KW, j = r - i * KW;
                    const int iy = oy * SH - PH + i * DH, ix = ox * SW - PW + j * DW;
                    const uint lane = (iy >= 0 && iy < H && ix >= 0 && ix < W)
                        ? ((uint)xb[(c * H + iy) * W + ix] ^ X_LANE_FLIP) : zero_lane;
                    word |= lane << (8 * t);
                }
            }
            Bs[qq][nn] = word;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        TILE_PRODUCTS(uint, TQ, DOT4_ADD)
        barrier(CLK_LOCAL_MEM_FENCE);
    }
#define PACKED_BIAS_OF(oc) (int)packed[oc]
    STORE_TILE(PACKED_BIAS_OF)
}
#endif
