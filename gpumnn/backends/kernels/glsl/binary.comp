// Binary: out[i] = act(op(a[i . a_strides], b[i . b_strides])) over a RANK-4 shape.
// -DOP=<binary id> (order of gpumnn.atomic.BINARY_OPS), optional -DACT=<unary id>.
// -DIN_INT: a and b are int32 (division truncates, add/sub/mul wrap), else float32 (float16 with
// -DHALF, common.glsl). The output
// is int32 for int32 operands and for the comparisons and logical ops (0/1), else float32.
// -DNDIM=1..4 as in raster.comp.
// params: 0 total | 1..3 shape[1..3] | 4 a_off | 5..8 a_strides | 9 b_off | 10..13 b_strides
//         14 out_off | 15..17 activation params
#include "common.glsl"
#define ACT_P 15
#include "activation.glsl"
#include "int_math.glsl"
layout(local_size_x = WG) in;

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

#ifdef IN_INT
#define T int
BUFFER_RO_OF(int, 1, A);
BUFFER_RO_OF(int, 2, B);
#else
#define T float
BUFFER_RO_F(1, A);
BUFFER_RO_F(2, B);
#endif
#if defined(IN_INT) || OP >= B_EQUAL
#define OUT_INT 1
#define OUT_T int
BUFFER_WO_OF(int, 0, dst);
#else
#define OUT_T float
BUFFER_WO_F(0, dst);
#endif

// C's fmod (the sign of a): a - b * trunc(a / b); an int32 zero divisor gives 0, as NumPy; a
// finite a over an infinite b is a (the formula would give NaN).
T fmod_t(T a, T b) {
#ifdef IN_INT
    return b == 0 ? 0 : a - b * int_div(a, b);
#else
    if (isinf(b) && !isinf(a) && !isnan(a)) return a;
    return a - b * trunc(a / b);
#endif
}

// Python's % (the sign of b).
T mod_t(T a, T b) {
    T r = fmod_t(a, b);
    return (r != T(0) && ((r < T(0)) != (b < T(0)))) ? r + b : r;
}

#ifdef IN_INT
#define DIV(a, b) int_div(a, b)
#define POW(a, b) int_pow(a, b)
#else
#define DIV(a, b) ((a) / (b))
#define POW(a, b) safe_pow(a, b)
#endif

void main() {
    int i = GLOBAL_ID();
    if (i >= PI(0)) return;
    INDEX4(i, i0, i1, i2, i3);
#ifdef IN_INT
    T a = A[PI(4) + i0 * PI(5) + i1 * PI(6) + i2 * PI(7) + i3 * PI(8)];
    T b = B[PI(9) + i0 * PI(10) + i1 * PI(11) + i2 * PI(12) + i3 * PI(13)];
#else
    T a = LOADF(A, PI(4) + i0 * PI(5) + i1 * PI(6) + i2 * PI(7) + i3 * PI(8));
    T b = LOADF(B, PI(9) + i0 * PI(10) + i1 * PI(11) + i2 * PI(12) + i3 * PI(13));
#endif
    OUT_T r;
#if OP == B_ADD
    r = a + b;
#elif OP == B_SUB
    r = a - b;
#elif OP == B_MUL
    r = a * b;
#elif OP == B_DIV
    r = DIV(a, b);
#elif OP == B_POW
    r = POW(a, b);
#elif OP == B_MAX
    r = max(a, b);
#elif OP == B_MIN
    r = min(a, b);
#elif OP == B_FMOD
    r = fmod_t(a, b);
#elif OP == B_MOD
    r = mod_t(a, b);
#elif OP == B_EQUAL
    r = int(a == b);
#elif OP == B_LESS
    r = int(a < b);
#elif OP == B_LESS_EQUAL
    r = int(a <= b);
#elif OP == B_GREATER
    r = int(a > b);
#elif OP == B_GREATER_EQUAL
    r = int(a >= b);
#elif OP == B_AND
    r = int(a != T(0) && b != T(0));
#elif OP == B_OR
    r = int(a != T(0) || b != T(0));
#elif OP == B_XOR
    r = int((a != T(0)) != (b != T(0)));
#else
    r = a < 0.0 ? a * b : a;
#endif
#if defined(OUT_INT) && defined(ACT)
    dst[PI(14) + i] = int(EPILOGUE(float(r)));  // an activation fused after a comparison's 0/1
#elif defined(OUT_INT)
    dst[PI(14) + i] = EPILOGUE(r);
#else
    STOREF(dst, PI(14) + i, EPILOGUE(r));
#endif
}
