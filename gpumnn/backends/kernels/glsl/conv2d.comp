// Conv2D (NCHW). Three kernels:
// default: implicit GEMM per (batch, group): out[oc, p] = W[oc, k] * im2col(x)[k, p] with
//   k = (c, ky, kx) and p = (oy, ox), tiled in shared memory by gemm_core.glsl (GPUs).
//   -DPOINTWISE: 1x1, stride 1, no padding (the input is the B matrix as it lies).
//   -DCOOPMAT: the tiles on Vulkan's cooperative matrices (gemm_coopmat.glsl) instead.
// -DDIRECT_RB: register-blocked direct convolution for SIMD CPUs (lavapipe, SwiftShader): an
//   invocation accumulates RM output channels x RN consecutive pixels of one output row,
//   reading weights packed [G][M/RM][C/G][KH][KW][RM] as vec4 and each input row segment once
//   for all KW taps. -DX_VEC4 reads the input as vec4 (1x1 convs viewed as one row, aligned).
// -DDEPTHWISE: an invocation computes RN consecutive pixels of one output row of one channel.
// -DHAS_BIAS, -DHAS_RESIDUAL, -DACT=<unary id> (epilogue: act((acc + bias) + residual), each sum in
//   float32 in that order; the residual, binding 4 at element offset param 25, is laid out as the output).
// GEMM params: 0 M=OC/G | 1 N=OH*OW | 2 K=C/G*KH*KW | 3 G | 4 x_off | 5 w_off | 6 b_off | 7 out_off
//   8 C | 9 H | 10 W | 11 OW | 12 OC | 13 C/G | 14 KH | 15 KW | 16 SH | 17 SW | 18 PT | 19 PL
//   20 DH | 21 DW | 22..24 activation params | 26 K slices | 27 slice depth | 28 outputs (N*OC*OH*OW)
//   -DKSPLIT: slice s of K writes its raw sums to dst from element out_off + s * outputs, laid out as
//   the output (a scratch [slices][N][OC][OH*OW]); split_sum.comp adds bias, residual, activation.
// DIRECT_RB params: 0 M=OC/G | 1 OH | 2 OW | 3 G | 4 x_off | 5 packed w_off (vec4 units) | 6 b_off
//   7 out_off | 8 C | 9 H | 10 W | 11 OC | 12 C/G | 13 KH | 14 SH | 15 PT | 16 PL | 17 DH
//   18 row groups per output row | 19 M/RM blocks | 22..24 activation; compile-time RM, RN, KW, SW, DW, WG
// DEPTHWISE params: 0 invocations (N*C*OH*row groups) | 1 C | 2 H | 3 W | 4 OH | 5 OW | 6 KH | 8 SH
//   10 PT | 11 PL | 12 DH | 14 x_off | 15 w_off | 16 b_off | 17 out_off | 18 row groups per output
//   row | 22..24 activation; compile-time RN, KW, SW, DW, WG
// Every kernel: 25 residual offset (-DHAS_RESIDUAL). The default and DEPTHWISE kernels take float16
// tensors with -DHALF (common.glsl); DIRECT_RB is float32 only.
#include "common.glsl"
#define ACT_P 22
#include "activation.glsl"
BUFFER_WO_F(0, dst);
BUFFER_RO_F(1, X);
BUFFER_RO_F(2, Wt);
BUFFER_RO_F(3, bias);
#ifdef HAS_RESIDUAL
BUFFER_RO_F(4, res);
// v plus the residual at output element i (relative to the output's own offset).
#define ADD_RESIDUAL(v, i) ((v) + LOADF(res, PI(25) + (i)))
#else
#define ADD_RESIDUAL(v, i) (v)
#endif

#ifdef DEPTHWISE
// One invocation: RN consecutive output pixels of one row of one channel; each input row
// segment is loaded once for all KW taps. Compile-time RN, KW, SW, DW, WG.
layout(local_size_x = WG) in;
#define SEG ((RN - 1) * SW + (KW - 1) * DW + 1)
void main() {
    int t = GLOBAL_ID();
    if (t >= PI(0)) return;
    int H = PI(2), W = PI(3), OH = PI(4), OW = PI(5), KH = PI(6), gpr = PI(18);
    int r = t / gpr;
    int ox0 = (t - r * gpr) * RN;
    int oy = r % OH;
    int nc = r / OH;          // n * C + c
    int c = nc % PI(1);
    int iy0 = oy * PI(8) - PI(10), ix0 = ox0 * SW - PI(11);
    int xb = PI(14) + nc * H * W;
    int wb = PI(15) + c * KH * KW;
    float acc[RN];
    UNROLL for (int j = 0; j < RN; ++j) acc[j] = 0.0;
    for (int ky = 0; ky < KH; ++ky) {
        int iy = iy0 + ky * PI(12);
        if (iy < 0 || iy >= H) continue;
        float xs[SEG];
        UNROLL for (int s = 0; s < SEG; ++s) {
            int ix = ix0 + s;
            xs[s] = (ix >= 0 && ix < W) ? LOADF(X, xb + iy * W + ix) : 0.0;
        }
        UNROLL for (int kx = 0; kx < KW; ++kx) {
            float w = LOADF(Wt, wb + ky * KW + kx);
            UNROLL for (int j = 0; j < RN; ++j) acc[j] += w * xs[j * SW + kx * DW];
        }
    }
    float bv = 0.0;
#ifdef HAS_BIAS
    bv = LOADF(bias, PI(16) + c);
#endif
    int oi = (nc * OH + oy) * OW + ox0;
    UNROLL for (int j = 0; j < RN; ++j)
        if (ox0 + j < OW) STOREF(dst, PI(17) + oi + j, EPILOGUE(ADD_RESIDUAL(acc[j] + bv, oi + j)));
}
#elif defined(DIRECT_RB)
BUFFER_RO_VEC4(2, W4);
#ifdef X_VEC4
BUFFER_RO_VEC4(1, X4);
#endif
layout(local_size_x = WG) in;
#define RM4 (RM / 4)
#define SEG ((RN - 1) * SW + (KW - 1) * DW + 1)
void main() {
    int M = PI(0), OH = PI(1), OW = PI(2), H = PI(9), W = PI(10), CG = PI(12), KH = PI(13);
    int gpr = PI(18);
    int t = int(gl_WorkGroupID.x) * WG + int(gl_LocalInvocationID.x);
    int oy = t / gpr;
    int ox0 = (t - oy * gpr) * RN;
    bool live = oy < OH;
    int mb = int(gl_WorkGroupID.y);
    int z = int(gl_WorkGroupID.z);
    int n = z / PI(3), g = z % PI(3);
    int xb = PI(4) + (n * PI(8) + g * CG) * H * W;
    int wi = PI(5) + (g * PI(19) + mb) * CG * KH * KW * RM4;
    int ix0 = ox0 * SW - PI(16);
    int iy0 = oy * PI(14) - PI(15);
    vec4 acc[RM4][RN];
    UNROLL for (int i = 0; i < RM4; ++i)
        UNROLL for (int j = 0; j < RN; ++j) acc[i][j] = vec4(0.0);
    for (int c = 0; c < CG; ++c) {
        int xc = xb + c * H * W;
        for (int ky = 0; ky < KH; ++ky) {
            int iy = iy0 + ky * PI(17);
            bool row = live && iy >= 0 && iy < H;
            float xs[SEG];
#ifdef X_VEC4
            UNROLL for (int s = 0; s < SEG / 4; ++s) {
                vec4 v = (row && ix0 + 4 * s < W) ? X4[(xc + iy * W + ix0) / 4 + s] : vec4(0.0);
                xs[4 * s] = v.x; xs[4 * s + 1] = v.y; xs[4 * s + 2] = v.z; xs[4 * s + 3] = v.w;
            }
#else
            UNROLL for (int s = 0; s < SEG; ++s) {
                int ix = ix0 + s;
                xs[s] = (row && ix >= 0 && ix < W) ? X[xc + iy * W + ix] : 0.0;
            }
#endif
            UNROLL for (int kx = 0; kx < KW; ++kx) {
                vec4 w[RM4];
                UNROLL for (int i = 0; i < RM4; ++i) w[i] = W4[wi + i];
                wi += RM4;
                UNROLL for (int j = 0; j < RN; ++j) {
                    float x = xs[j * SW + kx * DW];
                    UNROLL for (int i = 0; i < RM4; ++i) acc[i][j] += w[i] * x;
                }
            }
        }
    }
    if (!live) return;
    int oi = (n * PI(11) + g * M) * OH * OW + oy * OW;
    UNROLL for (int i = 0; i < RM4; ++i) {
        UNROLL for (int q = 0; q < 4; ++q) {
            int m = mb * RM + i * 4 + q;
            if (m >= M) continue;
            float bv = 0.0;
#ifdef HAS_BIAS
            bv = bias[PI(6) + g * M + m];
#endif
            UNROLL for (int j = 0; j < RN; ++j)
                if (ox0 + j < OW) {
                    int e = oi + m * OH * OW + ox0 + j;
                    dst[PI(7) + e] = EPILOGUE(ADD_RESIDUAL(acc[i][j][q] + bv, e));
                }
        }
    }
}
#else
int x_base, w_base, o_base, g_id;  // o_base: the (image, group)'s first output element, from offset 0
#define GEMM_M PI(0)
#define GEMM_N PI(1)
#define GEMM_K PI(2)
#define GEMM_KS PI(26)
#define GEMM_KSLICE PI(27)
#define GEMM_PREPARE(z) prepare(z, gemm_slice)
int o_slice;  // the first output element of this workgroup's slice of K in the scratch (-DKSPLIT)
void prepare(int z, int slice) {
    int n = z / PI(3);
    g_id = z % PI(3);
    x_base = PI(4) + (n * PI(8) + g_id * PI(13)) * PI(9) * PI(10);
    w_base = PI(5) + g_id * PI(0) * PI(2);
    o_base = (n * PI(12) + g_id * PI(0)) * PI(1);
    o_slice = slice * PI(28);
}
#define LOAD_A(m, k) LOADF(Wt, w_base + (m) * PI(2) + (k))
#ifdef POINTWISE
#define LOAD_B(k, n) LOADF(X, x_base + (k) * PI(1) + (n))
#else
float load_b(int k, int p) {
    int khw = PI(14) * PI(15);
    int c = k / khw;
    int r = k - c * khw;
    int ky = r / PI(15), kx = r - (r / PI(15)) * PI(15);
    int oy = p / PI(11), ox = p - (p / PI(11)) * PI(11);
    int iy = oy * PI(16) - PI(18) + ky * PI(20);
    int ix = ox * PI(17) - PI(19) + kx * PI(21);
    if (iy < 0 || iy >= PI(9) || ix < 0 || ix >= PI(10)) return 0.0;
    return LOADF(X, x_base + (c * PI(9) + iy) * PI(10) + ix);
}
#define LOAD_B(k, n) load_b(k, n)
#endif
void store_c(int m, int n, float acc) {
    int e = o_base + m * PI(1) + n;
#ifdef KSPLIT
    dst[PI(7) + o_slice + e] = acc;
#else
#ifdef HAS_BIAS
    acc += LOADF(bias, PI(6) + g_id * PI(0) + m);
#endif
    STOREF(dst, PI(7) + e, EPILOGUE(ADD_RESIDUAL(acc, e)));
#endif
}
#define STORE_C(m, n, acc) store_c(m, n, acc)
#ifdef COOPMAT
#include "gemm_coopmat.glsl"
#else
#include "gemm_core.glsl"
#endif
#endif
