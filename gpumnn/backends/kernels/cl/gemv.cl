/* Matrix-vector product: the MatMuls with one row (M = 1), a batch-1 classifier or a decoder step.
 * Needs activation.cl.
 *
 * Y[b][n] = act(alpha * sum_k X[b][k] * B[b](k, n) + beta * bias(n)), with B(k, n) at
 * B + b_off + b * b_bs + k * BSK + n * BSN. The tiled GEMM gives such a product one row of
 * tiles, most of which it fills with zeros; here a work-group of KL x NL work-items owns NL output
 * columns and walks K in KL lanes, then sums its lanes in local memory. KFAST (a compile-time
 * define) puts the KL lanes next to each other where B is contiguous along k (a transposed
 * weight, [N, K]), and the NL columns next to each other where it is contiguous along n, so each
 * load of B is coalesced either way.
 *
 * Split K: global dim 1 walks KS slices of the inner dimension, KSLICE deep, where the column
 * blocks are too few to fill the device; slice s writes its raw sums to P + s * SPLIT (a scratch
 * [KS][batch][N]) and gemv_split_sum adds them with alpha, the bias and the activation. */

#ifndef KL
#define KL 32
#endif
#ifndef NL
#define NL 8
#endif
#ifndef KFAST
#define KFAST 1
#endif
#define GEMV_WG (KL * NL)

__kernel __attribute__((reqd_work_group_size(GEMV_WG, 1, 1))) void gemv(
    __global const float* X, const int x_off, const int x_bs,
    __global const float* B, const int b_off, const int b_bs, const int BSK, const int BSN,
    __global float* Y, const int y_off, const int y_bs,
    __global const float* bias, const int bias_off, const int bias_sn, const int has_bias,
    const int N, const int K, const int KS, const int KSLICE, const int SPLIT,
    const float alpha, const float beta, const int act, const float p0, const float p1, const float p2)
{
    __local float lanes[GEMV_WG];
    const int lid = get_local_id(0);
#if KFAST
    const int kl = lid % KL, nl = lid / KL;
#else
    const int nl = lid % NL, kl = lid / NL;
#endif
    const int n = get_group_id(0) * NL + nl;
    const int split = get_group_id(1), b = get_group_id(2);
    const int k_lo = split * KSLICE, k_hi = min(K, k_lo + KSLICE);
    __global const float* Xb = X + x_off + b * x_bs;
    __global const float* Bb = B + b_off + b * b_bs + n * BSN;
    float acc = 0.0f;
    if (n < N)
        for (int k = k_lo + kl; k < k_hi; k += KL) acc = mad(Xb[k], Bb[k * BSK], acc);
    lanes[kl * NL + nl] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = KL / 2; s > 0; s >>= 1) {   /* KL is a power of two */
        if (kl < s) lanes[kl * NL + nl] += lanes[(kl + s) * NL + nl];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (kl != 0 || n >= N) return;
    const float sum = lanes[nl];
    if (KS > 1) {   /* one slice's sums (Y is the scratch, y_bs = N): gemv_split_sum ends */
        Y[y_off + split * SPLIT + b * y_bs + n] = sum;
        return;
    }
    float v = alpha * sum;
    if (has_bias) v += beta * bias[bias_off + n * bias_sn];
    Y[y_off + b * y_bs + n] = apply_unary(act, v, p0, p1, p2);
}

/* The end of a split-K product: element e of [batch][N] is the sum of the KS slices P[s][e], then
 * alpha, the bias and the activation as in gemv. */
__kernel __attribute__((reqd_work_group_size(GEMV_WG, 1, 1))) void gemv_split_sum(
    __global const float* P, const int KS, const int SPLIT, const int N,
    __global float* Y, const int y_off, const int y_bs,
    __global const float* bias, const int bias_off, const int bias_sn, const int has_bias,
    const float alpha, const float beta, const int act, const float p0, const float p1, const float p2)
{
    const int e = get_global_id(0);
    if (e >= SPLIT) return;
    float sum = 0.0f;
    for (int s = 0; s < KS; ++s) sum += P[s * SPLIT + e];
    const int b = e / N, n = e - b * N;
    float v = alpha * sum;
    if (has_bias) v += beta * bias[bias_off + n * bias_sn];
    Y[y_off + b * y_bs + n] = apply_unary(act, v, p0, p1, p2);
}
