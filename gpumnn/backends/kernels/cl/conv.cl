/* Depthwise Conv2D (groups == C == OC): one work-item per output pixel, taps unrolled at run
 * time, bias, residual (where has_res: laid out as y) and fused activation. Needs activation.cl. */

__kernel void conv_depthwise(__global const DATA_T* x, const int x_off,
                             __global const DATA_T* w, const int w_off,
                             __global const DATA_T* bias, const int bias_off,
                             __global DATA_T* y, const int y_off,
                             const int planes, const int C, const int H, const int W,
                             const int OH, const int OW, const int KH, const int KW,
                             const int SH, const int SW, const int PH, const int PW,
                             const int DH, const int DW, const int has_bias,
                             __global const DATA_T* res, const int res_off, const int has_res,
                             const int act, const float p0, const float p1, const float p2)
{
    const int gid = get_global_id(0);
    if (gid >= planes * OH * OW) return;
    int pl, oy, ox;
    split3(gid, OH, OW, &pl, &oy, &ox);
    const int c = pl % C;
    __global const DATA_T* p = x + x_off + pl * H * W;
    __global const DATA_T* wc = w + w_off + c * KH * KW;
    const int y0 = oy * SH - PH, x0 = ox * SW - PW;
    float acc = 0.0f;
    for (int i = 0; i < KH; ++i) {
        const int iy = y0 + i * DH;
        if (iy < 0 || iy >= H) continue;
        for (int j = 0; j < KW; ++j) {
            const int ix = x0 + j * DW;
            if (ix >= 0 && ix < W) acc = mad(LOADF(p, iy * W + ix), LOADF(wc, i * KW + j), acc);
        }
    }
    if (has_bias) acc += LOADF(bias, bias_off + c);
    if (has_res) acc += LOADF(res, res_off + gid);
    STOREF(apply_unary(act, acc, p0, p1, p2), y, y_off + gid);
}
