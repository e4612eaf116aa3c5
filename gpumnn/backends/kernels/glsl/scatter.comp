// Scatter (ScatterND / ScatterElements), the second of two dispatches (the first copies data to
// out): row index[j] of out [rows, inner] (negative counted from the end, out of range clamped)
// becomes updates[j] (-DREDUCTION=0, elements of any storage dtype: elements.glsl) or is
// combined with it (1 add, 2 mul, 3 max, 4 min) by a compare-and-swap loop, so repeated rows
// combine correctly; -DIN_INT: the elements are int32 (else float32).
// params: 0 count*inner | 1 rows | 2 inner | 3 out_off | 4 index_off | 5 updates_off
#include "common.glsl"
#include "elements.glsl"
layout(local_size_x = WG) in;
OUT_BUFFER_RW(0, dst);
BUFFER_RO_OF(int, 1, index);
IN_BUFFER(2, updates);

#if REDUCTION
#ifdef IN_INT
#define T int
#define FROM_BITS(u) int(u)
#define TO_BITS(v) uint(v)
#define IS_NAN(v) false
#else
#define T float
#define FROM_BITS(u) uintBitsToFloat(u)
#define TO_BITS(v) floatBitsToUint(v)
#define IS_NAN(v) isnan(v)
#endif

T combine(T a, T b) {
#if REDUCTION == 1
    return a + b;
#elif REDUCTION == 2
    return a * b;
#elif REDUCTION == 3
    return (a > b || IS_NAN(a)) ? a : b;  // a NaN wins, as np.maximum
#else
    return (a < b || IS_NAN(a)) ? a : b;
#endif
}
#endif

void main() {
    int i = GLOBAL_ID();
    if (i >= PI(0)) return;
    int rows = PI(1), inner = PI(2);
    int j = i / inner, e = i % inner;
    int row = index[PI(4) + j];
    if (row < 0) row += rows;
    int at = PI(3) + clamp(row, 0, rows - 1) * inner + e;
    uint u = IN_LOAD(updates, PI(5) + i);
#if REDUCTION
    uint old = dst[at];
    for (;;) {
        uint seen = atomicCompSwap(dst[at], old, TO_BITS(combine(FROM_BITS(old), FROM_BITS(u))));
        if (seen == old) break;
        old = seen;
    }
#else
    OUT_STORE(dst, at, u);
#endif
}
