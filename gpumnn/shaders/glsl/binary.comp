// Binary: out[i] = act(op(a[i . a_strides], b[i . b_strides])) over a RANK-4 shape.
// -DOP=<binary id> (order of gpumnn.atomic.BINARY_OPS), optional -DACT=<unary id>.
// -DNDIM=1..4 as in raster.comp.
// params: 0 total | 1..3 shape[1..3] | 4 a_off | 5..8 a_strides | 9 b_off | 10..13 b_strides
//         14 out_off | 15..17 activation params
#include "common.glsl"
#define ACT_P 15
#include "activation.glsl"
layout(local_size_x = WG) in;
BUFFER_WO(0, dst);
BUFFER_RO(1, A);
BUFFER_RO(2, B);

#define B_ADD 0
#define B_SUB 1
#define B_MUL 2
#define B_DIV 3
#define B_POW 4
#define B_MAX 5
#define B_MIN 6
#define B_PRELU 7
#define B_MOD 8
#define B_FMOD 9
#define B_EQUAL 10
#define B_LESS 11
#define B_LESS_EQUAL 12
#define B_GREATER 13
#define B_GREATER_EQUAL 14
#define B_AND 15
#define B_OR 16
#define B_XOR 17

void main() {
    int i = GLOBAL_ID();
    if (i >= PI(0)) return;
    INDEX4(i, i0, i1, i2, i3);
    float a = A[PI(4) + i0 * PI(5) + i1 * PI(6) + i2 * PI(7) + i3 * PI(8)];
    float b = B[PI(9) + i0 * PI(10) + i1 * PI(11) + i2 * PI(12) + i3 * PI(13)];
    float r;
#if OP == B_ADD
    r = a + b;
#elif OP == B_SUB
    r = a - b;
#elif OP == B_MUL
    r = a * b;
#elif OP == B_DIV
    r = a / b;
#elif OP == B_POW
    r = safe_pow(a, b);
#elif OP == B_MAX
    r = max(a, b);
#elif OP == B_MIN
    r = min(a, b);
#elif OP == B_FMOD
    r = a - b * trunc(a / b);  // C's fmod: the sign of a
#elif OP == B_MOD
    r = a - b * trunc(a / b);  // then the sign of b, as Python's %
    if (r != 0.0 && ((r < 0.0) != (b < 0.0))) r += b;
#else
    r = a < 0.0 ? a * b : a;
#endif
    dst[PI(14) + i] = EPILOGUE(r);
}
