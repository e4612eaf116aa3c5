// Shared helpers for every kernel (API-neutral; included after the prelude).
#ifndef GPUMNN_COMMON
#define GPUMNN_COMMON 1

#ifndef WG
#define WG 128
#endif

#define INT_MIN (-2147483647 - 1)
#define INT_MAX 2147483647

// Linear invocation index over a 2-D grid of 1-D workgroups (x is capped by the host at
// maxComputeWorkGroupCount[0]; y carries the rest).
#define GROUP_ID() int(gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x)
#define GLOBAL_ID() (GROUP_ID() * int(gl_WorkGroupSize.x) + int(gl_LocalInvocationID.x))

// Split a linear index over a row-major shape (PI(1), PI(2), PI(3)) of NDIM (1..4) dimensions,
// right-aligned: integer division is slow on SIMD CPUs (lavapipe), so the host collapses
// contiguous dimensions and compiles only the divisions needed.
#ifndef NDIM
#define NDIM 4
#endif
#if NDIM <= 1
#define INDEX4(i, i0, i1, i2, i3) int i0 = 0, i1 = 0, i2 = 0, i3 = (i)
#elif NDIM == 2
#define INDEX4(i, i0, i1, i2, i3) int i0 = 0, i1 = 0, i3 = (i) % PI(3), i2 = (i) / PI(3)
#elif NDIM == 3
#define INDEX4(i, i0, i1, i2, i3) int i0 = 0, i3 = (i) % PI(3), i2 = ((i) / PI(3)) % PI(2), i1 = ((i) / PI(3)) / PI(2)
#else
#define INDEX4(i, i0, i1, i2, i3) int i3 = (i) % PI(3), i2 = ((i) / PI(3)) % PI(2), i1 = (((i) / PI(3)) / PI(2)) % PI(1), i0 = (((i) / PI(3)) / PI(2)) / PI(1)
#endif

// The float tensors of the computing kernels: float32, or with -DHALF (precision="fp16", on a
// device with 16-bit storage: -DSTORAGE16 too) float16 elements as uint16_t, loaded into float and
// stored rounded by packHalf2x16, so every sum stays float32. Declare them with BUFFER_*_F,
// read with LOADF, write with STOREF.
#ifdef HALF
#define BUFFER_RO_F(b, name) BUFFER_RO_OF(uint16_t, b, name)
#define BUFFER_WO_F(b, name) BUFFER_WO_OF(uint16_t, b, name)
#define LOADF(a, i) unpackHalf2x16(uint(a[i])).x
#define STOREF(a, i, v) a[i] = uint16_t(packHalf2x16(vec2((v), 0.0)))
#else
#define BUFFER_RO_F(b, name) BUFFER_RO(b, name)
#define BUFFER_WO_F(b, name) BUFFER_WO(b, name)
#define LOADF(a, i) a[i]
#define STOREF(a, i, v) a[i] = (v)
#endif

// pow with NumPy's real-valued results: negative bases with integral exponents are allowed.
float safe_pow(float a, float b) {
    if (b == 0.0) return 1.0;
    if (a == 0.0) return b > 0.0 ? 0.0 : 1.0 / 0.0;
    if (a < 0.0) {
        if (b != floor(b)) return intBitsToFloat(0x7fc00000);  // NaN, as NumPy
        float r = pow(-a, b);
        return mod(b, 2.0) == 1.0 ? -r : r;
    }
    return pow(a, b);
}

#endif
