"""Smoke test of an installed gpumnn wheel, run by .ci/wheel_smoke.sh from outside the checkout.

Argument: a file listing the package's data files (paths under gpumnn/), each of which must be
installed. Then `gpumnn info`, and squeezenet1_1 from the zoo on the cpu and on every GPU API
that starts, against ONNX Runtime. A backend named in GPUMNN_REQUIRE_BACKENDS must start.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

import gpumnn
from gpumnn import zoo
from gpumnn.backends import REGISTRY, probe

MODEL = "squeezenet1_1"
TOLERANCE = 1e-3  # relative L2 against ONNX Runtime


def main() -> int:
    package = Path(gpumnn.__file__).resolve().parent
    if "site-packages" not in package.parts:
        print(f"FAIL: gpumnn imported from {package}, not from an installed wheel")
        return 1
    expected = [line for line in Path(sys.argv[1]).read_text().splitlines() if line]
    missing = [name for name in expected if not (package / name).is_file()]
    if missing:
        print(f"FAIL: {len(missing)} of the checkout's data files are not in the wheel "
              "(pyproject.toml [tool.setuptools.package-data]):\n  " + "\n  ".join(missing))
        return 1
    print(f"{len(expected)} data files installed in {package}")

    info = subprocess.run(["gpumnn", "info"], capture_output=True, text=True)
    print(info.stdout + info.stderr, end="")
    if info.returncode != 0:
        print(f"FAIL: `gpumnn info` exited with {info.returncode}")
        return 1

    required = [b for b in os.environ.get("GPUMNN_REQUIRE_BACKENDS", "").split(",") if b]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        path = zoo.save(MODEL, Path(tmp) / f"{MODEL}.onnx")
        x = np.random.default_rng(0).random(zoo.input_shape(MODEL), dtype=np.float32)
        ref_session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feed = {ref_session.get_inputs()[0].name: x}
        reference = ref_session.run(None, feed)
        names = [o.name for o in ref_session.get_outputs()]
        net = gpumnn.load(path)
        for backend in REGISTRY:
            reason = probe(backend)
            if reason is not None:
                print(f"{backend:<7} not started: {reason}")
                if backend in required:
                    failures.append(f"{backend} is required here but cannot start: {reason}")
                continue
            t0 = time.perf_counter()
            try:
                with net.session(backend=backend, fallback=False) as session:
                    out = session.run(feed)
            except Exception as exc:  # the missing file or the failing kernel, named
                failures.append(f"{backend}: {type(exc).__name__}: {exc}")
                print(f"{backend:<7} FAILED: {type(exc).__name__}: {exc}")
                continue
            errors = [float(np.linalg.norm(out[n] - r) / max(np.linalg.norm(r), 1e-30)) for n, r in zip(names, reference)]
            ok = max(errors) < TOLERANCE
            print(f"{backend:<7} {MODEL}: relative L2 {max(errors):.2e} against ONNX Runtime "
                  f"({time.perf_counter() - t0:.1f} s) {'ok' if ok else 'FAILED'}")
            if not ok:
                failures.append(f"{backend}: relative L2 {max(errors):.2e} >= {TOLERANCE}")
    for failure in failures:
        print(f"FAIL: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
