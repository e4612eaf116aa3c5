/* Unary identity between two storage dtypes (a Cast), -DIN_KIND / -DOUT_KIND naming them by the
 * KIND_* ids of the generated header. Integers are read as int (int8 sign-extended from its
 * byte), float16 as float (exact, vload_half: core OpenCL, no cl_khr_fp16). A float becomes an
 * integer truncated toward zero; an 8-bit result keeps the low byte of the int (wraps, as
 * NumPy's astype through int64); float16 results round to nearest even, overflowing to inf
 * (vstore_half_rte). Bytes are handled as uchar only (CUDA's char signedness varies by host). */

#if IN_KIND == KIND_FLOAT32
#define IN_T float
#define IN_FLOAT 1
#define LOAD(p, i) (p)[i]
#elif IN_KIND == KIND_INT32
#define IN_T int
#define LOAD(p, i) (p)[i]
#elif IN_KIND == KIND_FLOAT16
#define IN_T half
#define IN_FLOAT 1
#define LOAD(p, i) vload_half(i, p)
#elif IN_KIND == KIND_INT8
#define IN_T uchar
#define LOAD(p, i) (((int)(p)[i] ^ 0x80) - 0x80)
#else
#define IN_T uchar
#define LOAD(p, i) ((int)(p)[i])
#endif

#ifdef IN_FLOAT
#define AS_FLOAT(v) (v)
#define AS_INT(v) convert_int_rtz(v)
#else
#define AS_FLOAT(v) convert_float(v)
#define AS_INT(v) (v)
#endif

#if OUT_KIND == KIND_FLOAT32
#define OUT_T float
#define STORE(v, p, i) (p)[i] = AS_FLOAT(v)
#elif OUT_KIND == KIND_INT32
#define OUT_T int
#define STORE(v, p, i) (p)[i] = AS_INT(v)
#elif OUT_KIND == KIND_FLOAT16
#define OUT_T half
#define STORE(v, p, i) vstore_half_rte(AS_FLOAT(v), i, p)
#else
#define OUT_T uchar
#define STORE(v, p, i) (p)[i] = (uchar)(AS_INT(v) & 0xff)
#endif

__kernel void convert_elements(__global const IN_T* src, const int s_off, __global OUT_T* dst, const int d_off,
                               const int n)
{
    const int i = get_global_id(0);
    if (i < n) STORE(LOAD(src, s_off + i), dst, d_off + i);
}
