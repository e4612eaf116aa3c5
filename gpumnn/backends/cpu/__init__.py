"""The cpu backend: NumPy reference kernels, compiled loops (Numba) and native parallel regions."""
