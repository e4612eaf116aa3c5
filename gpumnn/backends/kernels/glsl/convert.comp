// Unary identity between two storage dtypes (a Cast): -DIN_KIND / -DOUT_KIND name them by the
// ids below (the order of gpumnn.atomic.STORAGE_DTYPES; the planner checks it), the elements
// held as elements.glsl says (-DIN_BYTES / -DOUT_BYTES). float16 is converted in integer
// arithmetic, so every device rounds alike: to nearest even, overflowing to inf, subnormals
// kept. A float becomes an integer truncated toward zero; an 8-bit result keeps the low byte
// of the int (wraps, as NumPy's astype through int64).
// params: 0 count | 1 src_off | 2 dst_off
#define KIND_FLOAT32 0
#define KIND_INT32 1
#define KIND_FLOAT16 2
#define KIND_INT8 3
#define KIND_UINT8 4
#include "common.glsl"
#include "elements.glsl"
layout(local_size_x = WG) in;
OUT_BUFFER(0, dst);
IN_BUFFER(1, src);

// float16 bits -> float32 (exact)
float half_to_float(uint h) {
    uint sign = (h & 0x8000u) << 16;
    uint e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0u) {  // zero or subnormal: m * 2^-24, a normal float32
        float r = float(m) * 5.9604644775390625e-8;
        return sign != 0u ? -r : r;
    }
    if (e == 31u) return uintBitsToFloat(sign | 0x7f800000u | (m << 13));  // inf, NaN
    return uintBitsToFloat(sign | ((e + 112u) << 23) | (m << 13));
}

// float32 -> float16 bits, rounded to nearest even; NaN stays NaN (top payload bits, as NumPy)
uint float_to_half(float f) {
    uint x = floatBitsToUint(f);
    uint sign = (x >> 16) & 0x8000u;
    uint e = (x >> 23) & 0xffu, m = x & 0x7fffffu;
    if (e == 0xffu) return sign | (m != 0u ? max(0x7c00u | (m >> 13), 0x7c01u) : 0x7c00u);
    int exponent = int(e) - 112;  // the float16 exponent field it would have
    if (exponent >= 31) return sign | 0x7c00u;
    uint bits, rest, half_way;
    if (exponent <= 0) {  // a float16 subnormal (or zero): the implicit bit joins the mantissa
        if (exponent < -10) return sign;
        m |= 0x800000u;
        uint drop = uint(14 - exponent);
        bits = m >> drop;
        rest = m & ((1u << drop) - 1u);
        half_way = 1u << (drop - 1u);
    } else {
        bits = (uint(exponent) << 10) | (m >> 13);
        rest = m & 0x1fffu;
        half_way = 0x1000u;
    }
    if (rest > half_way || (rest == half_way && (bits & 1u) != 0u)) bits += 1u;  // a carry may reach inf
    return sign | bits;
}

uint element(int i) {
    uint bits = IN_LOAD(src, PI(1) + i);
#if IN_KIND == KIND_FLOAT32 || IN_KIND == KIND_FLOAT16
#if IN_KIND == KIND_FLOAT32
    float f = uintBitsToFloat(bits);
#else
    float f = half_to_float(bits);
#endif
    int v = int(f);
#else
#if IN_KIND == KIND_INT8
    int v = bitfieldExtract(int(bits), 0, 8);
#else
    int v = int(bits);
#endif
    float f = float(v);
#endif
#if OUT_KIND == KIND_FLOAT32
    return floatBitsToUint(f);
#elif OUT_KIND == KIND_FLOAT16
    return float_to_half(f);
#elif OUT_KIND == KIND_INT32
    return uint(v);
#else
    return uint(v) & 0xffu;
#endif
}

ELEMENTS_MAIN(dst, PI(0), PI(2))
