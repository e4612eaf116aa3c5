// RecurrentCell: one LSTM / GRU / RNN time step of every direction (gpumnn.atomic.RecurrentCell,
// whose docstring is the contract), one invocation per (direction, batch row, hidden unit); the
// same computation as shaders/opencl/recurrent.cl. At most two directions (ONNX's limit): their
// values are parameters. Absent optional inputs are bound to another tensor and never read.
// params: 0 total (D*B*H) | 1 batch | 2 hidden | 3 gate blocks | 4 projection row stride
//         5 clip (float; 0: none) | 6 cell (index in atomic.CELLS) | 7 flags (FLAG_*)
//         8 activation ids, 4 bits each, direction-major | 9 out_off | 10 gates_off | 11 proj_off
//         12 state_off | 13 extra_off (candidate, Rbh or P) | 14 lengths_off
//         15 + 8d: direction d's projection offset, time index, 3 alphas, 3 betas (floats)
#include "common.glsl"
#include "activation.glsl"
layout(local_size_x = WG) in;
BUFFER_WO(0, dst);
BUFFER_RO(1, gates);
BUFFER_RO(2, proj);
BUFFER_RO(3, state);
BUFFER_RO(4, extra);
BUFFER_RO_OF(int, 5, lengths);

// ids checked against gpumnn.atomic (glsl_plans.check_shader_op_ids)
#define CACT_RELU 0
#define CACT_TANH 1
#define CACT_SIGMOID 2
#define CACT_AFFINE 3
#define CACT_LEAKYRELU 4
#define CACT_THRESHOLDEDRELU 5
#define CACT_SCALEDTANH 6
#define CACT_HARDSIGMOID 7
#define CACT_ELU 8
#define CACT_SOFTSIGN 9
#define CACT_SOFTPLUS 10
#define CELL_RNN 0
#define CELL_GRU 1
#define CELL_GRU_RESET 2
#define CELL_LSTM 3
#define FLAG_INPUT_FORGET 1
#define FLAG_LINEAR_BEFORE_RESET 2
#define FLAG_RECURRENT_BIAS 4
#define FLAG_PEEPHOLE 8
#define FLAG_LENGTHS 16

// activation k of direction d (ids: atomic.CELL_ACTIVATIONS' order)
float cell_act(int d, int k, float x) {
    float a = PF(17 + 8 * d + k), b = PF(20 + 8 * d + k);
    switch ((PI(8) >> (4 * (3 * d + k))) & 15) {
    case CACT_RELU: return max(x, 0.0);
    case CACT_TANH: return tanh_safe(x);
    case CACT_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case CACT_AFFINE: return a * x + b;
    case CACT_LEAKYRELU: return x < 0.0 ? a * x : x;
    case CACT_THRESHOLDEDRELU: return x > a ? x : 0.0;
    case CACT_SCALEDTANH: return a * tanh_safe(b * x);
    case CACT_HARDSIGMOID: return clamp(a * x + b, 0.0, 1.0);
    case CACT_ELU: return x < 0.0 ? a * (exp(x) - 1.0) : x;
    case CACT_SOFTSIGN: return x / (1.0 + abs(x));
    case CACT_SOFTPLUS: return max(x, 0.0) + log1p_acc(exp(-abs(x)));
    }
    return x;
}

float bound(float v) {
    float clip = PF(5);
    return clip > 0.0 ? clamp(v, -clip, clip) : v;
}

void main() {
    int gid = GLOBAL_ID();
    int block = PI(0);
    if (gid >= block) return;
    int hidden = PI(2), batch = PI(1), flags = PI(7), cell = PI(6);
    int j = gid % hidden, row = gid / hidden, b = row % batch, d = row / batch;
    int g = PI(10) + row * PI(3) * hidden + j;
    int x = PI(11) + PI(15 + 8 * d) + b * PI(4) + j;
    float h = state[PI(12) + gid];
    if (cell == CELL_GRU_RESET) {
        dst[PI(9) + gid] = cell_act(d, 0, bound(gates[g + hidden] + proj[x + hidden])) * h;
        return;
    }
    float h_new, c = 0.0, c_new = 0.0;
    if (cell == CELL_RNN) {
        h_new = cell_act(d, 0, bound(gates[g] + proj[x]));
    } else if (cell == CELL_GRU) {
        float z = cell_act(d, 0, bound(gates[g] + proj[x]));
        float r = cell_act(d, 0, bound(gates[g + hidden] + proj[x + hidden]));
        float pre;
        if ((flags & FLAG_LINEAR_BEFORE_RESET) != 0) {
            float rbh = (flags & FLAG_RECURRENT_BIAS) != 0 ? extra[PI(13) + d * hidden + j] : 0.0;
            pre = proj[x + 2 * hidden] + r * (gates[g + 2 * hidden] + rbh);
        } else {
            pre = proj[x + 2 * hidden] + extra[PI(13) + gid];
        }
        float n = cell_act(d, 1, bound(pre));
        h_new = n + z * (h - n);
    } else {  // LSTM: gates i, o, f, c; peepholes i, o, f
        c = state[PI(12) + block + gid];
        bool has_p = (flags & FLAG_PEEPHOLE) != 0;
        int p = PI(13) + d * 3 * hidden + j;
        float i = cell_act(d, 0, bound(gates[g] + proj[x] + (has_p ? extra[p] * c : 0.0)));
        float f = (flags & FLAG_INPUT_FORGET) != 0 ? 1.0 - i
            : cell_act(d, 0, bound(gates[g + 2 * hidden] + proj[x + 2 * hidden] + (has_p ? extra[p + 2 * hidden] * c : 0.0)));
        c_new = f * c + i * cell_act(d, 1, bound(gates[g + 3 * hidden] + proj[x + 3 * hidden]));
        float o = cell_act(d, 0, bound(gates[g + hidden] + proj[x + hidden] + (has_p ? extra[p + hidden] * c_new : 0.0)));
        h_new = o * cell_act(d, 2, c_new);
    }
    if ((flags & FLAG_LENGTHS) != 0 && lengths[PI(14) + b] <= PI(16 + 8 * d)) {  // past its length: keep
        h_new = h;
        c_new = c;
    }
    dst[PI(9) + gid] = h_new;
    if (cell == CELL_LSTM) dst[PI(9) + block + gid] = c_new;
}
