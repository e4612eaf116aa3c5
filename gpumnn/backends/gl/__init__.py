"""The OpenGL compute backend (moderngl): the GLSL kernels of ``backends.kernels.glsl``."""
