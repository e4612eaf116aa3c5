/* CUDA prelude: lets the OpenCL C kernels of this folder compile as CUDA C++ (NVRTC), unchanged.
 *
 * gpumnn.shaders.cuda_source puts this file in front of an OpenCL program's text (the same
 * text the OpenCL backend builds: op-id header, vec.cl, index.cl, the family's files), followed
 * by the program's defines as #define lines. Compile with the options in
 * cuda_source.NVRTC_OPTIONS: -default-device makes the sources' plain ``inline`` helper
 * functions __device__ functions, so no OpenCL text needs a CUDA execution-space qualifier.
 *
 * Only what the sources use is mapped. OpenCL builtins that CUDA already has with the same name
 * and meaning for the types used (min / max / abs on int and long, fmin / fmax, exp, log, sqrt,
 * tanh, erf, pow, fmod, floor, ceil, rint, trunc, fabs, expm1, log1p, isnan on float) are CUDA's.
 * The CPU-device variants (-DVEC: floatN vectors, per-lane ?:) are OpenCL-only; see
 * cuda_source.py. */

/* ---- address spaces and kernels ---- */
#define __kernel extern "C" __global__   /* unmangled names: a module looks kernels up by name */
#define __global                         /* pointers into global memory are generic in CUDA */
#define __private
#define __local __shared__               /* __local arrays declared in a kernel body */
#define LOCAL_PTR                        /* a parameter pointing into them (index.cl: __local) */
/* __attribute__((reqd_work_group_size(X, Y, Z))): the launch must use exactly that block; in
 * CUDA the nearest promise is a bound on the threads per block, which lets the compiler budget
 * registers for it (a larger launch fails, as it does in OpenCL). */
#define reqd_work_group_size(x, y, z) launch_bounds((x) * (y) * (z))

/* ---- work-items: OpenCL's (global, local, group) ids over dims 0..2 are CUDA's x, y, z ---- */
__device__ __forceinline__ size_t get_local_id(const unsigned d)
{
    return d == 0 ? threadIdx.x : (d == 1 ? threadIdx.y : threadIdx.z);
}
__device__ __forceinline__ size_t get_group_id(const unsigned d)
{
    return d == 0 ? blockIdx.x : (d == 1 ? blockIdx.y : blockIdx.z);
}
__device__ __forceinline__ size_t get_global_id(const unsigned d)
{
    const unsigned size = d == 0 ? blockDim.x : (d == 1 ? blockDim.y : blockDim.z);
    return get_group_id(d) * size + get_local_id(d);
}

/* barrier(CLK_LOCAL_MEM_FENCE): every thread of the block waits; __syncthreads also orders the
 * block's shared (and global) memory accesses. */
#define CLK_LOCAL_MEM_FENCE 1
#define barrier(flags) __syncthreads()

/* ---- OpenCL scalar types and constants ---- */
typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;
typedef unsigned short half;   /* storage only: vstore_half_rte / vload_half below */
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef INT_MAX
#define INT_MAX 2147483647
#endif
#ifndef INT_MIN
#define INT_MIN (-INT_MAX - 1)
#endif

/* ---- builtins CUDA lacks or names differently ---- */
__device__ __forceinline__ float mad(const float a, const float b, const float c) { return fmaf(a, b, c); }

/* clamp(x, lo, hi) = min(max(x, lo), hi), with fmin / fmax for floats as OpenCL specifies */
__device__ __forceinline__ float clamp(const float x, const float lo, const float hi) { return fminf(fmaxf(x, lo), hi); }
__device__ __forceinline__ int clamp(const int x, const int lo, const int hi) { return min(max(x, lo), hi); }

/* as_type: the same 32 bits reinterpreted */
__device__ __forceinline__ int as_int(const int x) { return x; }
__device__ __forceinline__ int as_int(const uint x) { return (int)x; }
__device__ __forceinline__ int as_int(const float x) { return __float_as_int(x); }
__device__ __forceinline__ uint as_uint(const uint x) { return x; }
__device__ __forceinline__ uint as_uint(const int x) { return (uint)x; }
__device__ __forceinline__ uint as_uint(const float x) { return __float_as_uint(x); }

/* conversions: float -> int toward zero (NaN 0, out of range saturated: what OpenCL leaves to
 * the implementation), int -> float to nearest even */
__device__ __forceinline__ int convert_int_rtz(const float x) { return __float2int_rz(x); }
__device__ __forceinline__ float convert_float(const int x) { return __int2float_rn(x); }

/* float16 storage: round to nearest even on the store, exact on the load */
__device__ __forceinline__ void vstore_half_rte(const float x, const size_t i, half* p)
{
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
    p[i] = h;
}
__device__ __forceinline__ float vload_half(const size_t i, const half* p)
{
    float x;
    asm("cvt.f32.f16 %0, %1;" : "=f"(x) : "h"(p[i]));
    return x;
}

/* cl_khr_integer_dot_product's packed signed dot product (quantized_conv.cl -DINT8_DOT): __dp4a,
 * compute capability 6.1 and later, with the sum it adds to as its accumulator operand */
#define __opencl_c_integer_dot_product_input_4x8bit_packed 1
__device__ __forceinline__ int dot_4x8packed_ss_int(const uint a, const uint b) { return __dp4a((int)a, (int)b, 0); }
#define DOT4_ADD(acc, a, b) ((acc) = __dp4a((int)(a), (int)(b), (acc)))

/* ---- end of the CUDA prelude ---- */

/* ---- tensor cores (precision="tf32"; gemm.cl with -DGEMM_TF32=1, sm_80 and later) ----
 * Inline PTX, so NVRTC needs no header: a float rounded to TF32 (to nearest, ties away from zero,
 * as cuBLAS rounds), and D += A B over one 16 x 8 x 8 block, A 16 x 8 row-major and B 8 x 8
 * column-major in the warp's registers (the PTX ISA's fragment layouts), float32 sums. */
__device__ __forceinline__ uint to_tf32(const float x)
{
    uint r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}
__device__ __forceinline__ void mma_tf32_m16n8k8(float* d, const uint* a, const uint* b)
{
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* ---- float16 tensor cores (precision="fp16"; gemm.cl with -DGEMM_F16=1, sm_80 and later) ----
 * Two floats as the two float16 halves of a .f16x2 register, rounded to nearest even: ``lo`` in
 * bits 0-15, the fragment element of the lower index (the PTX ISA's packing), ``hi`` in bits 16-31.
 * Then D += A B over one 16 x 8 x 16 block: A 16 x 16 row-major in 4 registers, B 16 x 8
 * column-major in 2, C and D 4 floats per thread (gemm.cl's f16_* functions say which elements). */
__device__ __forceinline__ uint pack_half2(const float lo, const float hi)
{
    unsigned short l, h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(l) : "f"(lo));
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(hi));
    return (uint)l | ((uint)h << 16);
}
__device__ __forceinline__ void mma_f16_m16n8k16(float* d, const uint* a, const uint* b)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
