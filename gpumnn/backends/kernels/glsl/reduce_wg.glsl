// Workgroup-wide reductions over WG lanes through shared memory (uniform control flow only).
// -DWG_T=int makes them reduce ints (default float).
#ifndef GPUMNN_REDUCE_WG
#define GPUMNN_REDUCE_WG 1

#ifndef WG_T
#define WG_T float
#endif

shared WG_T wg_scratch[WG];

#define WG_REDUCE_FN(NAME, OP)                                               \
WG_T NAME(WG_T v) {                                                          \
    uint lid = gl_LocalInvocationID.x;                                       \
    wg_scratch[lid] = v;                                                     \
    memoryBarrierShared(); barrier();                                        \
    for (uint s = uint(WG) / 2u; s > 0u; s >>= 1) {                          \
        if (lid < s) { WG_T a = wg_scratch[lid]; WG_T b = wg_scratch[lid + s]; wg_scratch[lid] = OP; } \
        memoryBarrierShared(); barrier();                                    \
    }                                                                        \
    WG_T r = wg_scratch[0];                                                  \
    memoryBarrierShared(); barrier();                                        \
    return r;                                                                \
}

WG_REDUCE_FN(wg_sum, a + b)
WG_REDUCE_FN(wg_max, max(a, b))
WG_REDUCE_FN(wg_min, min(a, b))

#endif
