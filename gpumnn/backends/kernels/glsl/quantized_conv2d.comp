// QuantizedConv2D (gpumnn.atomic): 8-bit NCHW in and out (elements.glsl: IN_BYTES = OUT_BYTES =
// 1), an int32 sum per output and the requantizing epilogue clip(rint(float(acc) *
// multiplier[oc]) + y_zero, lo, hi) in float32, rint rounding half to even. One invocation per
// output element (per word of a packed output), plain integer arithmetic. -DX_SIGNED reads x as
// int8. Padding adds nothing, as if it held x's zero point.
// Binding 2 is one int32 constant the host packs: bias [OC], the multipliers' bits [OC], then the
// int8 weights [OC][C/G][KH][KW] widened to int32 (-DINT8_DOT: [OC][ceil(K / 4)] words of four
// bytes, K = C/G*KH*KW, zero-padded).
// -DTILED (the GPU family, every scheme but depthwise): per (image, group), workgroup z, the
// implicit GEMM acc[oc][p] = sum_k W[oc][k] * (x(k, p) - x_zero), k = (c, ky, kx), p = (oy, ox),
// on int32 tiles in shared memory: TM output channels x TN pixels a workgroup, RM x RN an
// invocation, TK-deep slices; outputs stored element by element (OUT_STORE).
// -DTILED -DINT8_DOT (Vulkan devices with VK_KHR_shader_integer_dot_product): the same GEMM on
// bytes, four consecutive k packed in a word (k + t at bits 8t), one SPIR-V dot product
// (SPV_KHR_integer_dot_product) per four multiply-adds: acc = sum_k W[oc][k] * x(k, p), padding
// as the byte x_zero, and the constant's bias already holds -x_zero * sum_k W[oc][k].
// Params: 0 total | 1 C | 2 H | 3 W | 4 OC | 5 OH | 6 OW | 7 KH | 8 KW | 9 SH | 10 SW | 11 PT
//   12 PL | 13 DH | 14 DW | 15 G | 16 x_zero | 17 y_zero | 18 lo | 19 hi | 20 x_off
//   21 packed constant's offset | 22 out_off
#include "common.glsl"
#include "elements.glsl"
OUT_BUFFER(0, dst);
IN_BUFFER(1, X);
BUFFER_RO_OF(int, 2, Packed);

#ifdef X_SIGNED
#define LOAD_X(i) ((int(IN_LOAD(X, i)) ^ 0x80) - 0x80)
#else
#define LOAD_X(i) int(IN_LOAD(X, i))
#endif

// The requantized output of sum acc (bias included) of output channel oc, as its byte.
uint requantized(int acc, int oc) {
    float scaled = roundEven(float(acc) * intBitsToFloat(Packed[PI(21) + PI(4) + oc])) + float(PI(17));
    return uint(int(clamp(scaled, float(PI(18)), float(PI(19))))) & 0xffu;
}

#if defined(TILED) && defined(INT8_DOT)
// OpSDot / OpSUDot (SPV_KHR_integer_dot_product) on two 32-bit words of four 8-bit lanes
// (PackedVectorFormat4x8Bit = 0): capabilities DotProduct (6019), DotProductInput4x8BitPacked (6018)
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int dot_packed_signed(uint a, uint b, spirv_literal int packed_vector_format);
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4452)
int dot_packed_signed_unsigned(uint signed_a, uint unsigned_b, spirv_literal int packed_vector_format);
#ifdef X_SIGNED
#define DOT4(w, x) dot_packed_signed(w, x, 0)
#else
#define DOT4(w, x) dot_packed_signed_unsigned(w, x, 0)
#endif
#define TX (TN / RN)
#define TY (TM / RM)
#define TQ (TK / 4)
#if NT != (TN / RN) * (TM / RM) || TK % 4 != 0
#error NT must equal (TM/RM)*(TN/RN), TK a multiple of 4
#endif
layout(local_size_x = NT) in;
shared uint As[TQ * TM];
shared uint Bs[TQ * TN];
void main() {
    int tid = int(gl_LocalInvocationID.x);
    int tx = tid % TX, ty = tid / TX;
    int n0 = int(gl_WorkGroupID.x) * TN, m0 = int(gl_WorkGroupID.y) * TM;
    int z = int(gl_WorkGroupID.z);
    int C = PI(1), H = PI(2), W = PI(3), OC = PI(4), OW = PI(6), KH = PI(7), KW = PI(8), G = PI(15);
    int img = z / G, g = z - img * G;
    int cg = C / G, ocg = OC / G, khw = KH * KW, K = cg * khw, KQ = (K + 3) / 4, P = PI(5) * OW;
    int xb = PI(20) + (img * C + g * cg) * H * W;
    int wb = PI(21) + 2 * OC + g * ocg * KQ;
    uint zero_byte = uint(PI(16)) & 0xffu;
    int acc[RM][RN];
    for (int i = 0; i < RM; ++i)
        for (int j = 0; j < RN; ++j) acc[i][j] = 0;
    for (int q0 = 0; q0 < KQ; q0 += TQ) {
        for (int e = tid; e < TM * TQ; e += NT) {
            int mm = e / TQ, qq = e - mm * TQ;
            int m = m0 + mm, q = q0 + qq;
            As[qq * TM + mm] = (m < ocg && q < KQ) ? uint(Packed[wb + m * KQ + q]) : 0u;
        }
        for (int e = tid; e < TN * TQ; e += NT) {
            int qq = e / TN, nn = e - qq * TN;
            int n = n0 + nn;
            uint word = 0u;
            if (n < P) {
                int oy = n / OW, ox = n - oy * OW;
                int k = 4 * (q0 + qq);
                for (int t = 0; t < 4 && k + t < K; ++t) {
                    int c = (k + t) / khw, r = (k + t) - c * khw;
                    int ky = r / KW, kx = r - ky * KW;
                    int iy = oy * PI(9) - PI(11) + ky * PI(13), ix = ox * PI(10) - PI(12) + kx * PI(14);
                    uint v = (iy >= 0 && iy < H && ix >= 0 && ix < W) ? IN_LOAD(X, xb + (c * H + iy) * W + ix) & 0xffu
                                                                      : zero_byte;
                    word |= v << (8 * t);
                }
            }
            Bs[qq * TN + nn] = word;
        }
        memoryBarrierShared();
        barrier();
        for (int qq = 0; qq < TQ; ++qq) {
            uint a[RM];
            uint b[RN];
            for (int i = 0; i < RM; ++i) a[i] = As[qq * TM + ty + i * TY];
            for (int j = 0; j < RN; ++j) b[j] = Bs[qq * TN + tx + j * TX];
            for (int i = 0; i < RM; ++i)
                for (int j = 0; j < RN; ++j) acc[i][j] += DOT4(a[i], b[j]);
        }
        barrier();
    }
    for (int i = 0; i < RM; ++i) {
        int m = m0 + ty + i * TY;
        if (m >= ocg) continue;
        int oc = g * ocg + m;
        int add = Packed[PI(21) + oc];
        for (int j = 0; j < RN; ++j) {
            int n = n0 + tx + j * TX;
            if (n < P) OUT_STORE(dst, PI(22) + (img * OC + oc) * P + n, requantized(acc[i][j] + add, oc));
        }
    }
}
#elif defined(TILED)
#define TX (TN / RN)
#define TY (TM / RM)
#if NT != (TN / RN) * (TM / RM)
#error NT must equal (TM/RM)*(TN/RN)
#endif
layout(local_size_x = NT) in;
shared int As[TK * TM];
shared int Bs[TK * TN];
void main() {
    int tid = int(gl_LocalInvocationID.x);
    int tx = tid % TX, ty = tid / TX;
    int n0 = int(gl_WorkGroupID.x) * TN, m0 = int(gl_WorkGroupID.y) * TM;
    int z = int(gl_WorkGroupID.z);
    int C = PI(1), H = PI(2), W = PI(3), OC = PI(4), OW = PI(6), KH = PI(7), KW = PI(8), G = PI(15);
    int img = z / G, g = z - img * G;
    int cg = C / G, ocg = OC / G, khw = KH * KW, K = cg * khw, P = PI(5) * OW;
    int xb = PI(20) + (img * C + g * cg) * H * W;
    int wb = PI(21) + 2 * OC + g * ocg * K;
    int acc[RM][RN];
    for (int i = 0; i < RM; ++i)
        for (int j = 0; j < RN; ++j) acc[i][j] = 0;
    for (int k0 = 0; k0 < K; k0 += TK) {
        for (int e = tid; e < TM * TK; e += NT) {
            int mm = e / TK, kk = e - mm * TK;
            int m = m0 + mm, k = k0 + kk;
            As[kk * TM + mm] = (m < ocg && k < K) ? Packed[wb + m * K + k] : 0;
        }
        for (int e = tid; e < TN * TK; e += NT) {
            int kk = e / TN, nn = e - kk * TN;
            int n = n0 + nn, k = k0 + kk;
            int v = 0;
            if (n < P && k < K) {
                int c = k / khw, r = k - c * khw;
                int ky = r / KW, kx = r - ky * KW;
                int oy = n / OW, ox = n - oy * OW;
                int iy = oy * PI(9) - PI(11) + ky * PI(13), ix = ox * PI(10) - PI(12) + kx * PI(14);
                if (iy >= 0 && iy < H && ix >= 0 && ix < W) v = LOAD_X(xb + (c * H + iy) * W + ix) - PI(16);
            }
            Bs[kk * TN + nn] = v;
        }
        memoryBarrierShared();
        barrier();
        for (int kk = 0; kk < TK; ++kk) {
            int a[RM];
            int b[RN];
            for (int i = 0; i < RM; ++i) a[i] = As[kk * TM + ty + i * TY];
            for (int j = 0; j < RN; ++j) b[j] = Bs[kk * TN + tx + j * TX];
            for (int i = 0; i < RM; ++i)
                for (int j = 0; j < RN; ++j) acc[i][j] += a[i] * b[j];
        }
        barrier();
    }
    for (int i = 0; i < RM; ++i) {
        int m = m0 + ty + i * TY;
        if (m >= ocg) continue;
        int oc = g * ocg + m;
        int add = Packed[PI(21) + oc];
        for (int j = 0; j < RN; ++j) {
            int n = n0 + tx + j * TX;
            if (n < P) OUT_STORE(dst, PI(22) + (img * OC + oc) * P + n, requantized(acc[i][j] + add, oc));
        }
    }
}
#else
layout(local_size_x = WG) in;
uint element(int i) {
    int C = PI(1), H = PI(2), W = PI(3), OC = PI(4), OH = PI(5), OW = PI(6), KH = PI(7), KW = PI(8);
    int ox = i % OW, oy = (i / OW) % OH, oc = (i / (OW * OH)) % OC, n = i / (OW * OH * OC);
    int cg = C / PI(15), g = oc / (OC / PI(15));
    int p0 = PI(21);
    int acc = Packed[p0 + oc];
    int plane = PI(20) + (n * C + g * cg) * H * W;
    int wk = p0 + 2 * OC + oc * cg * KH * KW;
    for (int c = 0; c < cg; ++c) {
        for (int ky = 0; ky < KH; ++ky) {
            int iy = oy * PI(9) - PI(11) + ky * PI(13);
            if (iy < 0 || iy >= H) continue;
            for (int kx = 0; kx < KW; ++kx) {
                int ix = ox * PI(10) - PI(12) + kx * PI(14);
                if (ix < 0 || ix >= W) continue;
                acc += (LOAD_X(plane + (c * H + iy) * W + ix) - PI(16)) * Packed[wk + (c * KH + ky) * KW + kx];
            }
        }
    }
    return requantized(acc, oc);
}

ELEMENTS_MAIN(dst, PI(0), PI(22))
#endif
