#!/usr/bin/env bash
# The main job: set up, then benchmark the bundled models on every backend that starts here,
# recorded and eager, in alternation with ONNX Runtime (median of repeats, with spread), charts
# into bench/png/; then the ncnn peer (models converted by pnnx; ncnn's CPU and Vulkan paths in
# alternation with gpumnn's cpu backend and ONNX Runtime) on the paper's three models.
# Extra arguments go to `gpumnn bench` (e.g. `bash bench/run.sh all --threads 2` for the whole zoo).
set -euo pipefail
cd "$(dirname "$0")/.."
./setup.sh
.venv/bin/gpumnn info
.venv/bin/gpumnn bench --backend all --progress --png bench/png "$@"
echo
echo "peer: ncnn on the paper's models (bench/ncnn_peer.py)"
.venv/bin/python bench/ncnn_peer.py --png bench/png
