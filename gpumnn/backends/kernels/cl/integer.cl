/* int32 elementwise math (needs activation.cl for the op ids and BOOL_BINARY_CASES): the Unary
 * ops of atomic.INT_UNARY_OPS and the Binary ops of atomic.INT_BINARY_OPS on int32 tensors.
 *
 * add, sub, mul, neg, abs and square wrap around (two's complement, as NumPy's int32): they are
 * computed on uint, whose overflow C defines, and reinterpreted. Division by zero and the one
 * overflowing quotient (INT_MIN / -1, which traps on x86) never reach the hardware divide: NumPy
 * gives 0 for a zero divisor and the wrapped result for -1. */

/* clip's bounds arrive as ints the host converted from the float params (+-inf = type limits) */
inline int apply_unary_int(const int op, const int x, const int p0, const int p1, const int p2)
{
    switch (op) {
    case UOP_IDENTITY: return x;
    case UOP_RELU:     return max(x, 0);
    case UOP_CLIP:     return min(max(x, p0), p1);   /* np.clip: the upper bound wins if lo > hi */
    case UOP_NEG:      return as_int(0u - as_uint(x));
    case UOP_ABS:      return as_int(abs(x));        /* abs(int) is a uint: |INT_MIN| wraps to INT_MIN */
    case UOP_SIGN:     return (x > 0) - (x < 0);
    case UOP_SQUARE:   return as_int(as_uint(x) * as_uint(x));
    case UOP_NOT:      return x == 0;
    case UOP_NONZERO:  return x != 0;
    default:           return x;
    }
}

/* a ** b by repeated squaring (wrapping like the other products). A negative exponent gives the
 * truncated real power: 1 and -1 keep their magnitude, every other base 0 (0 ** -n is 0 too,
 * where the float64 reference casts an infinity). */
inline int int_pow(const int a, int b)
{
    if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);
    uint base = as_uint(a), acc = 1u;
    while (b) {
        if (b & 1) acc *= base;
        base *= base;
        b >>= 1;
    }
    return as_int(acc);
}

inline int apply_binary_int(const int op, const int a, const int b)
{
    switch (op) {
    case BOP_ADD:  return as_int(as_uint(a) + as_uint(b));
    case BOP_SUB:  return as_int(as_uint(a) - as_uint(b));
    case BOP_MUL:  return as_int(as_uint(a) * as_uint(b));
    case BOP_DIV:  return b == 0 ? 0 : (b == -1 ? as_int(0u - as_uint(a)) : a / b);   /* toward zero */
    case BOP_POW:  return int_pow(a, b);
    case BOP_MAX:  return max(a, b);
    case BOP_MIN:  return min(a, b);
    case BOP_FMOD: return (b == 0 || b == -1) ? 0 : a % b;                            /* sign of a */
    case BOP_MOD:  { if (b == 0 || b == -1) return 0;                                 /* sign of b */
                     const int r = a % b;
                     return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
    BOOL_BINARY_CASES(int)
    default:       return a;
    }
}
