/* Resize of [planes, H, W] -> [planes, OH, OW]. The per-axis sampling tables (source indices
 * and weights, one entry per output row / column) are prepared once at execution creation
 * from the ONNX coordinate transform, so every backend rounds ties identically.
 * Table layout (float32): nearest: [ih(OH) | iw(OW)];
 * linear: [h0(OH) | h1(OH) | fh(OH) | w0(OW) | w1(OW) | fw(OW)]. */

#define RESIZE_ARGS \
    __global const float* x, const int x_off, __global float* y, const int y_off, \
    __global const float* table, const int planes, const int H, const int W, const int OH, const int OW

__kernel void resize_nearest(RESIZE_ARGS)
{
    const int gid = get_global_id(0);
    if (gid >= planes * OH * OW) return;
    int pl, oy, ox;
    split3(gid, OH, OW, &pl, &oy, &ox);
    const int iy = (int)table[oy], ix = (int)table[OH + ox];
    y[y_off + gid] = x[x_off + (pl * H + iy) * W + ix];
}

__kernel void resize_linear(RESIZE_ARGS)
{
    const int gid = get_global_id(0);
    if (gid >= planes * OH * OW) return;
    int pl, oy, ox;
    split3(gid, OH, OW, &pl, &oy, &ox);
    const int h0 = (int)table[oy], h1 = (int)table[OH + oy];
    const float fh = table[2 * OH + oy];
    __global const float* tw = table + 3 * OH;
    const int w0 = (int)tw[ox], w1 = (int)tw[OW + ox];
    const float fw = tw[2 * OW + ox];
    __global const float* p = x + x_off + pl * H * W;
    const float top = p[h0 * W + w0] * (1.0f - fw) + p[h0 * W + w1] * fw;
    const float bottom = p[h1 * W + w0] * (1.0f - fw) + p[h1 * W + w1] * fw;
    y[y_off + gid] = top * (1.0f - fh) + bottom * fh;
}
