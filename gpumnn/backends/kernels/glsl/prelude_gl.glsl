// OpenGL (4.3+) prelude: the same kernel bodies as Vulkan, parameters in a uniform array.
#version 430
#define API_GL 1
// 8-/16-bit elements in storage buffers where the device has them (elements.glsl; the
// variant's defines come before this point, see compile.preprocess)
#ifdef STORAGE8
#extension GL_EXT_shader_8bit_storage : require
#endif
#ifdef STORAGE16
#extension GL_EXT_shader_16bit_storage : require
#endif

// No portable unroll hint in GLSL 4.30: drivers unroll constant-trip loops by their heuristics.
#define UNROLL

uniform int gpumnn_params[32];
#define PI(i) gpumnn_params[i]
#define PF(i) intBitsToFloat(gpumnn_params[i])

#define BUFFER_RO(b, name) layout(std430, binding = b) readonly buffer Buf##b { float name[]; }
#define BUFFER_WO(b, name) layout(std430, binding = b) writeonly buffer Buf##b { float name[]; }
#define BUFFER_RW(b, name) layout(std430, binding = b) buffer Buf##b { float name[]; }
// A binding seen as elements of another 32-bit type T (int for int32 tensors, uint to copy words).
#define BUFFER_RO_OF(T, b, name) layout(std430, binding = b) readonly buffer Buf##b##T { T name[]; }
#define BUFFER_WO_OF(T, b, name) layout(std430, binding = b) writeonly buffer Buf##b##T { T name[]; }
#define BUFFER_RW_OF(T, b, name) layout(std430, binding = b) buffer Buf##b##T { T name[]; }
// A vec4 view of a binding (aliases the float view; element offsets must be multiples of 4).
#define BUFFER_RO_VEC4(b, name) layout(std430, binding = b) readonly buffer Buf##b##v4 { vec4 name[]; }
