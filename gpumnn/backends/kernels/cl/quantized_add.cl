/* QuantizedAdd (gpumnn.atomic): the sum of two 8-bit tensors, each dequantized by its own scale
 * and zero point, requantized: clip(rint((float(a - a_zero) * a_scale + float(b - b_zero) *
 * b_scale) / y_scale) + y_zero, lo, hi), every operation rounded to float32 in that order, rint
 * rounding half to even. One work item per element. Bytes move as uchar, -DX_SIGNED reads a and
 * b as int8 (index.cl's LOAD_Q8); the output keeps the low byte of its int
 * (the range clip makes it the value). Products and the sum are never contracted into a fused
 * multiply-add (FP_CONTRACT off in OpenCL; CUDA's rounded intrinsics, which NVRTC never fuses) and
 * the division is rounded correctly (rounding.cl), so the result is the contract's bits. Needs
 * rounding.cl. */

#ifdef __CUDACC__
#define MUL_RN(x, y) __fmul_rn((x), (y))
#define ADD_RN(x, y) __fadd_rn((x), (y))
#else
#pragma OPENCL FP_CONTRACT OFF
#define MUL_RN(x, y) ((x) * (y))
#define ADD_RN(x, y) ((x) + (y))
#endif

__kernel void quantized_add(__global const uchar* a, const int a_off, __global const uchar* b, const int b_off,
                            __global uchar* y, const int y_off, const int count, const int a_zero,
                            const float a_scale, const int b_zero, const float b_scale, const float y_scale,
                            const int y_zero, const int lo, const int hi)
{
    const int i = get_global_id(0);
    if (i >= count) return;
    const float fa = MUL_RN((float)(LOAD_Q8(a, a_off + i) - a_zero), a_scale);
    const float fb = MUL_RN((float)(LOAD_Q8(b, b_off + i) - b_zero), b_scale);
    const float q = rint(quotient_rn(ADD_RN(fa, fb), y_scale)) + (float)y_zero;
    y[y_off + i] = (uchar)((int)clamp(q, (float)lo, (float)hi) & 0xff);
}
