/* GEMM and Conv2D kernels for CPU OpenCL devices (PoCL & co).
 *
 * A CPU OpenCL compiler only vectorises the loop over work-items when the kernel body has no
 * loops of its own, which a GEMM always has; so these kernels use explicit vector types:
 * each work-item owns a register block of RB rows x one VEC-wide vector, loads the vector
 * operand with vloadVEC and broadcasts the scalar one. No local memory and no barriers (both
 * are emulated, slowly, on CPUs). Needs activation.cl.
 *
 * Compile-time: VEC (4, 8 or 16) and RB (rows / pixels per work-item); the conv geometry is
 * passed at run time (one program serves every convolution). */

#ifndef VEC
#error "gemm_cpu.cl needs -DVEC"
#endif
#ifndef RB
#define RB 8
#endif

/* VT, VLOAD, VSTORE: see vec.cl */

/* Epilogue of one accumulator vector: alpha, bias (stride 0, 1 or any), residual (where has_res:
 * laid out as dst, ``res`` at dst's first element), activation, store of the first ``count``
 * elements ``stride`` apart (vector load / store when contiguous and whole). */
inline void store_vec(const VT acc, __global float* dst, const int stride, const int count,
                      __global const float* bias, const int bias_stride, const int has_bias,
                      __global const float* res, const int has_res,
                      const float alpha, const float beta,
                      const int act, const float p0, const float p1, const float p2)
{
    VT v = alpha * acc;
    if (has_bias) {
        if (bias_stride == 0) {
            v += (VT)(beta * bias[0]);
        } else if (bias_stride == 1 && count == VEC) {
            v += beta * VLOAD(0, bias);
        } else {
            float tmp[VEC];
            for (int e = 0; e < VEC; ++e) tmp[e] = e < count ? bias[e * bias_stride] : 0.0f;
            v += beta * VLOAD(0, tmp);
        }
    }
    if (has_res) {
        if (stride == 1 && count == VEC) {
            v += VLOAD(0, res);
        } else {
            float tmp[VEC];
            for (int e = 0; e < VEC; ++e) tmp[e] = e < count ? res[e * stride] : 0.0f;
            v += VLOAD(0, tmp);
        }
    }
    v = apply_unary_v(act, v, p0, p1, p2);
    if (stride == 1 && count == VEC) {
        VSTORE(v, 0, dst);
    } else {
        float tmp[VEC];
        VSTORE(v, 0, tmp);
        for (int e = 0; e < count; ++e) dst[e * stride] = tmp[e];
    }
}

/* C[b][m][n] = act(alpha * sum_k A(m,k) B(k,n) + beta * bias(m,n) + R[b][m][n]), B contiguous
 * along n; the residual R (a convolution's, where has_res) is laid out as C.
 * A(m,k) = A[m*am + k*ak] (either layout). Work-item: rows m0..m0+RB, columns n0..n0+VEC.
 * Global: (ceil(M/RB), ceil(N/VEC), batch): consecutive work-groups walk down M and share one
 * VEC-wide panel of B (in cache) while A (the weights) stays in L2.
 * The batch b splits as (b / G, b % G) like gemm.cl. */
__kernel void gemm_vn(__global const float* A, const int a_off,
                      __global const float* B, const int b_off,
                      __global float* C, const int c_off,
                      __global const float* bias, const int bias_off,
                      __global const float* R, const int r_off, const int has_res,
                      const int M, const int N, const int K, const int G,
                      const int a_s1, const int a_s0, const int b_s1, const int b_s0,
                      const int c_s1, const int c_s0, const int bias_s1, const int bias_s0,
                      const int am, const int ak, const int ldb,
                      const int has_bias, const int bias_sm, const int bias_sn,
                      const float alpha, const float beta,
                      const int act, const float p0, const float p1, const float p2)
{
    const int m0 = get_global_id(0) * RB, n0 = get_global_id(1) * VEC;
    const int bz = get_global_id(2);
    if (n0 >= N || m0 >= M) return;
    const int bo = bz / G, bi = bz - bo * G;
    __global const float* Ab = A + a_off + bo * a_s1 + bi * a_s0;
    __global const float* Bb = B + b_off + bo * b_s1 + bi * b_s0 + n0;
    const int rows = min(RB, M - m0), cols = min(VEC, N - n0);

    __global const float* ar[RB];
    VT acc[RB];
    for (int r = 0; r < RB; ++r) {
        ar[r] = Ab + min(m0 + r, M - 1) * am;   /* rows past M re-read the last (never stored) */
        acc[r] = (VT)(0.0f);
    }
    if (cols == VEC) {
        for (int k = 0; k < K; ++k) {
            const VT bv = VLOAD(0, Bb + k * ldb);
            for (int r = 0; r < RB; ++r) acc[r] = mad((VT)(ar[r][k * ak]), bv, acc[r]);
        }
    } else {
        float tmp[VEC];
        for (int e = 0; e < VEC; ++e) tmp[e] = 0.0f;
        for (int k = 0; k < K; ++k) {
            for (int e = 0; e < cols; ++e) tmp[e] = Bb[k * ldb + e];
            const VT bv = VLOAD(0, tmp);
            for (int r = 0; r < RB; ++r) acc[r] = mad((VT)(ar[r][k * ak]), bv, acc[r]);
        }
    }
    __global float* Cb = C + c_off + bo * c_s1 + bi * c_s0 + m0 * N + n0;
    __global const float* Rb = R + r_off + bo * c_s1 + bi * c_s0 + m0 * N + n0;
    __global const float* biasb = bias + bias_off + bo * bias_s1 + bi * bias_s0 + m0 * bias_sm + n0 * bias_sn;
    for (int r = 0; r < rows; ++r)
        store_vec(acc[r], Cb + r * N, 1, cols, biasb + r * bias_sm, bias_sn, has_bias, Rb + r * N, has_res,
                  alpha, beta, act, p0, p1, p2);
}

/* Weight re-layout for conv_voc / deconv_voc: -> wr [G][ceil(OCg/VEC)][K][VEC] with
 * K = Cg*KH*KW, zero-padded past OCg, so that VEC output channels of one tap are one vector load.
 * Source: Conv2D weights [G*OCg][K] (``transposed`` = 0) or ConvTranspose2D weights
 * [G*Cg][OCg][KH*KW] (``transposed`` = 1, khw = KH*KW). */
__kernel void relayout_oc(__global const float* w, const int w_off, __global float* wr,
                          const int G, const int OCg, const int K, const int total,
                          const int transposed, const int khw)
{
    const int gid = get_global_id(0);
    if (gid >= total) return;
    const int e = gid % VEC;
    int t = gid / VEC;
    const int k = t % K; t /= K;
    const int OB = (OCg + VEC - 1) / VEC;
    const int ob = t % OB;
    const int g = t / OB;
    const int oc = ob * VEC + e;
    float v = 0.0f;
    if (oc < OCg) {
        if (transposed) {
            const int c = k / khw, r = k - c * khw;
            v = w[w_off + ((g * (K / khw) + c) * OCg + oc) * khw + r];
        } else {
            v = w[w_off + (g * OCg + oc) * K + k];
        }
    }
    wr[gid] = v;
}

/* Conv2D / ConvTranspose2D vectorised over VEC output channels (weights re-laid out by
 * relayout_oc): a work-item computes RB adjacent output pixels of one row (ox0.., oy) x VEC
 * channels; input pixels are scalar loads broadcast to the vector, weights one vector load per
 * tap. Global: (ceil(OW/RB), OH, N * G * ceil(OCg/VEC)). */
#define CONV_VOC_ARGS \
    __global const float* x, const int x_off, __global const float* wr, \
    __global const float* bias, const int bias_off, __global float* y, const int y_off, \
    const int C, const int H, const int W, const int OC, const int OH, const int OW, \
    const int G, const int KH, const int KW, const int SH, const int SW, \
    const int PH, const int PW, const int DH, const int DW, const int has_bias, \
    __global const float* res, const int res_off, const int has_res, \
    const int act, const float p0, const float p1, const float p2

#define CONV_VOC_PASS \
    x, x_off, wr, bias, bias_off, y, y_off, C, H, W, OC, OH, OW, G, KH, KW, SH, SW, \
    PH, PW, DH, DW, has_bias, res, res_off, has_res, act, p0, p1, p2

/* ``transposed`` is a literal in each kernel, so the compiler folds the tap-loop choice. */
inline void conv_voc_body(const int transposed, CONV_VOC_ARGS)
{
    const int ox0 = get_global_id(0) * RB, oy = get_global_id(1);
    if (ox0 >= OW || oy >= OH) return;
    const int cg = C / G, ocg = OC / G;
    const int OB = (ocg + VEC - 1) / VEC;
    int z = get_global_id(2);
    const int ob = z % OB; z /= OB;
    const int g = z % G;
    const int n = z / G;
    const int KT = cg * KH * KW;
    __global const float* xb = x + x_off + (n * C + g * cg) * H * W;
    __global const float* wb = wr + (g * OB + ob) * KT * VEC;

    VT acc[RB];
    for (int p = 0; p < RB; ++p) acc[p] = (VT)(0.0f);

    if (!transposed) {
        /* direct: out(oy, ox) sums x(oy*SH - PH + i*DH, ox*SW - PW + j*DW) * w(i, j) */
        const int iy0 = oy * SH - PH, ix0 = ox0 * SW - PW;
        const int interior = ix0 >= 0 && ix0 + (RB - 1) * SW + (KW - 1) * DW < W;
        for (int c = 0; c < cg; ++c) {
            __global const float* xc = xb + c * H * W;
            for (int i = 0; i < KH; ++i) {
                const int iy = iy0 + i * DH;
                if (iy < 0 || iy >= H) continue;
                __global const float* row = xc + iy * W + ix0;
                __global const float* wt = wb + ((c * KH + i) * KW) * VEC;
                if (interior) {
                    for (int j = 0; j < KW; ++j) {
                        const VT wv = VLOAD(j, wt);
                        for (int p = 0; p < RB; ++p) acc[p] = mad((VT)(row[p * SW + j * DW]), wv, acc[p]);
                    }
                } else {
                    for (int j = 0; j < KW; ++j) {
                        const VT wv = VLOAD(j, wt);
                        for (int p = 0; p < RB; ++p) {
                            const int ix = ix0 + p * SW + j * DW;
                            const float v = (ix >= 0 && ix < W) ? row[p * SW + j * DW] : 0.0f;
                            acc[p] = mad((VT)(v), wv, acc[p]);
                        }
                    }
                }
            }
        }
    } else {
        /* gather: out(oy, ox) sums x(iy, ix) * w(i, j) over the taps with oy = iy*SH - PH + i*DH
         * (and likewise for x) */
        for (int i = 0; i < KH; ++i) {
            const int ty = oy + PH - i * DH;
            if (ty < 0) continue;
            const int iy = ty / SH;
            if (iy * SH != ty || iy >= H) continue;
            for (int j = 0; j < KW; ++j) {
                int src[RB];   /* input column of each pixel for this tap, -1 when none */
                for (int p = 0; p < RB; ++p) {
                    const int tx = ox0 + p + PW - j * DW;
                    const int ix = tx >= 0 ? tx / SW : -1;
                    src[p] = (tx >= 0 && ix * SW == tx && ix < W) ? iy * W + ix : -1;
                }
                for (int c = 0; c < cg; ++c) {
                    const VT wv = VLOAD(0, wb + ((c * KH + i) * KW + j) * VEC);
                    __global const float* xc = xb + c * H * W;
                    for (int p = 0; p < RB; ++p)
                        if (src[p] >= 0) acc[p] = mad((VT)(xc[src[p]]), wv, acc[p]);
                }
            }
        }
    }

    const int oc0 = g * ocg + ob * VEC;
    const int chans = min(VEC, ocg - ob * VEC);
    const int yi = (n * OC + oc0) * OH * OW + oy * OW + ox0;
    for (int p = 0; p < RB; ++p) {
        if (ox0 + p >= OW) break;
        store_vec(acc[p], y + y_off + yi + p, OH * OW, chans, bias + bias_off + oc0, 1, has_bias,
                  res + res_off + yi + p, has_res, 1.0f, 1.0f, act, p0, p1, p2);
    }
}

__kernel void conv_voc(CONV_VOC_ARGS)
{
    conv_voc_body(0, CONV_VOC_PASS);
}

/* ConvTranspose2D (relayout_oc with transposed = 1). */
__kernel void deconv_voc(CONV_VOC_ARGS)
{
    conv_voc_body(1, CONV_VOC_PASS);
}

/* Depthwise Conv2D (groups == C == OC), vectorised along the output row: a work-item computes
 * VEC adjacent output pixels (ox0.., oy) of one plane; interior rows are vector loads (stride 1,
 * or two loads and an even-lane shuffle for stride 2), borders a checked per-lane gather.
 * Global: (ceil(OW/VEC), OH, N*C). */
__kernel void dw_vec(__global const float* x, const int x_off,
                     __global const float* w, const int w_off,
                     __global const float* bias, const int bias_off,
                     __global float* y, const int y_off,
                     const int C, const int H, const int W, const int OH, const int OW,
                     const int KH, const int KW, const int SH, const int SW,
                     const int PH, const int PW, const int DH, const int DW, const int has_bias,
                     __global const float* res, const int res_off, const int has_res,
                     const int act, const float p0, const float p1, const float p2)
{
    const int ox0 = get_global_id(0) * VEC, oy = get_global_id(1), pl = get_global_id(2);
    if (ox0 >= OW) return;
    const int c = pl % C;
    __global const float* xp = x + x_off + pl * H * W;
    __global const float* wc = w + w_off + c * KH * KW;
    const int iy0 = oy * SH - PH, ix0 = ox0 * SW - PW;
    const int interior = ix0 >= 0 && ix0 + (VEC - 1) * SW + (KW - 1) * DW + (SW == 2) < W;
    VT acc = (VT)(0.0f);
    for (int i = 0; i < KH; ++i) {
        const int iy = iy0 + i * DH;
        if (iy < 0 || iy >= H) continue;
        __global const float* row = xp + iy * W;
        for (int j = 0; j < KW; ++j) {
            VT xv;
            if (interior && SW == 1) {
                xv = VLOAD(0, row + ix0 + j * DW);
            } else if (interior && SW == 2) {
                const VT lo = VLOAD(0, row + ix0 + j * DW), hi = VLOAD(1, row + ix0 + j * DW);
                xv = (VT)(lo.even, hi.even);
            } else if (interior) {
                float tmp[VEC];
                for (int e = 0; e < VEC; ++e) tmp[e] = row[ix0 + e * SW + j * DW];
                xv = VLOAD(0, tmp);
            } else {
                float tmp[VEC];
                for (int e = 0; e < VEC; ++e) {
                    const int ix = ix0 + e * SW + j * DW;
                    tmp[e] = (ix >= 0 && ix < W) ? row[ix] : 0.0f;
                }
                xv = VLOAD(0, tmp);
            }
            acc = mad(xv, (VT)(wc[i * KW + j]), acc);
        }
    }
    const int yi = (pl * OH + oy) * OW + ox0;
    store_vec(acc, y + y_off + yi, 1, min(VEC, OW - ox0), bias + bias_off + c, 0, has_bias,
              res + res_off + yi, has_res, 1.0f, 1.0f, act, p0, p1, p2);
}
