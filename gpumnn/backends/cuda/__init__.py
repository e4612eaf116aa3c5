"""The CUDA backend (CuPy): the OpenCL C kernels of backends.kernels.cl compiled by NVRTC."""
