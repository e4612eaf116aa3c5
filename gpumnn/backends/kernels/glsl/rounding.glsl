// Correctly rounded float32 arithmetic where a device's own may be less accurate, for kernels
// whose results must be the reference's bits.
#ifndef GPUMNN_ROUNDING
#define GPUMNN_ROUNDING 1

// a / b (b > 0) rounded to the nearest float32 as IEEE division rounds, on devices whose division
// is less accurate: the quotient moves an ulp at a time while that brings a - q b (one rounding,
// fma) closer to 0, so that roundEven sees exactly the reference's quotient.
float quotient_rn(float a, float b) {
    precise float q = a / b;
    for (int i = 0; i < 3 && q != 0.0; ++i) {
        precise float r = fma(-q, b, a);
        if (r == 0.0) break;
        uint bits = floatBitsToUint(q);
        precise float next = uintBitsToFloat((r > 0.0) == (q > 0.0) ? bits + 1u : bits - 1u);
        precise float rn = fma(-next, b, a);
        if (abs(rn) >= abs(r)) break;
        q = next;
    }
    return q;
}

#endif
