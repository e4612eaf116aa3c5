// Vulkan prelude: API specifics only. Kernel bodies use BUFFER_*, PI/PF and GLOBAL_ID.
#version 450
#define API_VULKAN 1
// 8-/16-bit elements in storage buffers where the device has them (elements.glsl; the
// variant's defines come before this point, see compile.preprocess)
#ifdef STORAGE8
#extension GL_EXT_shader_8bit_storage : require
#endif
#ifdef STORAGE16
#extension GL_EXT_shader_16bit_storage : require
#endif
#extension GL_EXT_control_flow_attributes : enable
// the cooperative-matrix GEMM (gemm_coopmat.glsl): its products need the Vulkan memory model, its
// subgroups' ids and barriers, and float16_t for float16 tiles
#ifdef COOPMAT
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#ifndef CM_FLOAT32
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#endif
#endif
// SPIR-V instructions declared in GLSL: quantized_conv2d.comp -DINT8_DOT's integer dot products
#ifdef INT8_DOT
#extension GL_EXT_spirv_intrinsics : require
#endif

// Fully unroll a loop with a compile-time trip count (SPIR-V Unroll loop control, which Mesa's
// NIR honours): register-blocked kernels index their accumulator arrays with the loop counters,
// and one loop left rolled (e.g. a long epilogue over the size heuristic) makes the whole array
// dynamically indexed, i.e. spilled to memory, several times slower on lavapipe.
#define UNROLL [[unroll]]

// 32 x 32-bit parameters (128 bytes, the guaranteed push-constant minimum).
layout(push_constant) uniform PushConstants { int p[32]; } gpumnn_pc;
#define PI(i) gpumnn_pc.p[i]
#define PF(i) intBitsToFloat(gpumnn_pc.p[i])

// Storage buffers of float32, bound whole (element offsets come in the parameters).
#define BUFFER_RO(b, name) layout(std430, set = 0, binding = b) readonly buffer Buf##b { float name[]; }
#define BUFFER_WO(b, name) layout(std430, set = 0, binding = b) writeonly buffer Buf##b { float name[]; }
#define BUFFER_RW(b, name) layout(std430, set = 0, binding = b) buffer Buf##b { float name[]; }
// A binding seen as elements of another 32-bit type T (int for int32 tensors, uint to copy words).
#define BUFFER_RO_OF(T, b, name) layout(std430, set = 0, binding = b) readonly buffer Buf##b##T { T name[]; }
#define BUFFER_WO_OF(T, b, name) layout(std430, set = 0, binding = b) writeonly buffer Buf##b##T { T name[]; }
#define BUFFER_RW_OF(T, b, name) layout(std430, set = 0, binding = b) buffer Buf##b##T { T name[]; }
// A vec4 view of a binding (aliases the float view; element offsets must be multiples of 4).
#define BUFFER_RO_VEC4(b, name) layout(std430, set = 0, binding = b) readonly buffer Buf##b##v4 { vec4 name[]; }
