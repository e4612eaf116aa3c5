#!/usr/bin/env bash
# The wheel is what users install: build it from the checkout's files, install it (not editable)
# into a fresh venv outside the checkout, and run gpumnn from outside it (.ci/wheel_smoke.py):
# every data file under gpumnn/ must be in the installed package, `gpumnn info` must work, and a
# zoo model must match ONNX Runtime on the cpu and on every GPU API that starts
# (GPUMNN_REQUIRE_BACKENDS: those must start). The cpu extra (Numba) is left out: its loops
# would compile afresh in every new venv.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
start=$SECONDS
work=$(mktemp -d "${TMPDIR:-/tmp}/gpumnn-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT

# a copy of the tracked and not ignored files, so that no stale build/ of the checkout leaks in
mkdir "$work/src"
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
  [ -e "$f" ] && printf '%s\0' "$f"
done | tar --null -T - -cf - | tar -xf - -C "$work/src"
# isolated, as pip builds it: the build-system's setuptools (from pip's cache once fetched)
"$PYTHON" -m build --wheel --outdir "$work/dist" "$work/src" >"$work/build.log" 2>&1 \
  || { cat "$work/build.log"; exit 1; }
wheel=$(ls "$work"/dist/gpumnn-*.whl)
echo "wheel-smoke: built $(basename "$wheel") ($((SECONDS - start)) s)"

# the data files the package must carry: every file under gpumnn/ that is not Python
git ls-files gpumnn | grep -v '\.py$' | sed 's|^gpumnn/||' >"$work/expected.txt"

"$PYTHON" -m venv "$work/venv"  # $PYTHON's interpreter, not its packages
"$work/venv/bin/python" -m pip install -q --disable-pip-version-check "$wheel[opencl,vulkan,gl]" onnxruntime \
  >"$work/pip.log" 2>&1 || { cat "$work/pip.log"; exit 1; }
echo "wheel-smoke: installed into a fresh venv ($((SECONDS - start)) s)"

mkdir "$work/run" && cp .ci/wheel_smoke.py "$work/run/"
# a cache of its own: the kernels compile from the installed sources, as on a user's first run
(cd "$work/run" && GPUMNN_CACHE_DIR="$work/cache" PATH="$work/venv/bin:$PATH" "$work/venv/bin/python" -I wheel_smoke.py "$work/expected.txt")
echo "wheel-smoke: passed ($((SECONDS - start)) s)"
