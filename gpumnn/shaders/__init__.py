"""Kernel sources (OpenCL C in ``opencl/``, GLSL in ``glsl/``) and the GLSL -> SPIR-V compiler."""
