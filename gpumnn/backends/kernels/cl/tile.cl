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

/* The work-item's place: (tx, ty) in its work-group and tid flat, its tile's first column n0 and
 * row m0; and its WM x WN block of sums, acc, zeroed. */
#define TILE_START(T)                                                  \
    const int tx = get_local_id(0), ty = get_local_id(1), tid = ty * LX + tx; \
    const int n0 = get_group_id(0) * TN, m0 = get_group_id(1) * TM;   \
    T acc[WM][WN];                                                     \
    for (int i = 0; i < WM; ++i)                                       \
        for (int j = 0; j < WN; ++j) acc[i][j] = 0;

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
