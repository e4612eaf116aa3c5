// QuantizedMatMul's run-time row quantization (gpumnn.atomic): row m of x [M][K], one workgroup of
// WG invocations per row, to uint8 into q as words of 4 bytes (low byte first, PI(2) words a row,
// the bytes past K zero), with rows[2m] = scale and rows[2m + 1] = zero point: the contract's
// float32 arithmetic, min and max reduced in shared memory, roundEven rounding half to even.
// Params: 0 M | 1 K | 2 words per row | 3 x_off | 4 q_off (words) | 5 rows_off
#include "common.glsl"
#include "rounding.glsl"
BUFFER_WO_OF(uint, 0, Q);
BUFFER_WO(1, rows);
BUFFER_RO(2, X);

layout(local_size_x = WG) in;
shared float lows[WG];
shared float highs[WG];

void main() {
    int m = GROUP_ID(), lid = int(gl_LocalInvocationID.x);
    if (m >= PI(0)) return;  // the whole workgroup
    int K = PI(1), x0 = PI(3) + m * K;
    float lo = 0.0, hi = 0.0;
    for (int k = lid; k < K; k += WG) {
        lo = min(lo, X[x0 + k]);
        hi = max(hi, X[x0 + k]);
    }
    lows[lid] = lo;
    highs[lid] = hi;
    memoryBarrierShared();
    barrier();
    for (int s = WG / 2; s > 0; s >>= 1) {
        if (lid < s) {
            lows[lid] = min(lows[lid], lows[lid + s]);
            highs[lid] = max(highs[lid], highs[lid + s]);
        }
        memoryBarrierShared();
        barrier();
    }
    precise float scale = quotient_rn(highs[0] - lows[0], 255.0);
    if (scale == 0.0) scale = 1.0;
    float zero = clamp(roundEven(quotient_rn(-lows[0], scale)), 0.0, 255.0);
    if (lid == 0) {
        rows[PI(5) + 2 * m] = scale;
        rows[PI(5) + 2 * m + 1] = zero;
    }
    int words = PI(2), q0 = PI(4) + m * words;
    for (int w = lid; w < words; w += WG) {
        uint word = 0u;
        for (int i = 0; i < 4; ++i) {
            int k = 4 * w + i;
            if (k < K) word |= uint(clamp(roundEven(quotient_rn(X[x0 + k], scale)) + zero, 0.0, 255.0)) << (8 * i);
        }
        Q[q0 + w] = word;
    }
}
