// MatMul: out[z] = act(alpha * A[z] @ B[z] + beta * bias); -DHAS_BIAS, -DACT=<unary id>.
// Default: shared-memory tiles (gemm_core.glsl, GPUs; float16 tensors with -DHALF, common.glsl; -DCOOPMAT:
// on Vulkan's cooperative matrices, gemm_coopmat.glsl). -DREGBLOCK: for SIMD CPUs (lavapipe): an
// invocation accumulates RM rows x RN consecutive columns in registers; -DB_VEC4 reads B as vec4
// (row-major B with N, the batch stride and the offset multiples of 4).
// A element (m, k) at a_off + z*a_bs + m*sam + k*sak (transposition is in the strides), B alike.
// params: 0 M | 1 N | 2 K | 4 a_off | 5 b_off | 6 bias_off | 7 out_off | 8 a_bs | 9 b_bs
//         10 sam | 11 sak | 12 sbk | 13 sbn | 14 alpha | 15 beta | 16 bias_sm | 17 bias_sn
//         18..20 activation params | 21 K slices | 22 slice depth (-DKSPLIT)
// -DKSPLIT (tiled only): slice s of K writes its raw sums to C from element c_off + s * batch*M*N
// (a scratch [slices][batch][M][N]); split_sum.comp ends the product with alpha, bias, activation.
#include "common.glsl"
#define ACT_P 18
#include "activation.glsl"
BUFFER_WO_F(0, C);
BUFFER_RO_F(1, A);
BUFFER_RO_F(2, B);
BUFFER_RO_F(3, bias);

#ifdef REGBLOCK
#ifdef B_VEC4
BUFFER_RO_VEC4(2, B4);
#endif
layout(local_size_x = WG) in;
#define RN4 (RN / 4)
void main() {
    int M = PI(0), N = PI(1), K = PI(2);
    int t = int(gl_WorkGroupID.x) * WG + int(gl_LocalInvocationID.x);
    int n0 = t * RN;
    int m0 = int(gl_WorkGroupID.y) * RM;
    int z = int(gl_WorkGroupID.z);
    int a_base = PI(4) + z * PI(8) + m0 * PI(10);
    int b_base = PI(5) + z * PI(9);
    int mrows = min(RM, M - m0);
    vec4 acc[RM][RN4];
    for (int i = 0; i < RM; ++i)
        for (int j = 0; j < RN4; ++j) acc[i][j] = vec4(0.0);
    if (n0 < N) {
        for (int k = 0; k < K; ++k) {
            vec4 b[RN4];
#ifdef B_VEC4
            int bi = (b_base + k * PI(12) + n0) / 4;
            for (int j = 0; j < RN4; ++j) b[j] = n0 + 4 * j < N ? B4[bi + j] : vec4(0.0);
#else
            for (int j = 0; j < RN4; ++j)
                for (int q = 0; q < 4; ++q) {
                    int n = n0 + 4 * j + q;
                    b[j][q] = n < N ? B[b_base + k * PI(12) + n * PI(13)] : 0.0;
                }
#endif
            int ai = a_base + k * PI(11);
            for (int i = 0; i < RM; ++i) {
                float a = i < mrows ? A[ai + i * PI(10)] : 0.0;
                for (int j = 0; j < RN4; ++j) acc[i][j] += a * b[j];
            }
        }
    }
    int c_base = PI(7) + z * M * N;
    for (int i = 0; i < mrows; ++i) {
        int m = m0 + i;
        for (int j = 0; j < RN4; ++j)
            for (int q = 0; q < 4; ++q) {
                int n = n0 + 4 * j + q;
                if (n >= N) continue;
                float v = PF(14) * acc[i][j][q];
#ifdef HAS_BIAS
                v += PF(15) * bias[PI(6) + m * PI(16) + n * PI(17)];
#endif
                C[c_base + m * N + n] = EPILOGUE(v);
            }
    }
}
#else
int a_base, b_base, c_base;
#define GEMM_M PI(0)
#define GEMM_N PI(1)
#define GEMM_K PI(2)
#define GEMM_KS PI(21)
#define GEMM_KSLICE PI(22)
#define GEMM_PREPARE(z) a_base = PI(4) + (z) * PI(8); b_base = PI(5) + (z) * PI(9); c_base = PI(7) + ((z) + gemm_slice * PI(3)) * PI(0) * PI(1)
#define LOAD_A(m, k) LOADF(A, a_base + (m) * PI(10) + (k) * PI(11))
#define LOAD_B(k, n) LOADF(B, b_base + (k) * PI(12) + (n) * PI(13))

void store_c(int m, int n, float acc) {
#ifdef KSPLIT
    C[c_base + m * PI(1) + n] = acc;
#else
    float v = PF(14) * acc;
#ifdef HAS_BIAS
    v += PF(15) * LOADF(bias, PI(6) + m * PI(16) + n * PI(17));
#endif
    STOREF(C, c_base + m * PI(1) + n, EPILOGUE(v));
#endif
}
#define STORE_C(m, n, acc) store_c(m, n, acc)

#ifdef COOPMAT
#include "gemm_coopmat.glsl"
#else
#include "gemm_core.glsl"
#endif
#endif
