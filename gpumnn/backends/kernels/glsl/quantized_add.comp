// QuantizedAdd (gpumnn.atomic): the sum of two 8-bit tensors (elements.glsl: IN_BYTES = OUT_BYTES
// = 1), each dequantized by its own scale and zero point, requantized: clip(roundEven((float(a -
// a_zero) * a_scale + float(b - b_zero) * b_scale) / y_scale) + y_zero, lo, hi), every operation
// rounded to float32 in that order (precise: no fused multiply-add) and the division rounded
// correctly (rounding.glsl), so the result is the contract's bits. One invocation per element (per
// word of a packed output). -DX_SIGNED reads a and b as int8.
// Params: 0 count | 1 a_off | 2 b_off | 3 out_off | 4 a_zero | 5 a_scale | 6 b_zero | 7 b_scale
//   8 y_scale | 9 y_zero | 10 lo | 11 hi  (the scales as float bits)
#include "common.glsl"
#include "elements.glsl"
#include "rounding.glsl"
layout(local_size_x = WG) in;
OUT_BUFFER(0, dst);
IN_BUFFER(1, A);
IN_BUFFER(2, B);

#ifdef X_SIGNED
#define LOAD_Q(src, i) bitfieldExtract(int(IN_LOAD(src, i)), 0, 8)
#else
#define LOAD_Q(src, i) int(IN_LOAD(src, i))
#endif

uint element(int i) {
    precise float fa = float(LOAD_Q(A, PI(1) + i) - PI(4)) * PF(5);
    precise float fb = float(LOAD_Q(B, PI(2) + i) - PI(6)) * PF(7);
    precise float q = roundEven(quotient_rn(fa + fb, PF(8))) + float(PI(9));
    return uint(int(clamp(q, float(PI(10)), float(PI(11))))) & 0xffu;
}

ELEMENTS_MAIN(dst, PI(0), PI(3))
