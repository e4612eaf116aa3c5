// Winograd F(NH x NW, KH x KW) convolution in one kernel (GPUs): a workgroup computes TM output
// channels x TN output tiles at every position of the AH x AW transformed tile. Per TK input
// channels it transforms its input tiles into shared memory (V = B_h^T d B_w), stages the
// transformed weights U [P][OC][C] (P = AH * AW, packed once on the host), and accumulates
// acc[P][RM][RN] per invocation; then the output transform (A_h^T m A_w), the bias, the residual
// and the activation end the kernel. The tiles' products never leave the workgroup.
// The weights buffer (binding 2) starts with the matrices, each row-major as
// numerics.winograd builds them: B_h [AH][AH], B_w [AW][AW], A_h [AH][NH], A_w [AW][NW].
// -DHAS_BIAS, -DHAS_RESIDUAL (binding 4, element offset param 25), -DACT=<unary id>.
// Params: 0 OC | 1 C | 2 H | 3 W | 4 OH | 5 OW | 6 TH | 7 TW | 8 T = N*TH*TW | 9 PT | 10 PL
//   11 x_off | 12 weights' offset (the matrices, then U) | 13 b_off | 14 out_off | 22..24 activation
// Compile-time AH, AW, NH, NW, TM, TN, RM, RN, TK, NT = (TM/RM)*(TN/RN).
#include "common.glsl"
#define ACT_P 22
#include "activation.glsl"
BUFFER_WO(0, dst);
BUFFER_RO(1, X);
BUFFER_RO(2, Wt);
BUFFER_RO(3, bias);
#ifdef HAS_RESIDUAL
BUFFER_RO(4, res);
#define ADD_RESIDUAL(v, i) ((v) + res[PI(25) + (i)])
#else
#define ADD_RESIDUAL(v, i) (v)
#endif

#define P (AH * AW)
#define TX (TN / RN)
#define TY (TM / RM)
#define MATS (AH * AH + AW * AW + AH * NH + AW * NW)
#if NT != (TN / RN) * (TM / RM)
#error NT must equal (TM/RM)*(TN/RN)
#endif
layout(local_size_x = NT) in;
shared float mats[MATS];
shared float Us[P * TK * TM];  // [p][kk][mm]
shared float Vs[P * TK * TN];  // [p][kk][nn]
#define B_H(i, a) mats[(i) * AH + (a)]
#define B_W(j, b) mats[AH * AH + (j) * AW + (b)]
#define A_H(a, r) mats[AH * AH + AW * AW + (a) * NH + (r)]
#define A_W(b, s) mats[AH * AH + AW * AW + AH * NH + (b) * NW + (s)]

// V[p][kk][nn] of input channel c and tile t (zero outside the input and past C or T).
void transform_input(int c, int t, int kk, int nn) {
    float d[AH][AW];
    int C = PI(1), H = PI(2), W = PI(3), TW = PI(7);
    bool live = c < C && t < PI(8);
    int tx = t % TW, rest = t / TW;
    int ty = rest % PI(6), n = rest / PI(6);
    int y0 = ty * NH - PI(9), x0 = tx * NW - PI(10);
    int plane = PI(11) + (n * C + c) * H * W;
    UNROLL for (int i = 0; i < AH; ++i) {
        int iy = y0 + i;
        UNROLL for (int j = 0; j < AW; ++j) {
            int ix = x0 + j;
            d[i][j] = (live && iy >= 0 && iy < H && ix >= 0 && ix < W) ? X[plane + iy * W + ix] : 0.0;
        }
    }
    UNROLL for (int a = 0; a < AH; ++a) {
        float row[AW];  // (B_h^T d)[a]
        UNROLL for (int j = 0; j < AW; ++j) {
            float s = 0.0;
            UNROLL for (int i = 0; i < AH; ++i) s += B_H(i, a) * d[i][j];
            row[j] = s;
        }
        UNROLL for (int b = 0; b < AW; ++b) {
            float s = 0.0;
            UNROLL for (int j = 0; j < AW; ++j) s += row[j] * B_W(j, b);
            Vs[((a * AW + b) * TK + kk) * TN + nn] = s;
        }
    }
}

void main() {
    int tid = int(gl_LocalInvocationID.x);
    int tx = tid % TX, ty = tid / TX;
    int m0 = int(gl_WorkGroupID.y) * TM, n0 = int(gl_WorkGroupID.x) * TN;
    int OC = PI(0), C = PI(1), T = PI(8);
    int u0 = PI(12) + MATS;
    for (int e = tid; e < MATS; e += NT) mats[e] = Wt[PI(12) + e];
    float acc[P][RM][RN];
    UNROLL for (int p = 0; p < P; ++p)
        UNROLL for (int i = 0; i < RM; ++i)
            UNROLL for (int j = 0; j < RN; ++j) acc[p][i][j] = 0.0;
    memoryBarrierShared();
    barrier();
    for (int k0 = 0; k0 < C; k0 += TK) {
        for (int e = tid; e < P * TK * TM; e += NT) {
            int mm = e % TM, kk = (e / TM) % TK, p = e / (TM * TK);
            int m = m0 + mm, k = k0 + kk;
            Us[e] = (m < OC && k < C) ? Wt[u0 + (p * OC + m) * C + k] : 0.0;
        }
        for (int e = tid; e < TK * TN; e += NT) transform_input(k0 + e / TN, n0 + e % TN, e / TN, e % TN);
        memoryBarrierShared();
        barrier();
        for (int kk = 0; kk < TK; ++kk) {
            UNROLL for (int p = 0; p < P; ++p) {
                float a[RM];
                float b[RN];
                UNROLL for (int i = 0; i < RM; ++i) a[i] = Us[(p * TK + kk) * TM + ty + i * TY];
                UNROLL for (int j = 0; j < RN; ++j) b[j] = Vs[(p * TK + kk) * TN + tx + j * TX];
                UNROLL for (int i = 0; i < RM; ++i)
                    UNROLL for (int j = 0; j < RN; ++j) acc[p][i][j] += a[i] * b[j];
            }
        }
        barrier();
    }
    int OH = PI(4), OW = PI(5), TW = PI(7);
    UNROLL for (int i = 0; i < RM; ++i) {
        int oc = m0 + ty + i * TY;
        if (oc >= OC) continue;
        float bv = 0.0;
#ifdef HAS_BIAS
        bv = bias[PI(13) + oc];
#endif
        UNROLL for (int j = 0; j < RN; ++j) {
            int t = n0 + tx + j * TX;
            if (t >= T) continue;
            int twx = t % TW, rest = t / TW;
            int twy = rest % PI(6), n = rest / PI(6);
            int base = (n * OC + oc) * OH * OW;
            UNROLL for (int r = 0; r < NH; ++r) {
                int oy = twy * NH + r;
                if (oy >= OH) continue;
                float row[AW];  // (A_h^T m)[r]
                UNROLL for (int b = 0; b < AW; ++b) {
                    float s = 0.0;
                    UNROLL for (int a = 0; a < AH; ++a) s += A_H(a, r) * acc[a * AW + b][i][j];
                    row[b] = s;
                }
                UNROLL for (int s = 0; s < NW; ++s) {
                    int ox = twx * NW + s;
                    if (ox >= OW) continue;
                    float v = bv;
                    UNROLL for (int b = 0; b < AW; ++b) v += row[b] * A_W(b, s);
                    int e = base + oy * OW + ox;
                    dst[PI(14) + e] = EPILOGUE(ADD_RESIDUAL(v, e));
                }
            }
        }
    }
}
