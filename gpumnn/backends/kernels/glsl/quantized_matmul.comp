// QuantizedMatMul (gpumnn.atomic): y[M][N] float32 = act(float(acc - zero[m] * colsum[n]) *
// (scale[m] * w_scale[n]) + bias[n]), acc the exact int32 sum of the uint8 rows q[m][k]
// (elements.glsl: IN_BYTES = 1) by the int8 weight. Binding 2 is one int32 constant the host
// packs: colsum [N], the column scales' bits [N], then the weight [K][N] 4 steps of k a word
// (word (k / 4) N + n, byte k % 4, low byte first). The row scales and zero points are
// quantize_rows.comp's (rows[2m], rows[2m + 1]), or with -DPREQUANTIZED one scale (binding 4)
// and one uint8 zero point (binding 5) for every row. -DTILED (the GPU family): TM rows x TN
// columns a workgroup, RM x RN an invocation, TK-deep int32 slices in shared memory; else an
// invocation per output. The epilogue's products are rounded one at a time (precise), as the
// reference rounds them.
// Params: 0 M | 1 N | 2 K | 3 q_off | 4 q row stride | 5 packed off | 6 bias_off | 7 rows/x_scale off
//   8 x_zero off | 9 y_off | 10..12 activation params
#include "common.glsl"
#define ACT_P 10
#include "activation.glsl"
#include "elements.glsl"
BUFFER_WO(0, Y);
IN_BUFFER(1, Q);
BUFFER_RO_OF(int, 2, Packed);
BUFFER_RO(3, bias);
BUFFER_RO(4, rows);
IN_BUFFER(5, XZero);

int weight(int k, int n) {
    return bitfieldExtract(Packed[PI(5) + 2 * PI(1) + (k >> 2) * PI(1) + n], (k & 3) * 8, 8);
}

void store(int m, int n, int acc) {
#ifdef PREQUANTIZED
    float scale = rows[PI(7)];
    int zero = int(IN_LOAD(XZero, PI(8)));
#else
    float scale = rows[PI(7) + 2 * m];
    int zero = int(rows[PI(7) + 2 * m + 1]);
#endif
    precise float s = scale * intBitsToFloat(Packed[PI(5) + PI(1) + n]);
    precise float v = float(acc - zero * Packed[PI(5) + n]) * s;
#ifdef HAS_BIAS
    v = v + bias[PI(6) + n];
#endif
    Y[PI(9) + m * PI(1) + n] = EPILOGUE(v);
}

#ifdef TILED
#define TX (TN / RN)
#define TY (TM / RM)
#if NT != (TN / RN) * (TM / RM)
#error NT must equal (TM/RM)*(TN/RN)
#endif
layout(local_size_x = NT) in;
shared int As[TK * TM];
shared int Bs[TK * TN];
void main() {
    int tid = int(gl_LocalInvocationID.x);
    int tx = tid % TX, ty = tid / TX;
    int n0 = int(gl_WorkGroupID.x) * TN, m0 = int(gl_WorkGroupID.y) * TM;
    int M = PI(0), N = PI(1), K = PI(2);
    int acc[RM][RN];
    for (int i = 0; i < RM; ++i)
        for (int j = 0; j < RN; ++j) acc[i][j] = 0;
    for (int k0 = 0; k0 < K; k0 += TK) {
        for (int e = tid; e < TM * TK; e += NT) {
            int mm = e / TK, kk = e - mm * TK;
            int m = m0 + mm, k = k0 + kk;
            As[kk * TM + mm] = (m < M && k < K) ? int(IN_LOAD(Q, PI(3) + m * PI(4) + k)) : 0;
        }
        for (int e = tid; e < TN * TK; e += NT) {
            int kk = e / TN, nn = e - kk * TN;
            int n = n0 + nn, k = k0 + kk;
            Bs[kk * TN + nn] = (n < N && k < K) ? weight(k, n) : 0;
        }
        memoryBarrierShared();
        barrier();
        for (int kk = 0; kk < TK; ++kk) {
            int a[RM];
            int b[RN];
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
            if (n < N) store(m, n, acc[i][j]);
        }
    }
}
#else
layout(local_size_x = WG) in;
void main() {
    int i = GLOBAL_ID();
    int N = PI(1), K = PI(2);
    if (i >= PI(0) * N) return;
    int m = i / N, n = i - m * N;
    int row = PI(3) + m * PI(4);
    int acc = 0;
    for (int k = 0; k < K; ++k) acc += int(IN_LOAD(Q, row + k)) * weight(k, n);
    store(m, n, acc);
}
#endif
