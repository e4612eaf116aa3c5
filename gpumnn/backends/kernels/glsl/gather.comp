// Gather with run-time indices: data [outer, axis, inner], indices (int32) [count]
// -> out [outer, count, inner], elements of any storage dtype copied as their bits
// (elements.glsl); negative indices count from the end.
// params: 0 total | 1 axis | 2 inner | 3 count | 4 data_off | 5 idx_off | 6 out_off
#include "common.glsl"
#include "elements.glsl"
layout(local_size_x = WG) in;
OUT_BUFFER(0, dst);
IN_BUFFER(1, data);
BUFFER_RO_OF(int, 2, idx);

uint element(int i) {
    int axis = PI(1), inner = PI(2);
    int e = i % inner;
    int t = i / inner;
    int c = t % PI(3);
    int o = t / PI(3);
    int j = idx[PI(5) + c];
    if (j < 0) j += axis;
    j = clamp(j, 0, axis - 1);
    return IN_LOAD(data, PI(4) + (o * axis + j) * inner + e);
}

ELEMENTS_MAIN(dst, PI(0), PI(6))
