/* Correctly rounded float32 arithmetic where a device's own may be less accurate, for kernels
 * whose results must be the reference's bits. */

/* a / b (b > 0) rounded to the nearest float32, as IEEE division rounds, on devices whose division
 * is less accurate: the quotient moves an ulp at a time while that brings a - q b, computed with
 * one rounding by fma, closer to 0. The quantization's rint must see exactly the reference's
 * quotient. */
inline float quotient_rn(const float a, const float b)
{
    float q = a / b;
    for (int i = 0; i < 3 && q != 0.0f; ++i) {
        const float r = fma(-q, b, a);
        if (r == 0.0f) break;
        const float next = nextafter(q, r > 0.0f ? INFINITY : -INFINITY);
        if (fabs(fma(-next, b, a)) >= fabs(r)) break;
        q = next;
    }
    return q;
}
