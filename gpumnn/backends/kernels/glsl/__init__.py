"""GLSL kernel sources, the per-API preludes, the SPIR-V compiler and the API-neutral planner."""
