// Elements of any storage dtype in storage buffers, as their bits in a uint: 32-bit words
// (float32, int32), or the 16-bit (float16) and 8-bit (int8, uint8) elements of the narrow
// dtypes. -DIN_BYTES / -DOUT_BYTES give the element size of a kernel's input and output
// bindings (4 when absent). A device with 8-/16-bit storage in buffers gets -DSTORAGE8 /
// -DSTORAGE16 (the prelude enables GL_EXT_shader_8bit_storage / GL_EXT_shader_16bit_storage)
// and its bindings are uint8_t / uint16_t arrays; elsewhere a narrow binding is an array of
// uint words holding 4 (2) elements, low bytes first (the same bytes, so transfers are plain
// byte copies: every tensor starts on a word and owns its last word, see gpumnn.atomic).
// A packed output is written either by whole words (ELEMENTS_MAIN below: one invocation per
// word of a contiguous output, so no invocations share a word) or element by element with a
// compare-and-swap on its word (OUT_STORE, for the scattered writes of a strided Raster and
// Scatter), so that neighbouring elements written by other invocations are never lost.
#ifndef GPUMNN_ELEMENTS
#define GPUMNN_ELEMENTS 1

#ifndef IN_BYTES
#define IN_BYTES 4
#endif
#ifndef OUT_BYTES
#define OUT_BYTES 4
#endif

#if IN_BYTES == 4
#define IN_T uint
#define IN_LOAD(a, i) a[i]
#elif IN_BYTES == 1 && defined(STORAGE8)
#define IN_T uint8_t
#define IN_LOAD(a, i) uint(a[i])
#elif IN_BYTES == 2 && defined(STORAGE16)
#define IN_T uint16_t
#define IN_LOAD(a, i) uint(a[i])
#else
#define IN_PACKED 1
#define IN_T uint
#define IN_SHIFT (IN_BYTES == 1 ? 2 : 1)
#define IN_LOAD(a, i) bitfieldExtract(a[(i) >> IN_SHIFT], ((i) & ((1 << IN_SHIFT) - 1)) * (8 * IN_BYTES), 8 * IN_BYTES)
#endif

#if OUT_BYTES == 4
#define OUT_T uint
#define OUT_STORE(a, i, v) a[i] = (v)
#elif OUT_BYTES == 1 && defined(STORAGE8)
#define OUT_T uint8_t
#define OUT_STORE(a, i, v) a[i] = uint8_t(v)
#elif OUT_BYTES == 2 && defined(STORAGE16)
#define OUT_T uint16_t
#define OUT_STORE(a, i, v) a[i] = uint16_t(v)
#else
#define OUT_PACKED 1
#define OUT_T uint
#define OUT_SHIFT (OUT_BYTES == 1 ? 2 : 1)
#define OUT_PER_WORD (1 << OUT_SHIFT)
#define OUT_MASK (OUT_BYTES == 1 ? 0xffu : 0xffffu)
// element i of the packed array a becomes the low bits of v; the rest of its word is kept
#define OUT_STORE(a, i, v) {                                                                   \
    int w_ = (i) >> OUT_SHIFT;                                                                  \
    int at_ = ((i) & (OUT_PER_WORD - 1)) * (8 * OUT_BYTES);                                     \
    uint bits_ = (v);                                                                           \
    uint old_ = a[w_];                                                                          \
    for (;;) {                                                                                  \
        uint seen_ = atomicCompSwap(a[w_], old_, bitfieldInsert(old_, bits_, at_, 8 * OUT_BYTES)); \
        if (seen_ == old_) break;                                                               \
        old_ = seen_;                                                                           \
    }                                                                                           \
}
#endif

// The binding of a kernel's input / output (a packed output is read too: its edge words keep
// the bytes outside the output, and OUT_STORE swaps whole words).
#define IN_BUFFER(b, name) BUFFER_RO_OF(IN_T, b, name)
#ifdef OUT_PACKED
#define OUT_BUFFER(b, name) BUFFER_RW_OF(OUT_T, b, name)
#else
#define OUT_BUFFER(b, name) BUFFER_WO_OF(OUT_T, b, name)
#endif
#define OUT_BUFFER_RW(b, name) BUFFER_RW_OF(OUT_T, b, name)

// main() of a kernel whose output is `count` contiguous elements of binding `dst` from element
// `out_off`, element i (0 <= i < count) being uint element(int i) (defined before): one
// invocation per element, or for a packed output one per destination word of the range
// (the host dispatches ELEMENT_WORDS of them).
#ifdef OUT_PACKED
#define ELEMENTS_MAIN(dst, count, out_off)                                                      \
void main() {                                                                                   \
    int o_ = (out_off), n_ = (count);                                                           \
    int w_ = (o_ >> OUT_SHIFT) + GLOBAL_ID();                                                   \
    int e_ = w_ << OUT_SHIFT;                                                                   \
    if (e_ >= o_ + n_) return;                                                                  \
    uint word_ = 0u, keep_ = 0u;                                                                \
    for (int k_ = 0; k_ < OUT_PER_WORD; ++k_) {                                                 \
        int i_ = e_ + k_ - o_;                                                                  \
        if (i_ >= 0 && i_ < n_) word_ |= (element(i_) & OUT_MASK) << (k_ * 8 * OUT_BYTES);     \
        else keep_ |= OUT_MASK << (k_ * 8 * OUT_BYTES);                                         \
    }                                                                                           \
    if (keep_ != 0u) word_ |= dst[w_] & keep_;                                                  \
    dst[w_] = word_;                                                                            \
}
#else
#define ELEMENTS_MAIN(dst, count, out_off)                                                      \
void main() {                                                                                   \
    int i_ = GLOBAL_ID();                                                                       \
    if (i_ >= (count)) return;                                                                  \
    OUT_STORE(dst, (out_off) + i_, element(i_));                                                \
}
#endif

#endif
