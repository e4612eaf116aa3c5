"""ncnn as a peer: models converted by pnnx, timed in alternation with gpumnn (cpu) and ONNX Runtime.

Conversion is Tencent's own: ``pnnx`` (PyPI) reads the ONNX file and writes ncnn's
``.param``/``.bin``. pnnx's Python API (``pnnx.export``/``pnnx.convert``) imports torch and takes
TorchScript, so it is not used; the wheel also carries the converter itself as a native,
statically linked executable (``pnnx/pnnx`` in the package) that accepts ``.onnx`` input and
needs no torch. This script runs that executable, found without importing the package
(``import pnnx`` imports torch), so ``pip install --no-deps pnnx`` (29 MB; setup.sh does this) is
enough. ``fp16=0`` keeps the weights in float32, and the ncnn nets are made with fp16 storage and
arithmetic off, so every peer computes in float32.

Timing is gpumnn's protocol (:func:`gpumnn.tools.benchmark.alternate`): each repeat takes one figure
(1 warm-up, mean of ``--runs`` runs) of gpumnn's cpu backend (recorded), ONNX Runtime and ncnn
(cpu, and Vulkan where ncnn finds a device) in turn; cells are medians over ``--repeats`` with
the min-max spread, ratios medians of per-repeat ratios. Every output is compared with ONNX
Runtime's (relative L2), so a conversion that changed the model shows in the error columns.
Each ncnn run makes a fresh extractor (as ncnn applications do) and converts in and out of NumPy.

    python bench/ncnn_peer.py [models...] [--threads N] [--runs 10] [--repeats 5] [--png DIR] [--json]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gpumnn import zoo  # noqa: E402
from gpumnn.tools.benchmark import (BenchRow, add_protocol_arguments, alternate, format_table, load_model,  # noqa: E402
                              onnxruntime_runner, rel_l2, rows_as_dicts)

SERIES = ("recorded", "onnxruntime", "ncnn-cpu", "ncnn-vulkan")
RATIOS = (("ncnn-cpu", "onnxruntime"), ("recorded", "ncnn-cpu"), ("recorded", "onnxruntime"))
INPUT_BLOB, OUTPUT_BLOB = "in0", "out0"  # pnnx's names for the first input and output


class PeerUnavailable(RuntimeError):
    """pnnx or ncnn is not installed here (the message says which and how to install it)."""


def pnnx_executable() -> Path:
    """The converter executable inside the installed ``pnnx`` package (found without importing it)."""
    spec = importlib.util.find_spec("pnnx")
    if spec is None or not spec.submodule_search_locations:
        raise PeerUnavailable("pnnx is not installed: pip install --no-deps pnnx (the converter executable; "
                              "its Python API would need torch)")
    exe = Path(next(iter(spec.submodule_search_locations))) / ("pnnx.exe" if os.name == "nt" else "pnnx")
    if not exe.is_file():
        raise PeerUnavailable(f"the pnnx package has no converter executable at {exe}")
    return exe


def require_ncnn() -> None:
    try:
        import ncnn  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - ImportError, or a broken native library
        raise PeerUnavailable(f"ncnn is not importable ({type(exc).__name__}: {exc}): pip install ncnn") from exc


def convert(model_bytes: bytes, input_shape: tuple[int, ...], directory: str | os.PathLike) -> tuple[Path, Path]:
    """ncnn's (.param, .bin) for an ONNX model, written by pnnx into ``directory``."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / "model.onnx").write_bytes(model_bytes)
    names = {"ncnnparam": "model.ncnn.param", "ncnnbin": "model.ncnn.bin", "ncnnpy": "model_ncnn.py",
             "pnnxparam": "model.pnnx.param", "pnnxbin": "model.pnnx.bin", "pnnxpy": "model_pnnx.py",
             "pnnxonnx": "model.pnnx.onnx"}  # every output named, so all of them land in ``directory``
    command = [str(pnnx_executable()), "model.onnx", f"inputshape=[{','.join(map(str, input_shape))}]", "fp16=0",
               *(f"{key}={value}" for key, value in names.items())]
    done = subprocess.run(command, cwd=out, capture_output=True, text=True)
    param, bin_ = out / names["ncnnparam"], out / names["ncnnbin"]
    if done.returncode != 0 or not param.is_file() or not bin_.is_file():
        log = (done.stdout + done.stderr).strip().splitlines()[-15:]
        raise RuntimeError(f"pnnx failed (exit {done.returncode}) on {input_shape}:\n" + "\n".join(log))
    return param, bin_


def ncnn_runner(param: Path, bin_: Path, vulkan: bool, threads: int) -> tuple[Callable[[np.ndarray], np.ndarray], object]:
    """(run, net): ``run(x)`` is one float32 inference of batch-1 ``x`` on a fresh extractor."""
    import ncnn
    net = ncnn.Net()
    net.opt.num_threads = int(threads)
    net.opt.use_vulkan_compute = bool(vulkan)
    # ncnn defaults to fp16 storage/arithmetic where it can, which alone costs ~1e-3 relative error
    for flag in ("use_fp16_packed", "use_fp16_storage", "use_fp16_arithmetic", "use_bf16_storage",
                 "use_int8_inference"):
        setattr(net.opt, flag, False)
    if net.load_param(str(param)) != 0 or net.load_model(str(bin_)) != 0:
        raise RuntimeError(f"ncnn could not load {param} / {bin_}")

    def run(x: np.ndarray) -> np.ndarray:
        ex = net.create_extractor()
        ex.input(INPUT_BLOB, ncnn.Mat(np.ascontiguousarray(x[0], dtype=np.float32)))  # ncnn has no batch axis
        ret, out = ex.extract(OUTPUT_BLOB)
        if ret != 0:
            raise RuntimeError(f"ncnn extract({OUTPUT_BLOB!r}) failed with {ret}")
        return np.array(out, dtype=np.float32)[None]

    return run, net


def vulkan_device() -> str | None:
    """ncnn's default Vulkan device, or None where ncnn finds none."""
    import ncnn
    if ncnn.get_gpu_count() == 0:
        return None
    return ncnn.get_gpu_info(ncnn.get_default_gpu_index()).device_name()


def peer_row(model: str, threads: int, runs: int, warmup: int, repeats: int, vulkan: bool, workdir: str,
             pause: float = 0.0) -> BenchRow:
    """One model: gpumnn cpu (recorded), ONNX Runtime and ncnn timed in alternation, with errors."""
    net, model_bytes, feed = load_model(model)
    (name, x), = feed.items()
    ort = onnxruntime_runner(model_bytes, threads)
    if ort is None:
        raise PeerUnavailable("onnxruntime (the reference) is not installed")
    reference = ort(feed)
    row = BenchRow(model, "cpu", device=f"{threads} threads")
    sess = net.session(backend="cpu", threads=threads, fallback=False)
    param, bin_ = convert(model_bytes, x.shape, Path(workdir, model))
    ncnn_nets = []
    try:
        fns: dict[str, Callable[[], object]] = {"recorded": lambda: sess.run(feed), "onnxruntime": lambda: ort(feed)}
        row.rel_errors["recorded"] = rel_l2(next(iter(sess.run(feed).values())), reference)
        for series, on_gpu in (("ncnn-cpu", False), ("ncnn-vulkan", True)):
            if on_gpu and not vulkan:
                continue
            run, ncnn_net = ncnn_runner(param, bin_, on_gpu, threads)
            ncnn_nets.append(ncnn_net)
            row.rel_errors[series] = rel_l2(run(x), reference)
            fns[series] = lambda run=run: run(x)
        row.samples = alternate(fns, repeats, runs, warmup, pause=pause)
    finally:
        sess.close()
        for ncnn_net in ncnn_nets:
            ncnn_net.clear()
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(zoo.PAPER_MODELS),
                        help=f"zoo model names (default: {' '.join(zoo.PAPER_MODELS)})")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    add_protocol_arguments(parser)
    parser.add_argument("--no-vulkan", action="store_true", help="time ncnn's CPU path only")
    parser.add_argument("--json", action="store_true", help="print JSON (raw samples) instead of a table")
    parser.add_argument("--png", metavar="DIR", help="also write charts into DIR (ncnn_*.png)")
    args = parser.parse_args(argv)
    try:
        pnnx_executable()
        require_ncnn()
        if args.png:
            from gpumnn.tools.charts import require_matplotlib
            require_matplotlib()
    except (PeerUnavailable, ImportError) as exc:
        print(f"ncnn peer skipped: {exc}")
        return 0
    device = None if args.no_vulkan else vulkan_device()
    rows = []
    with tempfile.TemporaryDirectory(prefix="ncnn_peer_") as tmp:
        for model in args.models:
            try:
                rows.append(peer_row(model, args.threads, args.runs, args.warmup, args.repeats, device is not None, tmp,
                                     args.pause))
            except Exception as exc:  # one model's failure (a conversion, say) must not hide the others
                rows.append(BenchRow(model, "cpu", note=f"failed: {type(exc).__name__}: {exc}"[:200]))
    series = [s for s in SERIES if s != "ncnn-vulkan" or device is not None]
    if args.json:
        print(json.dumps({"threads": args.threads, "runs": args.runs, "warmup": args.warmup, "repeats": args.repeats,
                          "vulkan_device": device, "rows": rows_as_dicts(rows, series, RATIOS)}, indent=2))
    else:
        import ncnn
        print(f"ncnn {getattr(ncnn, '__version__', '?')} on models converted by pnnx (fp32); gpumnn on its cpu "
              f"backend; err = relative L2 vs ONNX Runtime; ncnn Vulkan: {device or 'not run'}")
        print(format_table(rows, args.threads, runs=args.runs, warmup=args.warmup, repeats=args.repeats,
                           series=series, ratios=RATIOS, extras=False, pause=args.pause))
    if args.png:
        from gpumnn.tools.charts import write_charts_and_say
        write_charts_and_say(rows, args.png, series, RATIOS, prefix="ncnn_")
    return 0


if __name__ == "__main__":
    sys.exit(main())
