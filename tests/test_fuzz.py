"""Fuzz: mutated models (tests/fuzz_corpus.py) get a gpumnn error or ONNX Runtime's answer, on every backend.

Every case runs load -> session -> run in a worker process per backend (tests/fuzz_harness.py),
so a segfault or a hang is recorded against its case instead of ending the test run. The test
of one backend fails listing each disallowed outcome (wrong answer, raw exception, crash, hang,
accepted impossible input) with its mutation and the command that reruns it alone. The
outcome table of all backends is printed once per run.
"""
from __future__ import annotations

import os
from collections import Counter

import numpy as np
import pytest

import fuzz_harness as harness
from fuzz_corpus import CASES, SEED
from gpumnn.backends import REGISTRY, probe

def _selected_backends(session: pytest.Session) -> list[str]:
    """The backends whose fuzz test runs in this session (all of them under plain pytest)."""
    chosen = [item.callspec.params["backend"] for item in session.items
              if getattr(item, "originalname", "") == "test_fuzz_corpus" and hasattr(item, "callspec")]
    return [b for b in REGISTRY if b in chosen and probe(b) is None]


@pytest.fixture(scope="module")
def fuzz_run(request):
    """One run of the corpus on every selected backend at once (workers overlap on the cores)."""
    backends = _selected_backends(request.session)
    run = harness.run_corpus(backends, list(range(CASES)), SEED)
    lines = [harness.summary(run, backends)]
    reporter = request.config.pluginmanager.getplugin("terminalreporter")
    capture = request.config.pluginmanager.getplugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():  # the table is the point of the run: show it under -q too
            reporter.ensure_newline()
            reporter.write_line("\n".join(lines))
    return run, backends


def test_fuzz_corpus(backend, fuzz_run):
    run, backends = fuzz_run
    assert backend in backends, f"the fuzz run did not include {backend!r}"
    # the corpus must exercise answers too, not only refusals (a broken reference would hide wrong ones)
    ran = Counter(kind for kind, _ in harness.outcomes(run, backend).values())
    assert ran["correct"] >= len(run.indices) // 5, f"only {ran['correct']} cases were compared with ONNX Runtime"
    problems = harness.failures(run, backend)
    assert not problems, (f"{len(problems)} of {len(run.indices)} fuzz cases failed on {backend}:\n"
                          + "\n".join(problems))


def test_harness_records_crash_hang_raw_and_internal_errors_and_goes_on():
    """The harness itself: injected faults are recorded against their cases, the rest still run."""
    env = dict(os.environ, **{harness.INJECT: "crash:1,hang:2,raw:3,internal:4"})
    run = harness.run_corpus(["cpu"], list(range(7)), SEED, env=env, case_timeout=3.0)
    kinds = {i: kind for i, (kind, _) in harness.outcomes(run, "cpu").items()}
    assert (kinds[1], kinds[2], kinds[3], kinds[4]) == ("crash", "hang", "raw", "internal"), kinds
    assert all(kinds[i] not in harness.DISALLOWED for i in (0, 5, 6)), kinds
    assert run.restarts["cpu"] == 2
    listed = harness.failures(run, "cpu")
    assert len(listed) == 4 and all("python tests/fuzz_corpus.py --case" in line for line in listed)
    assert "InternalError (KeyError)" in harness.error_classes(run, "cpu")


def _result(kind, payload=None):
    return harness.Result(kind, payload, 0.0)


def test_compare_finds_every_kind_of_wrong_answer():
    """compare() is what turns a wrong answer into a failure: each way an output can differ is caught."""
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    assert harness.compare({"y": x.copy()}, {"y": x}) is None
    assert harness.compare({"y": x * (1 + 5e-4)}, {"y": x}) is None  # inside the tolerance
    wrong = {
        "values": ({"y": x * 1.01}, "relative L2 error"),
        "one element": ({"y": np.where(np.arange(12).reshape(3, 4) == 5, 7.0, x)}, "relative L2 error"),
        "shape": ({"y": x.reshape(4, 3)}, "shape [4, 3]"),
        "names": ({"z": x}, "outputs ['z']"),
        "NaN": ({"y": np.where(x > 0.5, np.nan, x)}, "Inf/NaN"),
        "infinity": ({"y": np.where(x > 0.5, np.inf, x)}, "Inf/NaN"),
    }
    for what, (got, message) in wrong.items():
        verdict = harness.compare(got, {"y": x})
        assert verdict is not None and message in verdict, (what, verdict)
    # NaN in the reference accepts any value there (GLSL/OpenCL min/max); a differing infinity does not
    ref = np.array([np.nan, np.inf, 1.0], np.float32)
    assert harness.compare({"y": np.array([3.0, np.inf, 1.0], np.float32)}, {"y": ref}) is None
    assert harness.compare({"y": np.array([3.0, -np.inf, 1.0], np.float32)}, {"y": ref}) is not None
    strings = np.array(["a", "b"], dtype=object)
    assert harness.compare({"s": strings}, {"s": strings.copy()}) is None
    assert "values differ" in harness.compare({"s": strings[::-1]}, {"s": strings})


def test_classify_maps_each_result_to_its_outcome():
    """classify(): a wrong answer, an internal error, and gpumnn running what ONNX Runtime refuses are
    failures; refusals by both, or by gpumnn alone, are not."""
    x = {"y": np.ones((2, 2), np.float32)}
    ort_runs, ort_refuses = _result("ok", x), _result("raw", ("onnxruntime.Fail", "bad model", ""))
    expected = [
        (_result("ok", x), ort_runs, "correct"),
        (_result("ok", {"y": 2 * x["y"]}), ort_runs, "wrong"),
        (_result("ok", x), ort_refuses, "ort_refuses"),
        (_result("gpumnn", ("ModelError", "bad")), ort_refuses, "both_refuse"),
        (_result("gpumnn", ("UnsupportedOpError", "no")), ort_runs, "gpumnn_refuses"),
        (_result("internal", ("KeyError", "a bug", "")), ort_runs, "internal"),
        (_result("internal", ("KeyError", "a bug", "")), ort_refuses, "internal"),
        (_result("raw", ("builtins.KeyError", "k", "")), ort_runs, "raw"),
        (_result("unrunnable", "huge"), ort_refuses, "unrunnable"),
        (_result("crash", "exit -6"), ort_runs, "crash"),
        (_result("hang", "20 s"), ort_runs, "hang"),
    ]
    for result, reference, outcome in expected:
        assert harness.classify(result, reference)[0] == outcome, (result, reference)
    assert set(harness.DISALLOWED) == {"ort_refuses", "wrong", "unrunnable", "internal", "raw", "crash", "hang"}
