// The end of a split-K GEMM (matmul.comp and conv2d.comp -DKSPLIT): output element e of
// [batch][M][N] is the sum of the KS slices' partial sums P[p_off + s * total + e], then
// alpha * sum + beta * bias(m, n), plus the residual (laid out as the output), then the
// activation: the epilogue the GEMM kernel applies when K is not split, in the same order.
// -DHAS_BIAS, -DHAS_RESIDUAL, -DACT=<unary id>.
// params: 0 total | 1 KS | 2 M | 3 N | 4 p_off | 5 out_off | 6 bias_off | 7 bias_sm | 8 bias_sn
//         9 res_off | 10 alpha | 11 beta | 12..14 activation params
#include "common.glsl"
#define ACT_P 12
#include "activation.glsl"
BUFFER_WO(0, C);
BUFFER_RO(1, P);
BUFFER_RO(2, bias);
BUFFER_RO(3, res);

layout(local_size_x = WG) in;
void main() {
    int e = GLOBAL_ID();
    int total = PI(0);
    if (e >= total) return;
    float sum = 0.0;
    for (int s = 0; s < PI(1); ++s) sum += P[PI(4) + s * total + e];
    float v = PF(10) * sum;
#ifdef HAS_BIAS
    int mn = e % (PI(2) * PI(3));
    int m = mn / PI(3), n = mn - m * PI(3);
    v += PF(11) * bias[PI(6) + m * PI(7) + n * PI(8)];
#endif
#ifdef HAS_RESIDUAL
    v += res[PI(9) + e];
#endif
    C[PI(5) + e] = EPILOGUE(v);
}
