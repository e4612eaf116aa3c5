// Matrix-vector product: the MatMuls with one row (M = 1), a batch-1 classifier or a decoder step.
// Y[z][n] = act(alpha * sum_k X[z][k] * B[z](k, n) + beta * bias(n)); -DHAS_BIAS, -DACT=<unary id>.
// The tiled GEMM gives such a product one row of tiles, mostly zeros; here a workgroup of KL x NL
// invocations owns NL output columns and walks K in KL lanes, then sums its lanes in shared
// memory. -DKFAST=1 puts the KL lanes side by side where B is contiguous along k (a transposed
// weight), 0 the NL columns where it is contiguous along n: each load of B is coalesced.
// B element (k, n) at b_off + z*b_bs + k*bsk + n*bsn; X element k at x_off + z*x_bs + k.
// params: 0 N | 1 K | 2 x_off | 3 b_off | 4 bias_off | 5 y_off | 6 x_bs | 7 b_bs | 8 bsk | 9 bsn
//         10 bias_sn | 11 alpha | 12 beta | 13..15 activation params
#ifndef KL
#define KL 32
#endif
#ifndef NL
#define NL 8
#endif
#ifndef KFAST
#define KFAST 1
#endif
#include "common.glsl"
#define ACT_P 13
#include "activation.glsl"
BUFFER_WO(0, Y);
BUFFER_RO(1, X);
BUFFER_RO(2, B);
BUFFER_RO(3, bias);

layout(local_size_x = WG) in;  // WG = KL * NL (GLSL 4.30 takes no expression here)
shared float lanes[WG];

void main() {
    int N = PI(0), K = PI(1);
    int lid = int(gl_LocalInvocationID.x);
#if KFAST
    int kl = lid % KL, nl = lid / KL;
#else
    int nl = lid % NL, kl = lid / NL;
#endif
    int n = int(gl_WorkGroupID.x) * NL + nl;
    int z = int(gl_WorkGroupID.z);
    int x_base = PI(2) + z * PI(6);
    int b_base = PI(3) + z * PI(7) + n * PI(9);
    float acc = 0.0;
    if (n < N)
        for (int k = kl; k < K; k += KL) acc += X[x_base + k] * B[b_base + k * PI(8)];
    lanes[kl * NL + nl] = acc;
    memoryBarrierShared(); barrier();
    for (int s = KL / 2; s > 0; s >>= 1) {  // KL is a power of two
        if (kl < s) lanes[kl * NL + nl] += lanes[(kl + s) * NL + nl];
        memoryBarrierShared(); barrier();
    }
    if (kl != 0 || n >= N) return;
    float v = PF(11) * lanes[nl];
#ifdef HAS_BIAS
    v += PF(12) * bias[PI(4) + n * PI(10)];
#endif
    Y[PI(5) + z * N + n] = EPILOGUE(v);
}
