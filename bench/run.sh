#!/usr/bin/env bash
# The main job: set up, then benchmark the bundled models on every backend that starts here,
# recorded and eager, with ONNX Runtime timed in the same run. Extra arguments go to `gpumnn bench`
# (e.g. `bash bench/run.sh all --threads 2` for the whole zoo).
set -euo pipefail
cd "$(dirname "$0")/.."
./setup.sh
.venv/bin/gpumnn info
exec .venv/bin/gpumnn bench --backend all --progress "$@"
