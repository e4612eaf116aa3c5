// Tiled GEMM core shared by MatMul and the implicit-GEMM convolutions.
// A workgroup computes a TM x TN tile of C[z] = A[z] (M x K) * B[z] (K x N), staging TK-deep
// slices of A and B in shared memory; each invocation accumulates an RM x RN micro-tile whose
// rows/columns are strided by TM/RM and TN/RN (coalesced stores).
// The including kernel defines: GEMM_M, GEMM_N, GEMM_K (ints), GEMM_PREPARE(z) (a statement),
// LOAD_A(m, k), LOAD_B(k, n) (called for in-range indices only) and STORE_C(m, n, acc).
// -DKSPLIT (split K, where the tiles are too few for the device): the grid's z walks GEMM_KS
// slices of K per z, each GEMM_KSLICE deep; gemm_slice (set before GEMM_PREPARE) says which,
// and STORE_C writes that slice's raw sums (split_sum.comp adds them and applies the epilogue).
#ifndef TM
#define TM 64
#endif
#ifndef TN
#define TN 64
#endif
#ifndef RM
#define RM 4
#endif
#ifndef RN
#define RN 4
#endif
#ifndef TK
#define TK 16
#endif
#define TX (TN / RN)
#define TY (TM / RM)
#ifndef NT
#define NT 256  // the host passes the literal (TM/RM)*(TN/RN): GLSL 4.30 wants a literal here
#endif

#if NT != (TN / RN) * (TM / RM)
#error NT must equal (TM/RM)*(TN/RN)
#endif
layout(local_size_x = NT) in;
int gemm_slice = 0;  // the slice of K this workgroup sums (-DKSPLIT), else 0
shared float As[TK * TM];
shared float Bs[TK * TN];

void main() {
    int tid = int(gl_LocalInvocationID.x);
    int tx = tid % TX, ty = tid / TX;
    int m0 = int(gl_WorkGroupID.y) * TM;
    int n0 = int(gl_WorkGroupID.x) * TN;
#ifdef KSPLIT
    int z = int(gl_WorkGroupID.z) / GEMM_KS;
    gemm_slice = int(gl_WorkGroupID.z) - z * GEMM_KS;
    int k_begin = gemm_slice * GEMM_KSLICE;
    int K = min(GEMM_K, k_begin + GEMM_KSLICE);
#else
    int z = int(gl_WorkGroupID.z);
    int k_begin = 0;
    int K = GEMM_K;
#endif
    GEMM_PREPARE(z);
    int M = GEMM_M, N = GEMM_N;
    float acc[RM][RN];
    for (int i = 0; i < RM; ++i)
        for (int j = 0; j < RN; ++j) acc[i][j] = 0.0;
    for (int k0 = k_begin; k0 < K; k0 += TK) {
        for (int e = tid; e < TM * TK; e += NT) {
            int mm = e / TK, kk = e % TK;
            int m = m0 + mm, k = k0 + kk;
            As[kk * TM + mm] = (m < M && k < K) ? LOAD_A(m, k) : 0.0;
        }
        for (int e = tid; e < TK * TN; e += NT) {
            int kk = e / TN, nn = e % TN;
            int n = n0 + nn, k = k0 + kk;
            Bs[kk * TN + nn] = (n < N && k < K) ? LOAD_B(k, n) : 0.0;
        }
        memoryBarrierShared();
        barrier();
        for (int kk = 0; kk < TK; ++kk) {
            float a[RM];
            float b[RN];
            for (int i = 0; i < RM; ++i) a[i] = As[kk * TM + ty + i * TY];
            for (int j = 0; j < RN; ++j) b[j] = Bs[kk * TN + tx + j * TX];
            for (int i = 0; i < RM; ++i)
                for (int j = 0; j < RN; ++j) acc[i][j] += a[i] * b[j];
        }
        barrier();
    }
    for (int i = 0; i < RM; ++i) {
        int m = m0 + ty + i * TY;
        if (m >= M) continue;
        for (int j = 0; j < RN; ++j) {
            int n = n0 + tx + j * TX;
            if (n < N) STORE_C(m, n, acc[i][j]);
        }
    }
}
