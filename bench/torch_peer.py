"""PyTorch as a peer: the zoo's ONNX converted by onnx2torch, timed in alternation with gpumnn.

Issue 9 part 4 asks for gpumnn beside PyTorch *in one process on the same graphs*: each zoo
model's ONNX (the bytes gpumnn runs) becomes a ``torch.nn.Module`` through ``onnx2torch``, and
every output is compared with ONNX Runtime's (relative L2), so a conversion that changed the
model shows in the error column instead of hiding in the timings.

Timed series, one figure each per repeat in turn (:func:`gpumnn.tools.benchmark.alternate`: 1 warm-up,
mean of ``--runs`` runs; cells are medians over ``--repeats`` with the min-max spread, ratios
medians of per-repeat ratios):

* ``<backend>-recorded`` and ``<backend>-eager``: gpumnn on each requested backend that starts;
* ``torch-eager``: the module called under ``torch.no_grad`` on ``--torch-device`` (CUDA where
  PyTorch sees a GPU, else the CPU at ``--threads`` threads);
* ``torch-graph`` (CUDA only): the module captured into a ``torch.cuda.CUDAGraph`` after warm-up
  on a side stream; a run copies the input into the static input tensor, replays, copies out.

Every timed call ends with its results where the caller can use them: ``--io host`` (default,
gpumnn's ``run()`` contract) feeds NumPy and returns NumPy on every series, so the copies in and
out are timed alike; ``--io device`` feeds a CUDA tensor and keeps the outputs on the GPU for
gpumnn's cuda backend and PyTorch (the other gpumnn backends take host arrays only), with
``torch.cuda.synchronize()`` inside every timed call. The ratios of issue 9's targets are
printed beside their target, never asserted.

PyTorch's precision is gpumnn's: ``--torch-precision fp32`` (default) turns TF32 off in cuDNN's
convolutions and cuBLAS's products, as gpumnn's float32 kernels use none; ``tf32`` keeps PyTorch's
defaults (TF32 convolutions), for comparison with gpumnn's ``--precision tf32`` (the series
``cuda-tf32-recorded`` and ``cuda-tf32-eager``, on the backends that have it).

    python bench/torch_peer.py [models...|all] [--backend all] [--io host|device] [--runs 10]
                               [--repeats 5] [--threads N] [--precision fp32 [tf32]]
                               [--torch-precision fp32|tf32] [--json] [--png DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gpumnn import zoo  # noqa: E402
from gpumnn.tools.benchmark import (BenchRow, add_protocol_arguments, alternate, load_model,  # noqa: E402
                              onnxruntime_runner, rel_l2, resolve_backends, rows_as_dicts)



class PeerUnavailable(RuntimeError):
    """torch or onnx2torch is not importable here (the message says which and how to install it)."""


def require_torch() -> tuple[Any, Any]:
    """(torch, onnx2torch), or PeerUnavailable saying what is missing. onnx2torch imports
    torchvision (for NonMaxSuppression), so a torchvision built for another torch fails here too."""
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - ImportError, or a broken native library
        raise PeerUnavailable(f"torch is not importable ({type(exc).__name__}: {exc}): pip install torch") from exc
    try:
        import onnx2torch
    except Exception as exc:  # noqa: BLE001
        raise PeerUnavailable(f"onnx2torch is not importable ({type(exc).__name__}: {exc}): pip install onnx2torch "
                              "(it needs the torchvision built for the installed torch)") from exc
    return torch, onnx2torch


@dataclass(frozen=True)
class Target:
    """One of issue 9's targets: the ratio ``numerator / denominator`` at most ``bound``."""

    numerator: str
    denominator: str
    bound: float
    models: tuple[str, ...] | None = None  # None: every model

    def applies(self, model: str) -> bool:
        return self.models is None or model in self.models


PAPER = ("resnet18", "mobilenet_v1", "squeezenet1_1")
#: Issue 9's targets (batch 1 on an H100), printed beside the figures, never asserted.
TARGETS = (
    Target("cuda-recorded", "torch-graph", 1.0, PAPER),
    Target("cuda-recorded", "torch-eager", 1 / 3, PAPER),
    *(Target(f"{b}-recorded", f"{b}-eager", 0.5) for b in ("cuda", "vulkan", "gl")),
    Target("vulkan-recorded", "cuda-recorded", 1.5),
)


def series_for(backends: Sequence[str], graph: bool) -> list[str]:
    """Timed series in alternation order: gpumnn per backend (recorded, eager), then PyTorch."""
    names = [f"{b}-{mode}" for b in backends for mode in ("recorded", "eager")]
    return names + ["torch-eager"] + (["torch-graph"] if graph else [])


def ratios_for(backends: Sequence[str], graph: bool) -> list[tuple[str, str]]:
    """Ratio columns: recorded/eager per backend, gpumnn vs PyTorch for the fastest pairing each
    backend has, and vulkan/cuda; the targets' ratios are among them where their series exist."""
    series = set(series_for(backends, graph))
    ratios = [(f"{b}-recorded", f"{b}-eager") for b in backends]
    for b in backends:
        ratios += [(f"{b}-recorded", "torch-graph"), (f"{b}-recorded", "torch-eager")]
    ratios += [(f"{b}-recorded", "cuda-recorded") for b in backends if b not in ("cuda", "cpu")]
    return [r for r in dict.fromkeys(ratios) if r[0] in series and r[1] in series]


def to_host(value: Any) -> np.ndarray:
    """A NumPy copy of a run's first output: NumPy, CuPy (``.get()``) or a torch tensor."""
    if isinstance(value, dict):
        value = next(iter(value.values()))
    if isinstance(value, (tuple, list)):
        value = value[0]
    if hasattr(value, "detach"):
        return value.detach().cpu().numpy()
    if hasattr(value, "get") and not isinstance(value, np.ndarray):
        return value.get()
    return np.asarray(value)


def torch_runners(module: Any, x: np.ndarray, device: Any, device_io: bool) -> dict[str, Callable[[], Any]]:
    """``{"torch-eager": fn, "torch-graph": fn}`` (graph on CUDA only): each call takes ``x`` (a
    host array, or a tensor already on ``device`` with ``device_io``) and returns the output on the
    host (or on the device with ``device_io``), synchronised."""
    import torch
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    host_x = torch.from_numpy(np.ascontiguousarray(x))
    dev_x = host_x.to(device)
    source = dev_x if device_io else host_x
    finish = (lambda y: y) if device_io else (lambda y: y.cpu().numpy())

    def eager() -> Any:
        with torch.no_grad():
            y = finish(module(source.to(device)))
        sync()
        return y

    runners: dict[str, Callable[[], Any]] = {"torch-eager": eager}
    if cuda:
        static_in = dev_x.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(side):
            for _ in range(3):  # cuDNN/cuBLAS choose their algorithms and workspaces outside the capture
                module(static_in)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph):
            static_out = module(static_in)

        def replay() -> Any:
            static_in.copy_(source)
            graph.replay()
            y = finish(static_out)
            sync()
            return y

        runners["torch-graph"] = replay
    return runners


def series_label(backend: str, precision: str) -> str:
    """The name of gpumnn's series on ``backend`` in ``precision``: the backend's name in fp32,
    ``<backend>-<precision>`` otherwise (``cuda-tf32``)."""
    return backend if precision == "fp32" else f"{backend}-{precision}"


def labels_for(backends: Sequence[str], precisions: Sequence[str]) -> list[tuple[str, str, str]]:
    """(label, backend, precision) of each gpumnn series pair: every backend in fp32, and in each
    other precision asked for on the backends that have it (``gpumnn.scheduler.precision``)."""
    from gpumnn.scheduler.precision import backend_options
    out = []
    for backend in backends:
        for precision in precisions:
            try:
                backend_options(precision, backend)
            except ValueError:
                continue
            out.append((series_label(backend, precision), backend, precision))
    return out


def gpumnn_runners(net: Any, backend: str, feed: dict, threads: int, device_feed: dict | None,
                   sync: Callable[[], None], sessions: list, precision: str = "fp32") -> dict[str, Callable[[], Any]]:
    """``{"<label>-recorded": fn, "<label>-eager": fn}`` (``series_label``); sessions opened are
    appended to ``sessions`` (the caller closes them). With ``device_feed`` (cuda only) runs take
    and return device arrays."""
    runners = {}
    label = series_label(backend, precision)
    for mode, record in (("recorded", True), ("eager", False)):
        sess = net.session(backend=backend, threads=threads, record=record, fallback=False, precision=precision)
        sessions.append(sess)
        if device_feed is not None and backend == "cuda":
            def run(sess=sess) -> Any:
                y = sess.run(device_feed, outputs="device")
                sync()
                return y
        else:
            def run(sess=sess) -> Any:
                return sess.run(feed)
        runners[f"{label}-{mode}"] = run
    return runners


def peer_row(model: str, backends: Sequence[str], torch_device: str, device_io: bool, threads: int,
             runs: int, warmup: int, repeats: int, pause: float = 0.0,
             precisions: Sequence[str] = ("fp32",)) -> BenchRow:
    """One model: gpumnn on each backend (recorded and eager, in each of ``precisions`` the
    backend has) and PyTorch (eager, and CUDA-graph replay on CUDA) timed in alternation, with
    each series' error against ONNX Runtime."""
    torch, onnx2torch = require_torch()
    import onnx
    net, model_bytes, feed = load_model(model)
    (x,) = feed.values()
    ort = onnxruntime_runner(model_bytes, threads)
    if ort is None:
        raise PeerUnavailable("onnxruntime (the reference) is not installed")
    reference = ort(feed)
    device = torch.device(torch_device)
    row = BenchRow(model, torch_device, device=torch_device_name(torch, device))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    device_feed = None
    if device_io:
        device_feed = {name: torch.from_numpy(np.ascontiguousarray(v)).to(device) for name, v in feed.items()}
    notes, sessions, fns = [], [], {}
    try:
        for label, backend, precision in labels_for(backends, precisions):
            try:
                backend_fns = gpumnn_runners(net, backend, feed, threads, device_feed, sync, sessions, precision)
                for series, fn in backend_fns.items():
                    row.rel_errors[series] = rel_l2(to_host(fn()), reference)
                fns.update(backend_fns)
            except Exception as exc:  # one failing backend must not hide the others' figures
                notes.append(f"{label} failed: {type(exc).__name__}: {exc}"[:160])
        try:
            module = onnx2torch.convert(onnx.load_from_string(model_bytes)).eval().to(device)
            torch_fns = torch_runners(module, x, device, device_io)
            for series, fn in torch_fns.items():
                row.rel_errors[series] = rel_l2(to_host(fn()), reference)
            fns.update(torch_fns)
        except Exception as exc:  # a conversion onnx2torch does not do, a capture that fails
            notes.append(f"torch failed: {type(exc).__name__}: {exc}"[:160])
        row.samples = alternate(fns, repeats, runs, warmup, pause=pause)
    finally:
        for sess in sessions:
            sess.close()
    row.note = "; ".join(notes)
    return row


def torch_device_name(torch: Any, device: Any) -> str:
    if device.type == "cuda":
        return f"torch {torch.__version__} on {torch.cuda.get_device_name(device)}"
    return f"torch {torch.__version__} on the CPU, {torch.get_num_threads()} thread(s)"


def format_report(rows: Sequence[BenchRow], series: Sequence[str], ratios: Sequence[tuple[str, str]],
                  header: str) -> str:
    """Per model: each series' median ms (spread) and error vs ONNX Runtime, then the ratios, with
    issue 9's target beside those that have one (figures for the closing note, not checks)."""
    targets = {(t.numerator, t.denominator): t for t in TARGETS}
    lines = [header]
    for row in rows:
        lines += ["", f"{row.model}  ({row.device})" + (f"  note: {row.note}" if row.note else "")]
        width = max([len(s) for s in series] + [len(f"{a}/{b}") for a, b in ratios] + [10])
        lines.append(f"  {'series':<{width}}  {'ms median (min-max)':>26}  {'err vs ORT':>10}")
        for s in series:
            cell = row.cell(s)
            if cell is None:
                continue
            err = row.rel_errors.get(s)
            lines.append(f"  {s:<{width}}  {format(cell, '.3f'):>26}  {'-' if err is None else format(err, '.1e'):>10}")
        for a, b in ratios:
            ratio = row.ratio(a, b)
            if ratio is None:
                continue
            target = targets.get((a, b))
            verdict = ""
            if target is not None and target.applies(row.model):
                verdict = f"target <= {target.bound:.2f}: {'met' if ratio.median <= target.bound else 'missed'}"
            lines.append(f"  {a + '/' + b:<{width}}  {format(ratio, '.2f'):>26}  {verdict}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(zoo.PAPER_MODELS),
                        help=f"zoo model names, or 'all' (default: {' '.join(zoo.PAPER_MODELS)})")
    parser.add_argument("--backend", nargs="+", default=["all"], help="gpumnn backends to time, or 'all' (default)")
    parser.add_argument("--torch-device", help="PyTorch's device (default: cuda where PyTorch sees one, else cpu)")
    parser.add_argument("--io", choices=("host", "device"), default="host",
                        help="host: NumPy in and out everywhere (default); device: a CUDA tensor in, outputs left "
                             "on the GPU, for gpumnn cuda and PyTorch on CUDA")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--precision", nargs="+", choices=("fp32", "tf32"), default=["fp32"],
                        help="gpumnn's precisions: a series pair per backend that has each (tf32: cuda, as cuda-tf32)")
    parser.add_argument("--torch-precision", choices=("fp32", "tf32"), default="fp32",
                        help="fp32: no TF32 in PyTorch's convolutions and products, as gpumnn (default); "
                             "tf32: PyTorch's defaults")
    add_protocol_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print JSON (raw samples) instead of the report")
    parser.add_argument("--save-json", metavar="FILE", help="also write that JSON into FILE")
    parser.add_argument("--png", metavar="DIR", help="also write charts into DIR (torch_*.png)")
    args = parser.parse_args(argv)
    try:
        torch, _ = require_torch()
        if args.png:
            from gpumnn.tools.charts import require_matplotlib
            require_matplotlib()
    except (PeerUnavailable, ImportError) as exc:
        print(f"torch peer skipped: {exc}")
        return 0
    torch_device = args.torch_device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.io == "device" and not torch_device.startswith("cuda"):
        parser.error("--io device needs PyTorch on CUDA")
    torch.set_num_threads(args.threads)
    tf32 = args.torch_precision == "tf32"
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    models = list(zoo.MODELS) if args.models == ["all"] else args.models
    backends, skipped = resolve_backends(args.backend)
    graph = torch_device.startswith("cuda")
    labels = [label for label, _, _ in labels_for(backends, args.precision)]
    series, ratios = series_for(labels, graph), ratios_for(labels, graph)
    rows = []
    for model in models:
        try:
            rows.append(peer_row(model, backends, torch_device, args.io == "device", args.threads,
                                 args.runs, args.warmup, args.repeats, args.pause, args.precision))
        except Exception as exc:  # one model's failure must not hide the others
            rows.append(BenchRow(model, torch_device, note=f"failed: {type(exc).__name__}: {exc}"[:200]))
    document = json.dumps({"threads": args.threads, "precision": args.precision, "torch_precision": args.torch_precision, "runs": args.runs, "warmup": args.warmup, "repeats": args.repeats,
                           "pause": args.pause, "io": args.io, "torch_device": torch_device, "skipped": skipped,
                           "targets": [vars(t) | {"models": list(t.models or [])} for t in TARGETS],
                           "rows": rows_as_dicts(rows, series, ratios)}, indent=2)
    if args.save_json:
        Path(args.save_json).write_text(document + "\n")
    if args.json:
        print(document)
    else:
        header = (f"batch 1, io={args.io}, gpumnn in {'/'.join(args.precision)}, PyTorch in {args.torch_precision}; each repeat times {', '.join(series)} in turn, {args.pause:g} s apart "
                  f"({args.warmup} warm-up, "
                  f"then the mean of {args.runs} runs); ms: median over {args.repeats} repeats (min-max); ratios: "
                  f"median of per-repeat ratios (min-max); err: relative L2 vs ONNX Runtime")
        header += "".join(f"\n{name}: not run ({reason})" for name, reason in skipped.items())
        print(format_report(rows, series, ratios, header))
    if args.png:
        from gpumnn.tools.charts import write_charts_and_say
        write_charts_and_say(rows, args.png, series, ratios, prefix="torch_")
    return 0


if __name__ == "__main__":
    sys.exit(main())
