/* RecurrentCell: one LSTM / GRU / RNN time step of every direction (gpumnn.atomic.RecurrentCell,
 * whose docstring is the contract), one work-item per (direction, batch row, hidden unit).
 * What differs by direction comes in two tables of CELL_INTS words and CELL_FLOATS floats a
 * direction: its projection offset and time index and its activations' ids (CACT_*, generated from
 * atomic.CELL_ACTIVATIONS), then their alphas and betas. flags: CELL_FLAG_* below. Absent optional
 * inputs are bound to another tensor and never read. */

#define CELL_INTS 5
#define CELL_FLOATS 6
#define CELL_FLAG_INPUT_FORGET 1
#define CELL_FLAG_LINEAR_BEFORE_RESET 2
#define CELL_FLAG_RECURRENT_BIAS 4
#define CELL_FLAG_PEEPHOLE 8
#define CELL_FLAG_LENGTHS 16

/* activation k of a direction (ints: its table row; floats: its alphas then betas) */
inline float cell_act(__global const int* ints, __global const float* floats, const int k, const float x)
{
    const float a = floats[k], b = floats[3 + k];
    switch (ints[2 + k]) {
    case CACT_RELU:            return fmax(x, 0.0f);
    case CACT_TANH:            return tanh(x);
    case CACT_SIGMOID:         return 1.0f / (1.0f + exp(-x));
    case CACT_AFFINE:          return a * x + b;
    case CACT_LEAKYRELU:       return x < 0.0f ? a * x : x;
    case CACT_THRESHOLDEDRELU: return x > a ? x : 0.0f;
    case CACT_SCALEDTANH:      return a * tanh(b * x);
    case CACT_HARDSIGMOID:     return clamp(a * x + b, 0.0f, 1.0f);
    case CACT_ELU:             return x < 0.0f ? a * expm1(x) : x;
    case CACT_SOFTSIGN:        return x / (1.0f + fabs(x));
    case CACT_SOFTPLUS:        return fmax(x, 0.0f) + log1p(exp(-fabs(x)));
    default:                   return x;
    }
}

inline float cell_bound(const float v, const float clip)
{
    return clip > 0.0f ? clamp(v, -clip, clip) : v;
}

__kernel void recurrent_cell(__global const float* gates, const int gates_off,
                             __global const float* proj, const int proj_off,
                             __global const float* state, const int state_off,
                             __global const float* extra, const int extra_off,  /* candidate or Rbh */
                             __global const float* peep, const int peep_off,
                             __global const int* lengths, const int lengths_off,
                             __global float* out, const int out_off,
                             __global const int* ints, __global const float* floats,
                             const int cell, const int dirs, const int batch, const int hidden,
                             const int gate_blocks, const int row_stride, const float clip, const int flags)
{
    const int gid = get_global_id(0);
    const int block = dirs * batch * hidden;  /* elements of one [D, B, H] block of state / out */
    if (gid >= block) return;
    const int j = gid % hidden, row = gid / hidden, b = row % batch, d = row / batch;
    __global const int* di = ints + d * CELL_INTS;
    __global const float* df = floats + d * CELL_FLOATS;
    __global const float* g = gates + gates_off + row * gate_blocks * hidden + j;
    __global const float* x = proj + proj_off + di[0] + b * row_stride + j;
    const float h = state[state_off + gid];
    if (cell == CELL_GRU_RESET) {
        out[out_off + gid] = cell_act(di, df, 0, cell_bound(g[hidden] + x[hidden], clip)) * h;
        return;
    }
    float h_new, c = 0.0f, c_new = 0.0f;
    if (cell == CELL_RNN) {
        h_new = cell_act(di, df, 0, cell_bound(g[0] + x[0], clip));
    } else if (cell == CELL_GRU) {
        const float z = cell_act(di, df, 0, cell_bound(g[0] + x[0], clip));
        const float r = cell_act(di, df, 0, cell_bound(g[hidden] + x[hidden], clip));
        float pre;
        if (flags & CELL_FLAG_LINEAR_BEFORE_RESET) {
            const float rbh = (flags & CELL_FLAG_RECURRENT_BIAS) ? extra[extra_off + d * hidden + j] : 0.0f;
            pre = x[2 * hidden] + r * (g[2 * hidden] + rbh);
        } else {
            pre = x[2 * hidden] + extra[extra_off + gid];
        }
        const float n = cell_act(di, df, 1, cell_bound(pre, clip));
        h_new = n + z * (h - n);
    } else {  /* LSTM: gates i, o, f, c; peepholes i, o, f */
        c = state[state_off + block + gid];
        const int has_p = (flags & CELL_FLAG_PEEPHOLE) != 0;
        __global const float* p = peep + peep_off + d * 3 * hidden + j;
        const float i = cell_act(di, df, 0, cell_bound(g[0] + x[0] + (has_p ? p[0] * c : 0.0f), clip));
        const float f = (flags & CELL_FLAG_INPUT_FORGET) ? 1.0f - i
            : cell_act(di, df, 0, cell_bound(g[2 * hidden] + x[2 * hidden] + (has_p ? p[2 * hidden] * c : 0.0f), clip));
        c_new = f * c + i * cell_act(di, df, 1, cell_bound(g[3 * hidden] + x[3 * hidden], clip));
        const float o = cell_act(di, df, 0, cell_bound(g[hidden] + x[hidden] + (has_p ? p[hidden] * c_new : 0.0f), clip));
        h_new = o * cell_act(di, df, 2, c_new);
    }
    if ((flags & CELL_FLAG_LENGTHS) && lengths[lengths_off + b] <= di[1]) {  /* past its length: keep */
        h_new = h;
        c_new = c;
    }
    out[out_off + gid] = h_new;
    if (cell == CELL_LSTM) out[out_off + block + gid] = c_new;
}
