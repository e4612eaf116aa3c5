"""OpenCL C kernel sources (also CUDA's, behind prelude_cuda.h) and their API-neutral planner."""
