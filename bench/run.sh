#!/usr/bin/env bash
# The main job: set up, then benchmark the bundled models on every backend that starts here,
# recorded and eager, with ONNX Runtime timed in the same run; then the ncnn peer (CPU and its
# Vulkan path) on the paper's three models. Extra arguments go to `gpumnn bench`
# (e.g. `bash bench/run.sh all --threads 2` for the whole zoo).
set -euo pipefail
cd "$(dirname "$0")/.."
./setup.sh
.venv/bin/gpumnn info
.venv/bin/gpumnn bench --backend all --progress "$@"
echo
echo "peer: ncnn on the same models (bench/ncnn_peer.py)"
.venv/bin/python bench/ncnn_peer.py
