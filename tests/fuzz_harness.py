"""Runs the fuzz corpus (fuzz_corpus.py) on several backends at once, each in its own worker process.

Why workers: a mutated model may crash the process (a segfault in a driver) or hang it, and
either must be recorded as that case's failure, not end the test run. Starting a process per
case costs ~0.5 s (imports, device start), so each backend (and ONNX Runtime, the reference,
which may crash too) gets one long-lived worker that takes case indices on its stdin and
answers one frame per case. The parent gives each case a deadline; on a crash (EOF) or a
missed deadline it records the case, kills the worker and starts a fresh one for the remaining
cases. Workers run under an address-space limit, so a huge-dimension case fails fast with a
memory error instead of taking the shared machine's memory.

Outcome of one case on one backend (``classify``):

    correct        gpumnn ran it, ONNX Runtime ran it, every output within rel L2 < 1e-3
    both_refuse    gpumnn raised a GpumnnError and ONNX Runtime refused the model too
    gpumnn_refuses gpumnn raised a GpumnnError, ONNX Runtime ran the model (allowed: e.g. unsupported)
    internal       gpumnn raised an InternalError: a bug of its own, not a refusal -- disallowed
    ort_refuses    gpumnn ran a model ONNX Runtime refuses (load runs onnx.checker) -- disallowed
    wrong          both ran it and the answers differ                        -- disallowed
    unrunnable     gpumnn accepted declared inputs that cannot exist          -- disallowed
    raw            an exception that is not a GpumnnError escaped             -- disallowed
    crash / hang   the worker died, or missed the case's deadline              -- disallowed
"""
from __future__ import annotations

import os
import pickle
import resource
import selectors
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REFERENCE = "ort"
TOLERANCE = 1e-3
#: per worker: private writable memory (RLIMIT_DATA), not address space: CUDA reserves address space
#: for the GPU's memory at start (unified addressing), so an RLIMIT_AS of 3 GiB made every cuda case
#: a refusal on an H100, while a runaway host allocation is private and writable and still stops here
MEMORY_LIMIT = 3 << 30
START_TIMEOUT = 60.0  # imports + device start on a busy 2-core machine
CASE_TIMEOUT = 20.0
DISALLOWED = ("ort_refuses", "wrong", "unrunnable", "internal", "raw", "crash", "hang")
COLUMNS = ("correct", "both_refuse", "gpumnn_refuses") + DISALLOWED


# -- frames: 4-byte length + pickle ---------------------------------------------------------------

def _write_frame(stream, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<I", len(data)) + data)
    stream.flush()


def _read_exact(stream, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = stream.read(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _read_frame(stream):
    head = _read_exact(stream, 4)
    if head is None:
        raise EOFError
    body = _read_exact(stream, struct.unpack("<I", head)[0])
    if body is None:
        raise EOFError
    return pickle.loads(body)


# -- the worker process ---------------------------------------------------------------------------

#: environment variable naming cases at which a worker misbehaves on purpose ("crash:3,hang:5,raw:7,internal:8"),
#: so that the test of the harness itself sees each failure recorded and the worker restarted
INJECT = "GPUMNN_FUZZ_INJECT"


def _inject(index: int) -> None:
    faults = dict(item.split(":")[::-1] for item in os.environ.get(INJECT, "").split(",") if item)
    fault = faults.get(str(index))
    if fault == "crash":
        os.abort()
    if fault == "hang":
        time.sleep(3600)
    if fault == "raw":
        raise KeyError("injected")
    if fault == "internal":
        from gpumnn.errors import InternalError
        cause = KeyError("injected")
        raise InternalError("lowering an injected node", cause) from cause


def _run_one(backend: str, index: int, seed: int):
    """(kind, payload) for one case: ok / gpumnn / internal / raw / unrunnable; ``ort`` runs the reference."""
    from fuzz_corpus import UnrunnableCase, make_case, run_gpumnn, run_onnxruntime

    import gpumnn
    case = make_case(index, seed)
    try:
        if backend != REFERENCE:
            _inject(index)
        outputs = run_onnxruntime(case) if backend == REFERENCE else run_gpumnn(case, backend)
    except UnrunnableCase as exc:
        return "unrunnable", str(exc)
    except gpumnn.InternalError as exc:  # a bug wrapped by a safety net: never a refusal
        cause = exc.__cause__ or exc
        return "internal", (type(cause).__name__, str(exc)[:500], _where(cause))
    except gpumnn.GpumnnError as exc:
        return "gpumnn", (type(exc).__name__, str(exc)[:500])
    except Exception as exc:  # noqa: BLE001 -- the point: record anything else that escapes
        return "raw", (f"{type(exc).__module__}.{type(exc).__name__}", str(exc)[:500], _where(exc))
    return "ok", outputs


def _where(exc: BaseException) -> str:
    """The innermost frames of ``exc``'s traceback, one line each."""
    frames = traceback.extract_tb(exc.__traceback__)[-5:]
    return "\n".join(f"      {Path(f.filename).name}:{f.lineno} in {f.name}: {f.line}" for f in frames)


def worker_main(backend: str, seed: int) -> None:
    """Serve case indices from stdin until EOF; the protocol owns the original stdout."""
    resource.setrlimit(resource.RLIMIT_DATA, (MEMORY_LIMIT, MEMORY_LIMIT))
    protocol = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints of drivers and libraries go to stderr, not into the frames
    sys.stdout = sys.stderr
    import warnings
    warnings.simplefilter("ignore")
    np.seterr(all="ignore")
    import gpumnn  # noqa: F401  (imported before "ready", so the first case's deadline is fair)
    if backend == REFERENCE:
        import onnxruntime  # noqa: F401
    _write_frame(protocol, ("ready", os.getpid()))
    while True:
        try:
            index = _read_frame(sys.stdin.buffer)
        except EOFError:
            return
        _write_frame(protocol, (index,) + _run_one(backend, index, seed))


class Worker:
    """One worker process for one backend, restarted after a crash or a hang."""

    def __init__(self, backend: str, seed: int, env: dict[str, str], case_timeout: float = CASE_TIMEOUT):
        self.backend, self.seed, self.env, self.case_timeout = backend, seed, env, case_timeout
        self.proc: subprocess.Popen | None = None
        self.stderr = None
        self.restarts = -1
        self.current: int | None = None
        self.deadline = 0.0
        self.sent_at = 0.0

    def start(self) -> None:
        if self.stderr is not None:  # a restart: the dead worker's log is no longer read
            self.stderr.close()
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", self.backend,
                                      "--seed", str(self.seed)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, env=self.env, start_new_session=True)
        self.restarts += 1
        self.current = None
        self.deadline = time.monotonic() + START_TIMEOUT

    def send(self, index: int) -> None:
        self.current = index
        self.sent_at = time.monotonic()
        self.deadline = self.sent_at + self.case_timeout
        _write_frame(self.proc.stdin, index)

    def stderr_tail(self, chars: int = 1500) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode("utf-8", "replace")[-chars:]

    def stop(self, kill: bool = False) -> int | None:
        """End the worker (its whole process group when killed); returns its exit status."""
        if self.proc is None:
            return None
        if kill and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, 9)
            except ProcessLookupError:
                pass
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            code = self.proc.wait()
        self.proc.stdout.close()
        self.proc = None
        return code


# -- the parent: schedule, collect, classify --------------------------------------------------------

@dataclass
class Result:
    """What one backend did with one case (``kind`` as in :func:`_run_one`, or crash / hang)."""

    kind: str
    payload: object = None
    seconds: float = 0.0


@dataclass
class FuzzRun:
    seed: int
    indices: list[int]
    results: dict[str, dict[int, Result]] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0


def run_corpus(backends: list[str], indices: list[int], seed: int, env: dict[str, str] | None = None,
               case_timeout: float = CASE_TIMEOUT) -> FuzzRun:
    """Every case on every backend and on ONNX Runtime, all workers at once."""
    started = time.monotonic()
    env = dict(os.environ if env is None else env)
    env.setdefault("PYTHONFAULTHANDLER", "1")
    names = [REFERENCE] + [b for b in backends if b != REFERENCE]
    run = FuzzRun(seed, list(indices), {b: {} for b in names})
    pending = {b: list(indices) for b in names}
    workers = {b: Worker(b, seed, env, case_timeout) for b in names}
    selector = selectors.DefaultSelector()
    ready: dict[str, bool] = {}

    def launch(worker: Worker) -> None:
        worker.start()
        ready[worker.backend] = False
        selector.register(worker.proc.stdout, selectors.EVENT_READ, worker)

    def feed(worker: Worker) -> None:
        if pending[worker.backend]:
            worker.send(pending[worker.backend].pop(0))
        else:
            selector.unregister(worker.proc.stdout)
            worker.stop()

    def fail(worker: Worker, kind: str, detail: str) -> None:
        selector.unregister(worker.proc.stdout)
        code = worker.stop(kill=True)
        if worker.current is not None:
            run.results[worker.backend][worker.current] = Result(
                kind, f"{detail} (exit status {code}); worker stderr: ...{worker.stderr_tail()}")
        elif not ready[worker.backend]:  # the worker cannot even start: every remaining case fails
            for index in pending[worker.backend]:
                run.results[worker.backend][index] = Result("crash", f"worker did not start ({detail}, exit {code}): "
                                                            f"{worker.stderr_tail()}")
            pending[worker.backend] = []
        if pending[worker.backend]:
            launch(worker)

    for worker in workers.values():
        launch(worker)
    while selector.get_map():
        now = time.monotonic()
        timeout = max(0.0, min(w.deadline for w in (k.data for k in selector.get_map().values())) - now)
        for key, _ in selector.select(timeout=timeout):
            worker: Worker = key.data
            try:
                frame = _read_frame(worker.proc.stdout)
            except (EOFError, pickle.UnpicklingError) as exc:
                fail(worker, "crash", f"worker ended during the case: {type(exc).__name__}")
                continue
            if frame[0] == "ready":
                ready[worker.backend] = True
            else:
                index, kind, payload = frame
                run.results[worker.backend][index] = Result(kind, payload, time.monotonic() - worker.sent_at)
            feed(worker)
        now = time.monotonic()
        for key in list(selector.get_map().values()):
            worker = key.data
            if now > worker.deadline:
                limit = case_timeout if worker.current is not None else START_TIMEOUT
                fail(worker, "hang", f"no answer within {limit:.0f} s")
    run.restarts = {b: w.restarts for b, w in workers.items()}
    run.seconds = time.monotonic() - started
    return run


def compare(got: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> str | None:
    """None when every output matches ONNX Runtime (names, shapes, rel L2 < TOLERANCE), else why not."""
    if set(got) != set(ref):
        return f"outputs {sorted(got)} != ONNX Runtime's {sorted(ref)}"
    for name, want in ref.items():
        have = np.asarray(got[name])
        want = np.asarray(want)
        if have.shape != want.shape:
            return f"output {name!r}: shape {list(have.shape)} != ONNX Runtime's {list(want.shape)}"
        if want.dtype == object or have.dtype == object:
            if not np.array_equal(have, want):
                return f"output {name!r}: values differ"
            continue
        a, b = have.astype(np.float64), want.astype(np.float64)
        # Where the reference is NaN any value is accepted: GLSL and OpenCL leave NaN propagation
        # through min/max (Relu, pooling, Clip) to the implementation. Infinities must match.
        nan, inf = np.isnan(b), np.isinf(b)
        if not np.array_equal(a[inf], b[inf]) or np.any(~np.isfinite(a) & ~nan & ~inf):
            return f"output {name!r}: Inf/NaN where ONNX Runtime's output is finite, or different infinities"
        a, b = np.where(nan | inf, 0.0, a), np.where(nan | inf, 0.0, b)
        err = float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-12))
        if not err < TOLERANCE:
            return f"output {name!r}: relative L2 error {err:.2e} against ONNX Runtime"
    return None


def classify(result: Result, reference: Result) -> tuple[str, str]:
    """(outcome, detail) of one backend's result given ONNX Runtime's on the same case."""
    ort_runs = reference.kind == "ok"
    if result.kind in ("crash", "hang"):
        return result.kind, str(result.payload)
    if result.kind in ("raw", "internal"):
        kind, message, where = result.payload
        return result.kind, f"{kind}: {message}\n{where}"
    if result.kind == "unrunnable":
        return "unrunnable", str(result.payload)
    if result.kind == "gpumnn":
        kind, message = result.payload
        return ("gpumnn_refuses" if ort_runs else "both_refuse"), f"{kind}: {message}"
    if not ort_runs:
        return "ort_refuses", f"ONNX Runtime: {_reference_detail(reference)}"
    verdict = compare(result.payload, reference.payload)
    return ("wrong", verdict) if verdict else ("correct", "")


def _reference_detail(reference: Result) -> str:
    if reference.kind == "raw":
        return f"{reference.payload[0]}: {reference.payload[1][:200]}"
    return f"{reference.kind}: {str(reference.payload)[:200]}"


def outcomes(run: FuzzRun, backend: str) -> dict[int, tuple[str, str]]:
    """Per case index: (outcome, detail) on ``backend``."""
    ref = run.results[REFERENCE]
    return {i: classify(run.results[backend][i], ref[i]) for i in run.indices}


def error_classes(run: FuzzRun, backend: str) -> Counter:
    """gpumnn error class -> count; InternalErrors (bugs the safety nets wrapped) count as
    'InternalError (<cause>)'."""
    return Counter(r.payload[0] if r.kind == "gpumnn" else f"InternalError ({r.payload[0]})"
                   for r in run.results[backend].values() if r.kind in ("gpumnn", "internal"))


def summary(run: FuzzRun, backends: list[str]) -> str:
    """The outcome table per backend, then gpumnn's error classes per backend."""
    head = f"{'backend':<8} {'cases':>5} " + " ".join(f"{c:>14}" for c in COLUMNS) + f" {'restarts':>8} {'max s':>6}"
    lines = [f"fuzz corpus: seed {run.seed}, {len(run.indices)} cases x {len(backends)} backends, "
             f"{run.seconds:.1f} s wall", head]
    for b in backends:
        counts = Counter(kind for kind, _ in outcomes(run, b).values())
        slowest = max((r.seconds for r in run.results[b].values()), default=0.0)
        lines.append(f"{b:<8} {len(run.indices):>5} " + " ".join(f"{counts[c]:>14}" for c in COLUMNS)
                     + f" {run.restarts.get(b, 0):>8} {slowest:>6.2f}")
    ref = Counter(r.kind for r in run.results[REFERENCE].values())
    lines.append(f"onnxruntime: runs {ref['ok']}, refuses {sum(ref.values()) - ref['ok']} "
                 f"(crash {ref['crash']}, hang {ref['hang']})")
    for b in backends:
        classes = error_classes(run, b)
        lines.append(f"{b} gpumnn errors: " + (", ".join(f"{k} {v}" for k, v in classes.most_common()) or "none"))
    return "\n".join(lines)


def failures(run: FuzzRun, backend: str, disallowed=DISALLOWED) -> list[str]:
    """One reproducible line (plus detail) per disallowed outcome on ``backend``."""
    from fuzz_corpus import make_case
    lines = []
    for index, (kind, detail) in sorted(outcomes(run, backend).items()):
        if kind in disallowed:
            case = make_case(index, run.seed)
            lines.append(f"[{backend}] {kind.upper()} {case.label}\n    {detail.strip()[:1500]}\n"
                         f"    rerun: python tests/fuzz_corpus.py --case {index} --backend {backend} --seed {run.seed}")
    return lines


def _main(argv: list[str] | None = None) -> int:
    import argparse
    parser = argparse.ArgumentParser(description="Run the fuzz corpus on several backends and print the outcomes.")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--cases", type=int, default=None, help="number of cases (default: the test's)")
    parser.add_argument("--backends", default="cpu,opencl,vulkan,gl")
    parser.add_argument("--show", default=",".join(DISALLOWED), help="outcomes to list case by case")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE.parent))
    sys.path.insert(0, str(HERE))
    from fuzz_corpus import CASES, SEED
    seed = SEED if args.seed is None else args.seed
    if args.worker:
        worker_main(args.worker, seed)
        return 0
    backends = [b for b in args.backends.split(",") if b]
    run = run_corpus(backends, list(range(CASES if args.cases is None else args.cases)), seed)
    print(summary(run, backends))
    shown = tuple(s for s in args.show.split(",") if s)
    bad = [line for b in backends for line in failures(run, b, shown)]
    print("\n".join(bad))
    return 1 if any(line for b in backends for line in failures(run, b)) else 0


if __name__ == "__main__":
    sys.exit(_main())
