/* Tiled GEMM shared by MatMul, Conv2D (implicit im2col; 1x1 convs are plain GEMMs) and
 * ConvTranspose2D (implicit col2im as a gather). Needs activation.cl.
 *
 * C[b][m][n] = act(alpha * sum_k A(m,k) * B(k,n) + beta * bias(m,n) + R[b][m][n]), C rows contiguous
 * (ldc = N); the residual R (a convolution's, where has_res) is laid out as C.
 * The batch index b (global dim 2) splits into (b / G, b % G) so that convolutions can walk
 * (image, group) with one launch; every operand has one stride per part.
 *
 * Tiling (compile-time): a work-group of LX x LY work-items computes a TM x TN tile of C, each
 * work-item a WM x WN register block (rows ty + i*LY, cols tx + j*LX: coalesced stores), with
 * TK-deep slices of A and B staged in local memory. The operand loaders differ per kernel
 * (MODE is a literal in each kernel, so the compiler folds the branches).
 *
 * Split K: where the tiles are fewer than the device's compute units (a batch-1 classifier, a
 * late-stage conv with 49 pixels), global dim 2 also walks KS slices of the inner dimension, KSLICE
 * deep: slice s writes its raw sums alpha-free to C + s * C_SPLIT (a scratch [KS][batch][M][N]),
 * and gemm_split_sum adds the slices with alpha, the bias and the activation. With KS = 1 the
 * kernel writes the epilogue itself, as before. With -DHALF (index.cl) A, B, C, the bias and R are
 * float16, converted to float on the way into the tiles: the sums are float32.
 *
 * TF32 (-DGEMM_TF32=1, CUDA only: precision="tf32"): the same tiles in shared memory, multiplied
 * on tensor cores by mma.sync m16n8k8 (prelude_cuda.h), the operands rounded to TF32 and the sums
 * kept in float32. Each warp owns 16 rows and WCOLS columns of the tile (NTILES products 8 wide
 * per 8-deep step of K); the shared rows are padded so that a warp's fragment loads hit 32
 * different banks. Tiles of fewer than 16 rows (the 4x128 tiling) stay in float32.
 *
 * Float16 (-DGEMM_F16=1 with -DHALF, CUDA only: precision="fp16" on sm_80 and later): the same warps
 * multiply by mma.sync m16n8k16 on float16 operands (exact: they come from float16 storage), float32
 * sums, 16 deep per step of K. The f16_* functions below place each fragment element; the
 * tests evaluate them (tests/test_mma_f16.py), so keep each a single return of plain arithmetic. */

#ifndef GEMM_TF32
#define GEMM_TF32 0
#endif
#ifndef GEMM_F16
#define GEMM_F16 0
#endif
#define GEMM_MMA (GEMM_TF32 || GEMM_F16)
#if GEMM_F16
#define AS (TM + 4)   /* k rows 4 banks apart: the 4 even k (2 apart) and 8 m of a fragment load on 32 banks */
#define BS (TN + 4)
#elif GEMM_TF32
#define AS (TM + 8)   /* k rows 8 banks apart: the 4 k and 8 m of a fragment load on 32 banks */
#define BS (TN + 8)
#endif
#if GEMM_MMA
#define MMA_ROW_BLOCKS (TM / 16)                     /* warps along M, 16 rows each */
#define MMA_COL_BLOCKS ((NT / 32) / MMA_ROW_BLOCKS)  /* warps along N */
#define WCOLS (TN / MMA_COL_BLOCKS)                  /* columns of one warp */
#define NTILES (WCOLS / 8)                           /* products 8 columns wide per warp and K step */
#else
#define AS (TM + 1)   /* padded row of the A tile: no bank conflicts on the transposing store */
#define BS TN
#endif

#define MODE_DENSE 0
#define MODE_CONV 1
#define MODE_DECONV 2

#define GEMM_ARGS \
    __global const DATA_T* A, const int a_off, \
    __global const DATA_T* B, const int b_off, \
    __global DATA_T* C, const int c_off, \
    __global const DATA_T* bias, const int bias_off, \
    __global const DATA_T* R, const int r_off, const int has_res, \
    const int M, const int N, const int K, const int G, \
    const int a_s1, const int a_s0, const int b_s1, const int b_s0, \
    const int c_s1, const int c_s0, const int bias_s1, const int bias_s0, \
    const int lda, const int ldb, const int trans_a, const int trans_b, \
    const int has_bias, const int bias_sm, const int bias_sn, const float alpha, const float beta, \
    const int act, const float p0, const float p1, const float p2, \
    const int H, const int W, const int OW, const int KH, const int KW, \
    const int SH, const int SW, const int PH, const int PW, const int DH, const int DW, \
    const int KS, const int KSLICE, const int C_SPLIT

#define GEMM_PASS \
    A, a_off, B, b_off, C, c_off, bias, bias_off, R, r_off, has_res, M, N, K, G, a_s1, a_s0, b_s1, b_s0, \
    c_s1, c_s0, bias_s1, bias_s0, lda, ldb, trans_a, trans_b, has_bias, bias_sm, bias_sn, \
    alpha, beta, act, p0, p1, p2, H, W, OW, KH, KW, SH, SW, PH, PW, DH, DW, KS, KSLICE, C_SPLIT

/* Element e of a T x TK operand tile -> (row x, depth kk): e walks the tile k-major
 * ([TK][T], ``kmajor``) or row-major ([T][TK]), whichever matches the operand's memory order. */
inline void tile_split(const int e, const int kmajor, const int T, int* x, int* kk)
{
    if (kmajor) { *kk = e / T; *x = e - *kk * T; } else { *x = e / TK; *kk = e - *x * TK; }
}

#if GEMM_MMA
/* Where a warp's 16 rows and WCOLS columns of the tile start: warps walk the row blocks first. */
inline int mma_warp_row(const int warp) { return warp % MMA_ROW_BLOCKS * 16; }
inline int mma_warp_col(const int warp) { return warp / MMA_ROW_BLOCKS * WCOLS; }
/* The float32 sums of m16n8k8 and m16n8k16 alike (PTX ISA): a lane's sum r at row, column of the 16 x 8 block. */
inline int mma_c_row(const int lane, const int r) { return lane / 4 + r / 2 * 8; }
inline int mma_c_col(const int lane, const int r) { return lane % 4 * 2 + r % 2; }
#endif
#if GEMM_F16
/* mma.sync m16n8k16 .row.col float16 fragments (PTX ISA): a lane's element j of A (j = 2 x register +
 * half, 8 of them) at (row, k) of the 16 x 16 block, its element j of B (4) at (k, column) of 16 x 8. */
inline int f16_a_row(const int lane, const int j) { return lane / 4 + j / 2 % 2 * 8; }
inline int f16_a_k(const int lane, const int j) { return lane % 4 * 2 + j % 2 + j / 4 * 8; }
inline int f16_b_k(const int lane, const int j) { return lane % 4 * 2 + j % 2 + j / 2 * 8; }
inline int f16_b_col(const int lane, const int j) { return lane / 4; }
/* Those elements in the shared tiles As[k][m] and Bs[k][n]: the warp's block at depth kk, rows from
 * wr (A), columns from col0 (B). */
inline int f16_a_at(const int kk, const int wr, const int lane, const int j) { return (kk + f16_a_k(lane, j)) * AS + wr + f16_a_row(lane, j); }
inline int f16_b_at(const int kk, const int col0, const int lane, const int j) { return (kk + f16_b_k(lane, j)) * BS + col0 + f16_b_col(lane, j); }
#endif

/* Element (m, n) of a tile's sums (the tensor-core paths' epilogue, element by element as a fragment holds
 * them): a K slice's raw sum (KS > 1), or alpha, the bias, the residual and the activation. */
inline void gemm_store(__global float* Pb, __global DATA_T* Cb, __global const DATA_T* biasb, __global const DATA_T* Rb,
                       const int m, const int n, const float sum, const int M, const int N, const int KS,
                       const float alpha, const float beta, const int has_bias, const int bias_sm,
                       const int bias_sn, const int has_res, const int act, const float p0, const float p1,
                       const float p2)
{
    if (m >= M || n >= N) return;
    if (KS > 1) { Pb[m * N + n] = sum; return; }  /* one slice's sums: gemm_split_sum ends */
    float v = alpha * sum;
    if (has_bias) v += beta * LOADF(biasb, m * bias_sm + n * bias_sn);
    if (has_res) v += LOADF(Rb, m * N + n);
    STOREF(apply_unary(act, v, p0, p1, p2), Cb, m * N + n);
}

inline void gemm_body(const int mode, LOCAL_PTR float* As, LOCAL_PTR float* Bs, GEMM_ARGS)
{
    const int tx = get_local_id(0), ty = get_local_id(1);
    const int tid = ty * LX + tx;
    const int n0 = get_group_id(0) * TN, m0 = get_group_id(1) * TM;
    const int split = get_global_id(2) % KS, bz = get_global_id(2) / KS;
    const int k_lo = split * KSLICE, k_hi = min(K, k_lo + KSLICE);
    const int bo = bz / G, bi = bz - bo * G;
    __global const DATA_T* Ab = A + a_off + bo * a_s1 + bi * a_s0;
    __global const DATA_T* Bb = B + b_off + bo * b_s1 + bi * b_s0;
    const int khw = KH * KW;
    const int tA = (mode == MODE_DENSE || mode == MODE_CONV) ? trans_a : 0;
    const int tB = (mode == MODE_DENSE) ? trans_b : 0;

#if GEMM_MMA
    const int warp = tid / 32, lane = tid % 32, group = lane / 4, member = lane % 4;
    const int wr = mma_warp_row(warp), wc = mma_warp_col(warp);
    float acc[NTILES][4];
    for (int t = 0; t < NTILES; ++t)
        for (int r = 0; r < 4; ++r) acc[t][r] = 0.0f;
#else
    float acc[WM][WN];
    for (int i = 0; i < WM; ++i)
        for (int j = 0; j < WN; ++j) acc[i][j] = 0.0f;
#endif

    for (int k0 = k_lo; k0 < k_hi; k0 += TK) {
        /* ---- stage A(m0.., k0..) as As[kk][mm] ---- */
        for (int e = tid; e < TM * TK; e += NT) {
            int mm, kk;
            tile_split(e, tA, TM, &mm, &kk);
            const int m = m0 + mm, k = k0 + kk;
            float v = 0.0f;
            if (m < M && k < k_hi) {
                if (mode == MODE_DECONV) {          /* ONNX weight [C/g, OC/g, KH, KW] per group */
                    const int c = k / khw, r = k - c * khw;
                    v = LOADF(Ab, (c * M + m) * khw + r);
                } else {
                    v = LOADF(Ab, tA ? k * lda + m : m * lda + k);
                }
            }
            As[kk * AS + mm] = v;
        }
        /* ---- stage B(k0.., n0..) as Bs[kk][nn] ---- */
        for (int e = tid; e < TN * TK; e += NT) {
            int nn, kk;
            tile_split(e, !tB, TN, &nn, &kk);
            const int n = n0 + nn, k = k0 + kk;
            float v = 0.0f;
            if (n < N && k < k_hi) {
                if (mode == MODE_DENSE) {
                    v = LOADF(Bb, tB ? n * ldb + k : k * ldb + n);
                } else {
                    const int c = k / khw, r = k - c * khw;
                    const int i = r / KW, j = r - i * KW;
                    const int oy = n / OW, ox = n - oy * OW;
                    if (mode == MODE_CONV) {
                        const int iy = oy * SH - PH + i * DH, ix = ox * SW - PW + j * DW;
                        if (iy >= 0 && iy < H && ix >= 0 && ix < W) v = LOADF(Bb, (c * H + iy) * W + ix);
                    } else {                        /* out(oy) gathers x(iy) with oy = iy*S - P + i*D */
                        const int ty2 = oy + PH - i * DH, tx2 = ox + PW - j * DW;
                        if (ty2 >= 0 && tx2 >= 0) {
                            const int iy = ty2 / SH, ix = tx2 / SW;
                            if (iy * SH == ty2 && ix * SW == tx2 && iy < H && ix < W)
                                v = LOADF(Bb, (c * H + iy) * W + ix);
                        }
                    }
                }
            }
            Bs[kk * BS + nn] = v;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
#if GEMM_TF32
        for (int kk = 0; kk < TK; kk += 8) {   /* A fragment: rows group, group + 8; k member, member + 4 */
            const int k0r = (kk + member) * AS + wr + group, k4r = (kk + member + 4) * AS + wr + group;
            const uint a[4] = {to_tf32(As[k0r]), to_tf32(As[k0r + 8]), to_tf32(As[k4r]), to_tf32(As[k4r + 8])};
            for (int t = 0; t < NTILES; ++t) {   /* B fragment: k member, member + 4; column group */
                const int col = wc + t * 8 + group;
                const uint b[2] = {to_tf32(Bs[(kk + member) * BS + col]), to_tf32(Bs[(kk + member + 4) * BS + col])};
                mma_tf32_m16n8k8(acc[t], a, b);
            }
        }
#elif GEMM_F16
        for (int kk = 0; kk < TK; kk += 16) {
            uint a[4], b[2];
            for (int r = 0; r < 4; ++r)
                a[r] = pack_half2(As[f16_a_at(kk, wr, lane, 2 * r)], As[f16_a_at(kk, wr, lane, 2 * r + 1)]);
            for (int t = 0; t < NTILES; ++t) {
                for (int r = 0; r < 2; ++r)
                    b[r] = pack_half2(Bs[f16_b_at(kk, wc + t * 8, lane, 2 * r)], Bs[f16_b_at(kk, wc + t * 8, lane, 2 * r + 1)]);
                mma_f16_m16n8k16(acc[t], a, b);
            }
        }
#else
        for (int kk = 0; kk < TK; ++kk) {
            float a[WM], b[WN];
            for (int i = 0; i < WM; ++i) a[i] = As[kk * AS + ty + i * LY];
            for (int j = 0; j < WN; ++j) b[j] = Bs[kk * BS + tx + j * LX];
            for (int i = 0; i < WM; ++i)
                for (int j = 0; j < WN; ++j) acc[i][j] = mad(a[i], b[j], acc[i][j]);
        }
#endif
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    /* split K: the partial sums go to a float32 scratch passed as C (offset 0) */
    __global float* Pb = (__global float*)C + bo * c_s1 + bi * c_s0 + split * C_SPLIT;
    __global DATA_T* Cb = C + c_off + bo * c_s1 + bi * c_s0;
    __global const DATA_T* biasb = bias + bias_off + bo * bias_s1 + bi * bias_s0;
    __global const DATA_T* Rb = R + r_off + bo * c_s1 + bi * c_s0;
#if GEMM_MMA
    for (int t = 0; t < NTILES; ++t)
        for (int r = 0; r < 4; ++r)
            gemm_store(Pb, Cb, biasb, Rb, m0 + wr + mma_c_row(lane, r), n0 + wc + t * 8 + mma_c_col(lane, r), acc[t][r],
                       M, N, KS, alpha, beta, has_bias, bias_sm, bias_sn, has_res, act, p0, p1, p2);
#else
    for (int i = 0; i < WM; ++i) {
        const int m = m0 + ty + i * LY;
        if (m >= M) continue;
        for (int j = 0; j < WN; ++j) {
            const int n = n0 + tx + j * LX;
            if (n >= N) continue;
            if (KS > 1) { Pb[m * N + n] = acc[i][j]; continue; }  /* one slice's sums: gemm_split_sum ends */
            float v = alpha * acc[i][j];
            if (has_bias) v += beta * LOADF(biasb, m * bias_sm + n * bias_sn);
            if (has_res) v += LOADF(Rb, m * N + n);
            STOREF(apply_unary(act, v, p0, p1, p2), Cb, m * N + n);
        }
    }
#endif
}

__kernel __attribute__((reqd_work_group_size(LX, LY, 1))) void gemm_dense(GEMM_ARGS)
{
    __local float As[TK * AS];
    __local float Bs[TK * BS];
    gemm_body(MODE_DENSE, As, Bs, GEMM_PASS);
}

__kernel __attribute__((reqd_work_group_size(LX, LY, 1))) void gemm_conv(GEMM_ARGS)
{
    __local float As[TK * AS];
    __local float Bs[TK * BS];
    gemm_body(MODE_CONV, As, Bs, GEMM_PASS);
}

__kernel __attribute__((reqd_work_group_size(LX, LY, 1))) void gemm_deconv(GEMM_ARGS)
{
    __local float As[TK * AS];
    __local float Bs[TK * BS];
    gemm_body(MODE_DECONV, As, Bs, GEMM_PASS);
}

/* The end of a split-K GEMM: out element e of [batch][M][N] (batch = bo * G + bi) is the sum of the
 * KS slices' partial sums P[s][e], then alpha, the bias, the residual and the activation as gemm_body's epilogue.
 * 1-D work-groups of the GEMM's NT work-items (every kernel of a variant has the same bound). */
__kernel __attribute__((reqd_work_group_size(NT, 1, 1))) void gemm_split_sum(__global const float* P, const int KS, const int C_SPLIT,
                             const int M, const int N, const int G,
                             __global DATA_T* C, const int c_off, const int c_s1, const int c_s0,
                             __global const DATA_T* bias, const int bias_off, const int bias_s1, const int bias_s0,
                             const int has_bias, const int bias_sm, const int bias_sn,
                             __global const DATA_T* R, const int r_off, const int has_res,
                             const float alpha, const float beta,
                             const int act, const float p0, const float p1, const float p2)
{
    const int e = get_global_id(0);
    if (e >= C_SPLIT) return;
    float sum = 0.0f;
    for (int s = 0; s < KS; ++s) sum += P[s * C_SPLIT + e];
    const int mn = M * N;
    const int bz = e / mn, r = e - bz * mn;
    const int m = r / N, n = r - m * N;
    const int bo = bz / G, bi = bz - bo * G;
    float v = alpha * sum;
    if (has_bias) v += beta * LOADF(bias, bias_off + bo * bias_s1 + bi * bias_s0 + m * bias_sm + n * bias_sn);
    if (has_res) v += LOADF(R, r_off + bo * c_s1 + bi * c_s0 + m * N + n);
    STOREF(apply_unary(act, v, p0, p1, p2), C, c_off + bo * c_s1 + bi * c_s0 + m * N + n);
}
