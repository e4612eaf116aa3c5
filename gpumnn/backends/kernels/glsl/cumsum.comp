// CumSum: x viewed as [outer, size, inner] -> running sums along the middle axis, one invocation
// per (outer, inner) column, in order (float sums as NumPy's sequential cumsum).
// -DIN_INT: int32 (wrapping), else float32.
// params: 0 outer | 1 size | 2 inner | 3 x_off | 4 out_off | 5 exclusive | 6 reverse
#include "common.glsl"
layout(local_size_x = WG) in;
#ifdef IN_INT
#define T int
BUFFER_WO_OF(int, 0, dst);
BUFFER_RO_OF(int, 1, src);
#else
#define T float
BUFFER_WO(0, dst);
BUFFER_RO(1, src);
#endif

void main() {
    int row = GLOBAL_ID();
    int size = PI(1), inner = PI(2);
    if (row >= PI(0) * inner) return;
    int base = (row / inner) * size * inner + row % inner;
    bool exclusive = PI(5) != 0, reverse = PI(6) != 0;
    T acc = T(0);
    for (int k = 0; k < size; ++k) {
        int e = base + (reverse ? size - 1 - k : k) * inner;
        T x = src[PI(3) + e];
        if (exclusive) {
            dst[PI(4) + e] = acc;
            acc += x;
        } else {
            acc += x;
            dst[PI(4) + e] = acc;
        }
    }
}
