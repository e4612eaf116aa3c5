// int32 arithmetic of the Unary and Binary kernels (-DIN_INT), with NumPy's results where C
// leaves them undefined (gpumnn.backends.cpu_math is the reference). Needs common.glsl and
// activation.glsl (U_*).
#ifndef GPUMNN_INT_MATH
#define GPUMNN_INT_MATH 1

// Unary ops defined on int32 (atomic.INT_UNARY_OPS); clip bounds come as ints from the host.
int apply_unary_int(int op, int x, int lo, int hi) {
    switch (op) {
    case U_RELU: return max(x, 0);
    case U_CLIP: return min(max(x, lo), hi);
    case U_NEG: return -x;
    case U_ABS: return x < 0 ? -x : x;  // INT_MIN stays INT_MIN, as NumPy
    case U_SIGN: return sign(x);
    case U_SQUARE: return x * x;
    case U_NOT: return x == 0 ? 1 : 0;
    case U_NONZERO: return x != 0 ? 1 : 0;
    }
    return x;  // identity
}

// Division truncating toward zero; a zero divisor gives 0 and INT_MIN / -1 wraps, as NumPy. The
// divisor handed to the hardware is never 0 or -1 even where a compiler evaluates both sides of
// the selects (an x86 idiv traps on either).
int int_div(int a, int b) {
    int q = a / ((b == 0 || b == -1) ? 1 : b);
    return b == 0 ? 0 : (b == -1 ? -a : q);
}

// Integer power by squaring (wrapping); a negative exponent gives 1 / a^|b| truncated toward zero
// (gpumnn.atomic's contract): 1 and -1 raised exactly, 0 for any other base, 0 included.
int int_pow(int a, int b) {
    if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b & 1) != 0 ? -1 : 1) : 0);
    int r = 1;
    while (b > 0) {
        if ((b & 1) != 0) r *= a;
        a *= a;
        b >>= 1;
    }
    return r;
}

#endif
