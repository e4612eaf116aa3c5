// Tiled GEMM on cooperative matrices (Vulkan, GL_KHR_cooperative_matrix), in place of gemm_core.glsl
// where the planner picks it (gpumnn/backends/kernels/glsl/coopmat.py): the same contract with the
// including kernel (GEMM_M, GEMM_N, GEMM_K, GEMM_PREPARE(z), LOAD_A, LOAD_B, STORE_C; -DKSPLIT with
// GEMM_KS and GEMM_KSLICE), so MatMul and the implicit-GEMM convolutions keep their loads and epilogues.
// A workgroup of SGM x SGN subgroups computes a TM x TN tile of C[z]. Each pass stages a TK-deep slice
// of A (row-major [TM][AS]) and B (row-major [TK][BS]) in shared memory as CM_T (float16_t, or float
// with -DCM_FLOAT32), zero outside the matrices; subgroup sg owns FM x FN accumulators of CM_M x CM_N
// from row cm_subgroup_row(sg), column cm_subgroup_col(sg) of the tile, and each K step of CM_K is one
// coopMatMulAdd per accumulator (float32 sums). The epilogue stores each accumulator into the subgroup's
// own CM_M x CS float slice of shared memory, from which its invocations pass the elements inside C to
// STORE_C (alpha, bias, residual, activation, the float16 rounding). All index arithmetic is in the
// one-line cm_* functions, which tests/test_vulkan_cooperative_matrix.py evaluates in its CPU model.
// Defines: CM_M, CM_N, CM_K (the device's product), SGM, SGN, TM, TN, TK, NT (SGM * SGN * subgroup size).
#ifndef API_VULKAN
#error gemm_coopmat.glsl needs Vulkan (GL_KHR_cooperative_matrix)
#endif
#ifdef CM_FLOAT32
#define CM_T float
#define CM_PAD 4
#else
#define CM_T float16_t
#define CM_PAD 8
#endif
#define FM (TM / (SGM * CM_M))
#define FN (TN / (SGN * CM_N))
#define AS (TK + CM_PAD)
#define BS (TN + CM_PAD)
#define CS (CM_N + 4)
#if FM * SGM * CM_M != TM || FN * SGN * CM_N != TN || TK % CM_K != 0
#error the tile must hold whole fragments
#endif
layout(local_size_x = NT) in;
int gemm_slice = 0;  // the slice of K this workgroup sums (-DKSPLIT), else 0
shared CM_T As[TM * AS];
shared CM_T Bs[TK * BS];
shared float Cs[SGM * SGN * CM_M * CS];

// staging: element e of a pass's A slice is (row, k), of its B slice (k, column)
int cm_a_row(int e) { return e / TK; }
int cm_a_k(int e) { return e % TK; }
int cm_b_k(int e) { return e / TN; }
int cm_b_col(int e) { return e % TN; }
int cm_a_slot(int mm, int kk) { return mm * AS + kk; }
int cm_b_slot(int kk, int nn) { return kk * BS + nn; }
// the subgroup's first row and column in the tile, its fragments' first elements in As and Bs
int cm_subgroup_row(int sg) { return (sg % SGM) * FM * CM_M; }
int cm_subgroup_col(int sg) { return (sg / SGM) * FN * CM_N; }
int cm_a_fragment(int wr, int i, int kk) { return cm_a_slot(wr + i * CM_M, kk); }
int cm_b_fragment(int wc, int j, int kk) { return cm_b_slot(kk, wc + j * CM_N); }
// the epilogue: the subgroup's slice of Cs, and element e of an accumulator as (row, column)
int cm_c_slice(int sg) { return sg * CM_M * CS; }
int cm_c_row(int e) { return e / CM_N; }
int cm_c_col(int e) { return e % CM_N; }

#define CM_A coopmat<CM_T, gl_ScopeSubgroup, CM_M, CM_K, gl_MatrixUseA>
#define CM_B coopmat<CM_T, gl_ScopeSubgroup, CM_K, CM_N, gl_MatrixUseB>
#define CM_ACC coopmat<float, gl_ScopeSubgroup, CM_M, CM_N, gl_MatrixUseAccumulator>

void main() {
    int tid = int(gl_LocalInvocationID.x);
    int sg = int(gl_SubgroupID);
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
    int wr = cm_subgroup_row(sg), wc = cm_subgroup_col(sg);
    CM_ACC acc[FM * FN];
    UNROLL for (int f = 0; f < FM * FN; ++f) acc[f] = CM_ACC(0.0);
    for (int k0 = k_begin; k0 < K; k0 += TK) {
        for (int e = tid; e < TM * TK; e += NT) {
            int mm = cm_a_row(e), kk = cm_a_k(e);
            int m = m0 + mm, k = k0 + kk;
            As[cm_a_slot(mm, kk)] = CM_T((m < M && k < K) ? LOAD_A(m, k) : 0.0);
        }
        for (int e = tid; e < TK * TN; e += NT) {
            int kk = cm_b_k(e), nn = cm_b_col(e);
            int n = n0 + nn, k = k0 + kk;
            Bs[cm_b_slot(kk, nn)] = CM_T((n < N && k < K) ? LOAD_B(k, n) : 0.0);
        }
        memoryBarrierShared();
        barrier();
        UNROLL for (int kk = 0; kk < TK; kk += CM_K) {
            CM_A a[FM];
            UNROLL for (int i = 0; i < FM; ++i)
                coopMatLoad(a[i], As, uint(cm_a_fragment(wr, i, kk)), uint(AS), gl_CooperativeMatrixLayoutRowMajor);
            UNROLL for (int j = 0; j < FN; ++j) {
                CM_B b;
                coopMatLoad(b, Bs, uint(cm_b_fragment(wc, j, kk)), uint(BS), gl_CooperativeMatrixLayoutRowMajor);
                UNROLL for (int i = 0; i < FM; ++i) acc[i * FN + j] = coopMatMulAdd(a[i], b, acc[i * FN + j]);
            }
        }
        barrier();
    }
    int lane = int(gl_SubgroupInvocationID), lanes = int(gl_SubgroupSize);
    int slice = cm_c_slice(sg);
    UNROLL for (int i = 0; i < FM; ++i) {
        UNROLL for (int j = 0; j < FN; ++j) {
            coopMatStore(acc[i * FN + j], Cs, uint(slice), uint(CS), gl_CooperativeMatrixLayoutRowMajor);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            for (int e = lane; e < CM_M * CM_N; e += lanes) {
                int m = m0 + wr + i * CM_M + cm_c_row(e), n = n0 + wc + j * CM_N + cm_c_col(e);
                if (m < M && n < N) STORE_C(m, n, Cs[slice + cm_c_row(e) * CS + cm_c_col(e)]);
            }
            subgroupBarrier();  // every lane has read the slice before the next accumulator overwrites it
        }
    }
}
