/* QuantizedMatMul (gpumnn.atomic): y[M][N] float32 = act(float(acc - zero[m] * colsum[n]) *
 * (scale[m] * w_scale[n]) + bias[n]), acc the exact int32 sum of uint8 rows q[m][k] by the int8
 * weight w[k][n]. Three kernels: weight_column_sums (colsum, once per constant weight),
 * quantize_rows (the contract's per-row uint8 quantization, run-time form only) and the product,
 * quantized_matmul_vec (RM rows x VEC columns a work item in vectors: CPU devices) or
 * quantized_matmul_tiled (int32 tiles in local memory: the GPU family). Needs activation.cl. Bytes move as uchar (CUDA's char
 * signedness varies by host); -DPREQUANTIZED takes one scale and zero point from the op's inputs
 * instead of each row's from quantize_rows. Needs rounding.cl (quotient_rn). */

#define LOAD_W(p, i) (((int)(p)[i] ^ 0x80) - 0x80)

/* colsum[n] = sum_k w[k][n] for the zero-point correction: a work item per column. */
__kernel void weight_column_sums(__global const uchar* w, const int w_off, __global int* colsum, const int K,
                                 const int N)
{
    const int n = get_global_id(0);
    if (n >= N) return;
    int sum = 0;
    for (int k = 0; k < K; ++k) sum += LOAD_W(w, w_off + k * N + n);
    colsum[n] = sum;
}

/* Row m (work-group m of QWG work-items) of x quantized into q[m][K] and rows[2m] = scale,
 * rows[2m + 1] = zero point: min and max reduced in local memory, then the contract's float32
 * arithmetic (gpumnn.atomic.QuantizedMatMul), rint rounding half to even. */
#define QWG 64
__kernel __attribute__((reqd_work_group_size(QWG, 1, 1)))
void quantize_rows(__global const float* x, const int x_off, __global uchar* q, __global float* rows, const int K)
{
    __local float lows[QWG];
    __local float highs[QWG];
    const int lid = get_local_id(0), m = get_group_id(0);
    __global const float* row = x + x_off + m * K;
    float lo = 0.0f, hi = 0.0f;
    for (int k = lid; k < K; k += QWG) {
        lo = fmin(lo, row[k]);
        hi = fmax(hi, row[k]);
    }
    lows[lid] = lo;
    highs[lid] = hi;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = QWG / 2; s > 0; s >>= 1) {
        if (lid < s) {
            lows[lid] = fmin(lows[lid], lows[lid + s]);
            highs[lid] = fmax(highs[lid], highs[lid + s]);
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float scale = quotient_rn(highs[0] - lows[0], 255.0f);
    if (scale == 0.0f) scale = 1.0f;
    const float zero = clamp(rint(quotient_rn(-lows[0], scale)), 0.0f, 255.0f);
    if (lid == 0) {
        rows[2 * m] = scale;
        rows[2 * m + 1] = zero;
    }
    __global uchar* out = q + m * K;
    for (int k = lid; k < K; k += QWG) out[k] = (uchar)(int)clamp(rint(quotient_rn(row[k], scale)) + zero, 0.0f, 255.0f);
}

/* The arguments of both products: q (uint8 [M][lda] from q_off), the int8 weight [K][N], its column
 * sums, the column scales, the bias, the row scales and zero points (rows from quantize_rows, or
 * with -DPREQUANTIZED x_scale [1] and x_zero uint8 [1]), the output and the activation. */
#define QMM_ARGS \
    __global const uchar* q, const int q_off, const int lda, __global const uchar* w, const int w_off, \
    __global const int* colsum, __global const float* w_scale, const int ws_off, __global const float* bias, \
    const int b_off, const int has_bias, __global const float* rows, __global const float* x_scale, \
    const int xs_off, __global const uchar* x_zero, const int xz_off, __global float* y, const int y_off, \
    const int M, const int N, const int K, const int act, const float p0, const float p1, const float p2

#ifdef PREQUANTIZED
#define ROW_SCALE(m) x_scale[xs_off]
#define ROW_ZERO(m) ((int)x_zero[xz_off])
#else
#define ROW_SCALE(m) rows[2 * (m)]
#define ROW_ZERO(m) ((int)rows[2 * (m) + 1])
#endif

/* The dequantizing epilogue of output (m, n) from its int32 sum, products rounded one at a time
 * as the reference rounds them (no fused multiply-add). */
#define QMM_STORE(m, n, acc) { \
    const float dq_ = (float)((acc) - ROW_ZERO(m) * colsum[n]); \
    const float s_ = ROW_SCALE(m) * w_scale[ws_off + (n)]; \
    const float v_ = MUL_RN(dq_, s_) + (has_bias ? bias[b_off + (n)] : 0.0f); \
    y[y_off + (m) * N + (n)] = apply_unary(act, v_, p0, p1, p2); \
}
#ifdef __CUDACC__
#define MUL_RN(a, b) __fmul_rn(a, b)
#else
#pragma OPENCL FP_CONTRACT OFF
#define MUL_RN(a, b) ((a) * (b))
#endif

#ifdef VEC
/* The CPU devices' product (-DVEC, OpenCL only): RM rows x VEC columns a work item, each step of k
 * one vector of VEC weights (a CPU OpenCL compiler vectorises explicit vectors, not loops of bytes
 * over work items) times each row's byte. */
#ifndef RM
#define RM 4
#endif
#define IVT VCAT(int, VEC)
#define CONVERT_IVT VCAT(convert_int, VEC)
__kernel void quantized_matmul_vec(QMM_ARGS)
{
    const int n0 = get_global_id(0) * VEC, m0 = get_global_id(1) * RM;
    if (n0 >= N || m0 >= M) return;
    const int count = min(RM, M - m0);
    __global const char* wc = (__global const char*)w + w_off + n0;
    __global const uchar* a = q + q_off + m0 * lda;
    IVT acc[RM];
    for (int i = 0; i < RM; ++i) acc[i] = (IVT)0;
    if (n0 + VEC <= N) {
        for (int k = 0; k < K; ++k) {
            const IVT b = CONVERT_IVT(VLOAD(0, wc + k * N));
            for (int i = 0; i < count; ++i) acc[i] += (int)a[i * lda + k] * b;
        }
    } else {  /* the last columns: the weights past N read as 0 */
        for (int k = 0; k < K; ++k) {
            int edge[VEC];
            for (int j = 0; j < VEC; ++j) edge[j] = n0 + j < N ? (int)wc[k * N + j] : 0;
            const IVT b = VLOAD(0, edge);
            for (int i = 0; i < count; ++i) acc[i] += (int)a[i * lda + k] * b;
        }
    }
    for (int i = 0; i < count; ++i) {
        int sums[VEC];
        VSTORE(acc[i], 0, sums);
        for (int j = 0; j < VEC && n0 + j < N; ++j) QMM_STORE(m0 + i, n0 + j, sums[j])
    }
}
#endif

/* The GPU family's product: a work-group of LX x LY work-items computes TM rows x TN columns, each
 * work-item a WM x WN block, TK-deep slices of q and the weight staged as int32 in local memory. */

__kernel __attribute__((reqd_work_group_size(LX, LY, 1)))
void quantized_matmul_tiled(QMM_ARGS)
{
    __local int As[TK][TM + 1];
    __local int Bs[TK][TN];
    TILE_START(int)
    for (int k0 = 0; k0 < K; k0 += TK) {
        for (int e = tid; e < TM * TK; e += NT) {
            const int mm = e / TK, kk = e - mm * TK;
            const int m = m0 + mm, k = k0 + kk;
            As[kk][mm] = (m < M && k < K) ? (int)q[q_off + m * lda + k] : 0;
        }
        for (int e = tid; e < TN * TK; e += NT) {
            const int kk = e / TN, nn = e - kk * TN;
            const int n = n0 + nn, k = k0 + kk;
            Bs[kk][nn] = (n < N && k < K) ? LOAD_W(w, w_off + k * N + n) : 0;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        TILE_PRODUCTS(int, TK, INT_MAC)
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    for (int i = 0; i < WM; ++i) {
        const int m = m0 + ty + i * LY;
        if (m >= M) continue;
        for (int j = 0; j < WN; ++j) {
            const int n = n0 + tx + j * LX;
            if (n < N) QMM_STORE(m, n, acc[i][j])
        }
    }
}
