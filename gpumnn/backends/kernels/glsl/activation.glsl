// Unary math shared by the Unary kernel and every fused activation epilogue.
// Op ids follow the order of gpumnn.atomic.UNARY_OPS (checked by gpumnn/backends/vulkan.py).
#ifndef GPUMNN_ACTIVATION
#define GPUMNN_ACTIVATION 1

#define U_IDENTITY 0
#define U_RELU 1
#define U_LEAKY_RELU 2
#define U_CLIP 3
#define U_SIGMOID 4
#define U_TANH 5
#define U_ERF 6
#define U_GELU 7
#define U_HARD_SIGMOID 8
#define U_HARD_SWISH 9
#define U_EXP 10
#define U_LOG 11
#define U_SQRT 12
#define U_NEG 13
#define U_ABS 14
#define U_RECIPROCAL 15
#define U_FLOOR 16
#define U_CEIL 17
#define U_ROUND 18
#define U_TRUNC 19
#define U_SQUARE 20
#define U_SOFTPLUS 21
#define U_ELU 22
#define U_SIGN 23
#define U_AFFINE_POW 24
#define U_SELU 25
#define U_CELU 26
#define U_MISH 27
#define U_THRESHOLDED_RELU 28
#define U_ROUND_F16 29
#define U_NOT 30
#define U_NONZERO 31
#define U_SILU 32

// erf by Abramowitz & Stegun 7.1.26 (the same formula as gpumnn.backends.cpu_math.erf).
float erf_as(float x) {
    float ax = abs(x);
    float t = 1.0 / (1.0 + 0.3275911 * ax);
    float poly = ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t
                  + 0.254829592) * t;
    float r = 1.0 - poly * exp(-ax * ax);
    return x < 0.0 ? -r : r;
}

// tanh that never overflows (exp of a non-positive argument only). Below |x| = 0.1, 1 - exp(-2|x|)
// cancels (relative error ~1e-7 / |x|), so the odd Taylor series is used there (truncation < 1e-7).
float tanh_safe(float x) {
    float ax = abs(x);
    if (ax < 0.1) {
        float x2 = x * x;
        return x * (1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 + x2 * (-17.0 / 315.0))));
    }
    float e = exp(-2.0 * ax);
    float r = (1.0 - e) / (1.0 + e);
    return x < 0.0 ? -r : r;
}

// log(1 + e) accurate for small e (GLSL has no log1p): Goldberg's correction of the rounded 1 + e.
// `precise` keeps compilers from folding (1 + e) - 1 back into e, which would undo the correction.
float log1p_acc(float e) {
    precise float u = 1.0 + e;
    precise float rounded = u - 1.0;
    return u == 1.0 ? e : log(u) * (e / rounded);
}

float apply_unary(int op, float x, float a, float b, float c) {
    switch (op) {
    case U_IDENTITY: return x;
    case U_RELU: return max(x, 0.0);
    case U_LEAKY_RELU: return x < 0.0 ? a * x : x;
    case U_CLIP: return min(max(x, a), b);
    case U_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case U_TANH: return tanh_safe(x);
    case U_ERF: return erf_as(x);
    case U_GELU: return 0.5 * x * (1.0 + erf_as(x * 0.7071067811865476));
    case U_HARD_SIGMOID: return clamp(a * x + b, 0.0, 1.0);
    case U_HARD_SWISH: return x * clamp(x / 6.0 + 0.5, 0.0, 1.0);
    case U_EXP: return exp(x);
    case U_LOG: return x < 0.0 ? intBitsToFloat(0x7fc00000) : (x == 0.0 ? -1.0 / 0.0 : log(x));
    case U_SQRT: return x < 0.0 ? intBitsToFloat(0x7fc00000) : sqrt(x);
    case U_NEG: return -x;
    case U_ABS: return abs(x);
    case U_RECIPROCAL: return 1.0 / x;
    case U_FLOOR: return floor(x);
    case U_CEIL: return ceil(x);
    case U_ROUND: return roundEven(x);
    case U_TRUNC: return trunc(x);
    case U_SQUARE: return x * x;
    case U_SOFTPLUS: return max(x, 0.0) + log1p_acc(exp(-abs(x)));
    case U_ELU: return x < 0.0 ? a * (exp(x) - 1.0) : x;
    case U_SIGN: return sign(x);
    case U_AFFINE_POW: return safe_pow(a + b * x, c);
    case U_SELU: return b * (x <= 0.0 ? a * (exp(x) - 1.0) : x);
    case U_CELU: return max(x, 0.0) + min(0.0, a * (exp(x / a) - 1.0));
    case U_MISH: return x * tanh_safe(max(x, 0.0) + log1p_acc(exp(-abs(x))));
    case U_THRESHOLDED_RELU: return x > a ? x : 0.0;
    case U_ROUND_F16: return unpackHalf2x16(packHalf2x16(vec2(x, 0.0))).x;  // round to nearest even
    case U_NOT: return x == 0.0 ? 1.0 : 0.0;
    case U_NONZERO: return x != 0.0 ? 1.0 : 0.0;  // NaN is nonzero
    case U_SILU: return x / (1.0 + exp(-x));
    }
    return x;
}

// Epilogue used by kernels compiled with -DACT=<id>; parameters at PF(ACT_P)..PF(ACT_P+2).
#ifdef ACT
#define EPILOGUE(v) apply_unary(ACT, (v), PF(ACT_P), PF(ACT_P + 1), PF(ACT_P + 2))
#else
#define EPILOGUE(v) (v)
#endif

#endif
