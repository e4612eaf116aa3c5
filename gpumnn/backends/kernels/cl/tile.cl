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

/* The staged slices' products: acc[i][j] = MAC(acc[i][j], As[k][m], Bs[k][n]) for the work-item's
 * rows m = ty + i * LY and columns n = tx + j * LX, over the DEPTH rows k of the slices in local
 * memory; T is their element type. */
#define TILE_PRODUCTS(T, DEPTH, MAC)                                             \
    for (int kk_ = 0; kk_ < (DEPTH); ++kk_) {                                  \
        T a_[WM], b_[WN];                                                      \
        for (int i_ = 0; i_ < WM; ++i_) a_[i_] = As[kk_][ty + i_ * LY];        \
        for (int j_ = 0; j_ < WN; ++j_) b_[j_] = Bs[kk_][tx + j_ * LX];        \
        for (int i_ = 0; i_ < WM; ++i_)                                        \
            for (int j_ = 0; j_ < WN; ++j_) MAC(acc[i_][j_], a_[i_], b_[j_]);  \
    }
/* the int32 tiles' multiply-add */
#define INT_MAC(acc, a, b) ((acc) += (a) * (b))
