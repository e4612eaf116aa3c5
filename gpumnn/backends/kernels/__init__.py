"""Kernel sources and their planners, shared by the APIs: ``cl/`` (OpenCL C, for OpenCL and CUDA) and ``glsl/`` (GLSL, for Vulkan and GL)."""
