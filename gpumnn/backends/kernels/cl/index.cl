/* Index helpers shared by every program (included after vec.cl). Inline and branch-free, so a
 * CPU OpenCL compiler still vectorises the kernels that use them across work-items. */

/* The address space of a pointer parameter into local memory. A macro because CUDA
 * (prelude_cuda.h) spells the two uses differently: a __local array declared in a kernel is
 * __shared__ there, a pointer parameter to one has no qualifier. */
#ifndef LOCAL_PTR
#define LOCAL_PTR __local
#endif

/* The element of the kernels that move elements without arithmetic (raster, gather, select,
 * scatter): a 32-bit word of any 4-byte storage dtype, or with -DELEM=2 / -DELEM=1 the 16-bit /
 * 8-bit element of the narrow storage dtypes (float16; int8, uint8), copied as bits. */
#if defined(ELEM) && ELEM == 1
#define ELEM_T uchar
#elif defined(ELEM) && ELEM == 2
#define ELEM_T ushort
#else
#define ELEM_T uint
#endif

/* The int value of 8-bit element i of a uchar pointer (bytes move as uchar: CUDA's char signedness
 * varies by host): int8 with -DX_SIGNED, else uint8. */
#ifdef X_SIGNED
#define LOAD_Q8(p, i) (((int)(p)[i] ^ 0x80) - 0x80)
#else
#define LOAD_Q8(p, i) ((int)(p)[i])
#endif

/* The float tensors of the computing kernels: float32, or with -DHALF float16 storage
 * (precision="fp16"), loaded into float and stored rounded to nearest even (vload_half /
 * vstore_half_rte: core OpenCL, no cl_khr_fp16), so every sum stays float32. Scratch buffers
 * (split-K partial sums, Winograd transforms) are float32 either way. */
#ifdef HALF
#define DATA_T half
#define LOADF(p, i) vload_half((i), (p))
#define STOREF(v, p, i) vstore_half_rte((v), (i), (p))
#else
#define DATA_T float
#define LOADF(p, i) ((p)[i])
#define STOREF(v, p, i) ((p)[i] = (v))
#endif

/* Split a row-major flat index over [*, D1, D2] into (i0, i1, i2): e.g. gid over
 * [planes, OH, OW] -> (plane, oy, ox). */
inline void split3(const int gid, const int D1, const int D2, int* i0, int* i1, int* i2)
{
    *i2 = gid % D2;
    const int t = gid / D2;
    *i1 = t % D1;
    *i0 = t / D1;
}

/* Split a row-major flat index over [*, D1, D2, D3] into (i0, i1, i2, i3). */
inline void split4(const int gid, const int D1, const int D2, const int D3,
                   int* i0, int* i1, int* i2, int* i3)
{
    int t = gid;
    *i3 = t % D3; t /= D3;
    *i2 = t % D2; t /= D2;
    *i1 = t % D1;
    *i0 = t / D1;
}
