/* Pool2D over NCHW planes. Windows are clipped to the real input (padding never wins a max;
 * an all-padding window gives -inf like the reference). Average divides by
 * max(count_h * count_w, 1) where the counts clip the window to [lo, hi) per axis: the padded
 * input when count_include_pad, else the real input. x and y are DATA_T (index.cl: float16 with
 * -DHALF), the sums float; pool2d_max_bytes takes 8-bit elements. */

#define PWG 64

/* The window of output element gid of [planes, OH, OW]: its plane, its first row and column y0, x0
 * (in the padded input), and the rows [ys, ye) and columns [xs, xe) it covers of the real input. */
inline void pool_window(const int gid, const int H, const int W, const int OH, const int OW, const int KH,
                        const int KW, const int SH, const int SW, const int PT, const int PL, int* pl, int* y0,
                        int* x0, int* ys, int* ye, int* xs, int* xe)
{
    int oy, ox;
    split3(gid, OH, OW, pl, &oy, &ox);
    *y0 = oy * SH - PT;
    *x0 = ox * SW - PL;
    *ys = max(*y0, 0);
    *ye = min(*y0 + KH, H);
    *xs = max(*x0, 0);
    *xe = min(*x0 + KW, W);
}

__kernel void pool2d(__global const DATA_T* x, const int x_off, __global DATA_T* y, const int y_off,
                     const int planes, const int H, const int W, const int OH, const int OW,
                     const int KH, const int KW, const int SH, const int SW,
                     const int PT, const int PL, const int PB, const int PR,
                     const int is_max, const int include_pad)
{
    const int gid = get_global_id(0);
    if (gid >= planes * OH * OW) return;
    int pl, y0, x0, ys, ye, xs, xe;
    pool_window(gid, H, W, OH, OW, KH, KW, SH, SW, PT, PL, &pl, &y0, &x0, &ys, &ye, &xs, &xe);
    __global const DATA_T* p = x + x_off + pl * H * W;
    float acc = is_max ? -INFINITY : 0.0f;
    for (int iy = ys; iy < ye; ++iy)
        for (int ix = xs; ix < xe; ++ix) {
            const float v = LOADF(p, iy * W + ix);
            acc = is_max ? fmax(acc, v) : acc + v;
        }
    if (!is_max) {
        int ch, cw;
        if (include_pad) {
            ch = min(y0 + KH, H + PB) - max(y0, -PT);
            cw = min(x0 + KW, W + PR) - max(x0, -PL);
        } else {
            ch = ye - ys;
            cw = xe - xs;
        }
        acc *= 1.0f / (float)max(ch * cw, 1);
    }
    STOREF(acc, y, y_off + gid);
}

/* Global pooling: one work-group per plane. */
__kernel void pool_global(__global const DATA_T* x, const int x_off, __global DATA_T* y, const int y_off,
                          const int size, const int is_max)
{
    __local float scratch[PWG];
    const int plane = get_group_id(0), lid = get_local_id(0);
    __global const DATA_T* p = x + x_off + plane * size;
    float acc = is_max ? -INFINITY : 0.0f;
    for (int s = lid; s < size; s += PWG) acc = is_max ? fmax(acc, LOADF(p, s)) : acc + LOADF(p, s);
    scratch[lid] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = PWG / 2; s > 0; s >>= 1) {
        if (lid < s) scratch[lid] = is_max ? fmax(scratch[lid], scratch[lid + s]) : scratch[lid] + scratch[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0) STOREF(is_max ? scratch[0] : scratch[0] / (float)size, y, y_off + plane);
}

/* Max pooling of 8-bit elements (uint8, or int8 with -DX_SIGNED: index.cl's LOAD_Q8): the largest
 * element of the window clipped to the input, copied (every window holds one: lowering refuses
 * padding as wide as the kernel). */
__kernel void pool2d_max_bytes(__global const uchar* x, const int x_off, __global uchar* y, const int y_off,
                               const int planes, const int H, const int W, const int OH, const int OW,
                               const int KH, const int KW, const int SH, const int SW, const int PT, const int PL)
{
    const int gid = get_global_id(0);
    if (gid >= planes * OH * OW) return;
    int pl, y0, x0, ys, ye, xs, xe;
    pool_window(gid, H, W, OH, OW, KH, KW, SH, SW, PT, PL, &pl, &y0, &x0, &ys, &ye, &xs, &xe);
    __global const uchar* p = x + x_off + pl * H * W;
    int acc = -256;
    for (int iy = ys; iy < ye; ++iy)
        for (int ix = xs; ix < xe; ++ix) acc = max(acc, LOAD_Q8(p, iy * W + ix));
    y[y_off + gid] = (uchar)(acc & 0xff);
}
