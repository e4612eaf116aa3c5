// QuantizedMatMul (gpumnn.atomic): y[M][N] float32 = act(float(acc - zero[m] * colsum[n]) *
// (scale[m] * w_scale[n]) + bias[n]), acc the exact int32 sum of the uint8 rows q[m][k]
// (elements.glsl: IN_BYTES = 1) by the int8 weight. Binding 2 is one int32 constant the host
// packs: colsum [N], the column scales' bits [N], then the weight [K][N] 4 steps of k a word
// (word (k / 4) N + n, byte k % 4, low byte first). The row scales and zero points are
// quantize_rows.comp's (rows[2m], rows[2m + 1]), or with -DPREQUANTIZED one scale (binding 4)
// and one uint8 zero point (binding 5) for every row. -DQ_WORDS reads q (quantize_rows.comp's
// scratch, rows on whole words) as words of 4 bytes. -DTILED (the GPU family): TM rows x TN
// columns a workgroup, RM x RN an invocation, TK-deep int32 slices in shared memory; else (SIMD
// CPUs) RM rows x RN columns an invocation in registers, 4 steps of k per word loaded. The
// epilogue's products are rounded one at a time (precise), as the reference rounds them.
// Params: 0 M | 1 N | 2 K | 3 q_off (bytes) | 4 q row stride (bytes) | 5 packed off | 6 bias_off
//   7 rows/x_scale off | 8 x_zero off | 9 y_off | 10..12 activation params
#include "common.glsl"
#define ACT_P 10
#include "activation.glsl"
#include "elements.glsl"
BUFFER_WO(0, Y);
#ifdef Q_WORDS
BUFFER_RO_OF(uint, 1, QW);
#define Q_BYTE(i) bitfieldExtract(QW[(i) >> 2], ((i) & 3) * 8, 8)
#else
IN_BUFFER(1, Q);
#define Q_BYTE(i) IN_LOAD(Q, i)
#endif
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
            As[kk * TM + mm] = (m < M && k < K) ? int(Q_BYTE(PI(3) + m * PI(4) + k)) : 0;
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
// the 4 bytes of a q row from byte `row` at steps 4 s .. 4 s + 3 (0 past K) in one word, low byte first
uint q_word(int row, int s, int K) {
#ifdef Q_WORDS
    return QW[(row >> 2) + s];
#else
    uint word = 0u;
    for (int e = 0; e < 4; ++e)
        if (4 * s + e < K) word |= Q_BYTE(row + 4 * s + e) << (8 * e);
    return word;
#endif
}

layout(local_size_x = WG) in;
void main() {
    int M = PI(0), N = PI(1), K = PI(2);
    int blocks = (N + RN - 1) / RN, t = GLOBAL_ID();
    int n0 = (t % blocks) * RN, m0 = (t / blocks) * RM;
    if (m0 >= M) return;
    int acc[RM][RN];
    UNROLL for (int i = 0; i < RM; ++i)
        UNROLL for (int j = 0; j < RN; ++j) acc[i][j] = 0;
    int rows[RM];  // each row's first byte, the parameters read once
    UNROLL for (int i = 0; i < RM; ++i) rows[i] = PI(3) + min(m0 + i, M - 1) * PI(4);
    int wb = PI(5) + 2 * N + n0, rows_here = min(RM, M - m0), columns_here = min(RN, N - n0);
    for (int s = 0; s < (K + 3) / 4; ++s) {
        uint a[RM];
        int b[RN];
        UNROLL for (int i = 0; i < RM; ++i) a[i] = i < rows_here ? q_word(rows[i], s, K) : 0u;
        UNROLL for (int j = 0; j < RN; ++j) b[j] = j < columns_here ? Packed[wb + s * N + j] : 0;
        UNROLL for (int e = 0; e < 4; ++e) {
            int bv[RN];
            UNROLL for (int j = 0; j < RN; ++j) bv[j] = bitfieldExtract(b[j], 8 * e, 8);
            UNROLL for (int i = 0; i < RM; ++i) {
                int av = int(bitfieldExtract(a[i], 8 * e, 8));
                UNROLL for (int j = 0; j < RN; ++j) acc[i][j] += av * bv[j];
            }
        }
    }
    for (int i = 0; i < RM && m0 + i < M; ++i)
        for (int j = 0; j < RN; ++j)
            if (n0 + j < N) store(m0 + i, n0 + j, acc[i][j]);
}
#endif
