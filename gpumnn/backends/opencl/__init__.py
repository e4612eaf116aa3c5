"""The OpenCL backend (pyopencl): the OpenCL C kernels of backends.kernels.cl."""
