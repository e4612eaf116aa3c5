/* Vector helpers for the CPU-device kernel variants, compiled when a program is built with
 * -DVEC=n (n = 4, 8 or 16): VT is floatn, VLOAD / VSTORE are vloadn / vstoren. Included first
 * in every program. */
#ifdef VEC
#define VCAT_(a, b) a##b
#define VCAT(a, b) VCAT_(a, b)
#define VT VCAT(float, VEC)
#define VLOAD VCAT(vload, VEC)
#define VSTORE VCAT(vstore, VEC)
#endif
