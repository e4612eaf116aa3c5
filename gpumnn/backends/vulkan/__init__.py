"""The Vulkan backend (``vulkan``): the GLSL kernels of ``backends.kernels.glsl`` as SPIR-V."""
