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


def test_harness_records_crash_hang_and_raw_exception_and_goes_on():
    """The harness itself: injected faults are recorded against their cases, the rest still run."""
    env = dict(os.environ, **{harness.INJECT: "crash:1,hang:2,raw:3"})
    run = harness.run_corpus(["cpu"], list(range(6)), SEED, env=env, case_timeout=3.0)
    kinds = {i: kind for i, (kind, _) in harness.outcomes(run, "cpu").items()}
    assert (kinds[1], kinds[2], kinds[3]) == ("crash", "hang", "raw"), kinds
    assert all(kinds[i] not in harness.DISALLOWED for i in (0, 4, 5)), kinds
    assert run.restarts["cpu"] == 2
    listed = harness.failures(run, "cpu")
    assert len(listed) == 3 and all("python tests/fuzz_corpus.py --case" in line for line in listed)
