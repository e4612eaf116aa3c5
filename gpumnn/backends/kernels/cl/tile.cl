/* The tiled kernels' geometry (gemm, quantized_conv, quantized_matmul), passed by the planner as
 * -D (GEMM_CONFIGS): a work-group of LX x LY work-items computes a TM x TN tile, each work-item a
 * WM x WN register block, with TK-deep slices staged in local memory. */
#ifndef TM
#define TM 64
#endif
#ifndef TN
#define TN 64
#endif
#ifndef WM
#define WM 4
#endif
#ifndef WN
#define WN 4
#endif
#ifndef TK
#define TK 16
#endif
#define LX (TN / WN)
#define LY (TM / WM)
#define NT (LX * LY)
