"""The ``gpumnn`` command: info, calibrate, run, plan, bench and zoo export."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from .. import __version__, zoo
from ..backends import REGISTRY, create_backend, probe
from ..errors import GpumnnError
from ..scheduler.precision import float16_summary
from .feeds import random_input


def storage_summary(backend: Any) -> str:
    """Which storage dtypes ``backend`` holds as themselves and which packed in 32-bit words, with
    what decided (the backend's ``narrow_storage``: element size -> "native: why" or "packed:
    why"), and those it has no kernels for (its ops on them run on the cpu)."""
    from .. import atomic as A
    decided = getattr(backend, "narrow_storage", {})
    groups: dict[str, list[str]] = {"native": [f"{A.FLOAT32}, {A.INT32}"], "packed in 32-bit words": [],
                                    "no kernels (run on the cpu)": []}
    for size in (2, 1):
        dtypes = [d for d in A.STORAGE_DTYPES if A.ITEMSIZE[d] == size]
        held = [d for d in dtypes if any(d in listed for listed in backend.dtypes.values())]
        if held:
            kind, _, why = decided.get(size, "native: ").partition(": ")
            group = "native" if kind == "native" else "packed in 32-bit words"
            groups[group].append(", ".join(held) + (f" ({why})" if why else ""))
        if len(held) < len(dtypes):
            groups["no kernels (run on the cpu)"].append(", ".join(d for d in dtypes if d not in held))
    return "; ".join(f"{group} {', '.join(items)}" for group, items in groups.items() if items)


def cmd_info(args: argparse.Namespace) -> int:
    if args.ops:
        from .ops_table import ops_section
        from ..frontend.opsets import MAX_OPSET
        import onnx
        print(f"gpumnn {__version__}, onnx {onnx.__version__} (opsets up to {MAX_OPSET})\n")
        print(ops_section())
        return 0
    print(f"gpumnn {__version__}")
    for name in REGISTRY:
        reason = probe(name)
        if reason is None:
            from ..scheduler.calibration import calibration_for
            backend = create_backend(name)
            print(f"  {name:<7} available  {backend.info.device}")
            print(f"          {calibration_for(backend).describe()}")
            print(f"          storage: {storage_summary(backend)}")
            print(f"          precision fp16: {float16_summary(backend)}")
            units = getattr(backend, "compute_units", None)
            if units is not None:  # what the GPU kernel families size their GEMM tiles and split-K by
                source = getattr(backend, "compute_units_source", "")
                print(f"          compute units: {units}" + (f" ({source})" if source else ""))
            if name == "cpu":
                from ..backends.cpu import int8 as cpu_int8
                try:
                    print(f"          int8 products: {cpu_int8.tile_name()} ({cpu_int8.PATH_VARIABLE} picks another "
                          f"of {', '.join(cpu_int8.host_paths())})")
                except ValueError as exc:
                    print(f"          int8 products: {exc}")
            elif backend.int8_arithmetic:
                print(f"          int8 convolutions: {backend.int8_arithmetic}")
            if backend.int8_products:
                print(f"          int8 products: {backend.int8_products}")
            if name == "vulkan":
                from ..backends.kernels.glsl.compile import describe_compiler
                print(f"          GLSL compiler: {describe_compiler()}")
                print(f"          cooperative matrices: {backend.cooperative_matrices}")
                print(f"          GEMM: {backend.gemm_kind}")
            backend.close()
        else:
            print(f"  {name:<7} missing    {reason}")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from ..backends import available_backends
    from ..scheduler import device_profile
    from ..scheduler.calibration import calibrate, cache_path
    names = available_backends() if args.backend == ["all"] else args.backend
    failed, measured = 0, []
    for name in names:  # a backend that cannot start is reported, and the others still measured
        try:
            backend = create_backend(name)
        except GpumnnError as exc:
            print(f"{name:<7} not calibrated: {exc}", file=sys.stderr)
            failed += 1
            continue
        try:
            result = calibrate(backend, quick=args.quick)
            measured.append((result, device_profile.PlanningTarget.of(backend)))
        finally:
            backend.close()
        print(f"{name:<7} {result.device}\n        {result.describe()} ({result.seconds:.1f} s)"
              f"\n        stored in {cache_path(backend)}", flush=True)
    if args.save_profile and measured:
        machine = args.machine or " / ".join(dict.fromkeys(cal.device for cal, _ in measured))
        print(f"device profile of {machine}: {device_profile.save(args.save_profile, machine, measured)}")
    return 1 if failed else 0


def _charts_ready(png: str | None) -> bool:
    """Whether ``--png`` (if given) can be honoured; checked before any timing, not after it."""
    if not png:
        return True
    from .charts import ChartsUnavailable, require_matplotlib
    try:
        require_matplotlib()
    except ChartsUnavailable as exc:
        print(f"gpumnn: error: --png: {exc}", file=sys.stderr)
        return False
    return True


def cmd_plan(args: argparse.Namespace) -> int:
    from .plan_report import chart, format_profile, profile
    if not _charts_ready(args.png):
        return 2
    net, _ = _load_model(args.model)
    shapes = {net.inputs[0].name: tuple(args.shape)} if args.shape else None
    backend = args.backend[0] if len(args.backend) == 1 else args.backend
    if args.profile:
        return _plan_on_profile(args, net, shapes)
    with net.session(backend=backend, input_shapes=shapes, threads=args.threads) as sess:
        rng = np.random.default_rng(0)
        feeds = {v.name: random_input(v.dtype, sess.input_shapes[v.name], rng) for v in net.inputs}
        prof = profile(sess, feeds, runs=args.runs)
        print(format_profile(sess, prof))
    if args.png:
        chart(prof, args.png, title=f"{args.model} on {sess.backend}: estimated vs measured per op")
        print(f"wrote {args.png}")
    return 0


def _plan_on_profile(args: argparse.Namespace, net: Any, shapes: dict | None) -> int:
    """``gpumnn plan --profile``: the plan of a profiled device's backend, made without it."""
    from ..scheduler import device_profile
    from .plan_report import plan_on_profile
    if len(args.backend) != 1 or args.backend[0] == "auto":
        print("gpumnn: error: --profile plans for one backend of the profiled device: name it with --backend",
              file=sys.stderr)
        return 2
    device = device_profile.load(args.profile)
    shapes = shapes or {}
    for value in net.inputs:
        if value.name not in shapes:
            dims = tuple(value.shape or ())
            if not dims or not all(isinstance(d, int) and d > 0 for d in dims):
                print(f"gpumnn: error: input {value.name!r} has the symbolic shape {value.shape}: give --shape",
                      file=sys.stderr)
                return 2
            shapes[value.name] = dims
    print(plan_on_profile(net, shapes, args.backend[0], device))
    return 0


def _load_model(path: str):
    from ..net import load
    if path in zoo.MODELS and not Path(path).exists():
        return load(zoo.build(path)), path
    return load(path), path


def parse_shapes(specs: list[list[str]] | None, input_names: list[str]) -> dict[str, tuple[int, ...]] | None:
    """``--shape`` values as {input: shape}: ``NAME=1,3,224,224`` (repeatable, one per input), or
    the dims alone (``1 3 224 224`` or ``1,3,224,224``) for the first input."""
    if not specs:
        return None
    shapes = {}
    for spec in specs:
        text = " ".join(spec)
        name, sep, dims = text.rpartition("=")
        name = name.strip() if sep else input_names[0]
        try:
            shape = tuple(int(d) for d in dims.replace(",", " ").replace("x", " ").split())
        except ValueError:
            raise GpumnnError(f"--shape {text!r}: expected NAME=D0,D1,... (or the first input's dims alone)") from None
        if not shape:
            raise GpumnnError(f"--shape {text!r} gives no dimensions")
        shapes[name] = shape
    return shapes


def load_inputs(specs: list[str] | None, input_names: list[str]) -> dict[str, np.ndarray]:
    """``--input`` values as {input: array}: ``NAME=FILE.npy`` (one per input), ``FILE.npz``
    (its arrays by input name) or a lone ``FILE.npy`` for the first input."""
    arrays: dict[str, np.ndarray] = {}
    for spec in specs or []:
        name, sep, path = spec.rpartition("=")
        if not sep and path.endswith(".npz"):
            with np.load(path) as archive:
                arrays.update({key: archive[key] for key in archive.files})
            continue
        arrays[name if sep else input_names[0]] = np.load(path)
    unknown = sorted(set(arrays) - set(input_names))
    if unknown:
        raise GpumnnError(f"--input names {unknown}, which the model does not take; its inputs are {input_names}")
    return arrays


def cmd_run(args: argparse.Namespace) -> int:
    from ..input_shapes import resolve_input_shapes
    net, _ = _load_model(args.model)
    names = [v.name for v in net.inputs]
    given = parse_shapes(args.shape, names) or {}
    arrays = load_inputs(args.input, names)
    for name, array in arrays.items():
        given.setdefault(name, array.shape)  # the array says what symbolic dims are
    shapes = resolve_input_shapes(net.graph, given)  # InputError naming the input and --shape where one is unknown
    sess = net.session(backend=args.backend, input_shapes=shapes, record=not args.eager, threads=args.threads,
                       fallback=not args.no_fallback)
    rng = np.random.default_rng(0)
    feeds = {v.name: arrays[v.name] if v.name in arrays else random_input(v.dtype, shapes[v.name], rng)
             for v in net.inputs}
    start = time.perf_counter()
    outputs = sess.run(feeds)
    elapsed = (time.perf_counter() - start) * 1000
    if args.report:
        print(sess.report())
    for key, value in outputs.items():
        print(f"{key}: shape {list(value.shape)} mean {value.mean():.6g} std {value.std():.6g}")
    print(f"backend {sess.backend}, session created in {sess.prepare_seconds * 1000:.1f} ms, run {elapsed:.1f} ms")
    if args.output:
        np.savez(args.output, **outputs)
        print(f"wrote {args.output}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from .benchmark import SERIES, benchmark, format_table, resolve_backends, rows_as_dicts
    if not _charts_ready(args.png):
        return 2
    backends, skipped = resolve_backends(args.backend)
    if not backends:
        print("no requested backend can start here: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()), file=sys.stderr)
        return 2
    models = args.models or list(zoo.PAPER_MODELS)
    if models == ["all"]:
        models = zoo.names()
    threads = args.threads or os.cpu_count() or 1
    batches = args.batch or [None]
    rows = benchmark(models, backends, threads=threads, runs=args.runs, warmup=args.warmup, repeats=args.repeats,
                     pause=args.pause, batches=batches,
                     eager=not args.no_eager, progress=not args.json and sys.stderr.isatty() or args.progress)
    if args.json:
        print(json.dumps({"threads": threads, "runs": args.runs, "warmup": args.warmup, "repeats": args.repeats,
                          "pause": args.pause, "batches": args.batch, "skipped": skipped,
                          "rows": rows_as_dicts(rows)}, indent=2))
    else:
        print(format_table(rows, threads, skipped, runs=args.runs, warmup=args.warmup, repeats=args.repeats,
                           pause=args.pause))
    if args.png:
        from .charts import write_charts_and_say
        write_charts_and_say(rows, args.png, SERIES)
    return 0


def batch_list(text: str) -> list[int]:
    """``--batch 1,8,32`` as [1, 8, 32]."""
    try:
        sizes = [int(b) for b in text.replace(",", " ").split()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected batch sizes like 1,8,32, not {text!r}")
    return list(dict.fromkeys(sizes))


def cmd_zoo(args: argparse.Namespace) -> int:
    out = Path(args.directory)
    for name in args.models or zoo.names():
        path = zoo.save(name, out / f"{name}.onnx")
        print(f"{name:<20} {list(zoo.input_shape(name))} -> {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpumnn", description="MNN-style ONNX inference on NumPy, OpenCL, Vulkan, OpenGL and CUDA")
    parser.add_argument("--version", action="version", version=f"gpumnn {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    info = sub.add_parser("info", help="backends and devices found here, and why a missing one is missing")
    info.add_argument("--ops", action="store_true", help="the opsets and op types gpumnn supports instead")
    info.set_defaults(fn=cmd_info)

    run = sub.add_parser("run", help="run one model once")
    run.add_argument("model", help="an .onnx file or a zoo model name")
    run.add_argument("--backend", default="cpu", choices=[*REGISTRY, "auto"])
    run.add_argument("--input", nargs="+", metavar="[NAME=]FILE",
                     help="inputs: NAME=FILE.npy per input, a FILE.npz of arrays named by input, or FILE.npy "
                          "for the first input; the others get random data")
    run.add_argument("--shape", nargs="+", action="append", metavar="NAME=D0,D1,...",
                     help="an input's shape, for models with symbolic dimensions (repeat for each input; "
                          "the dims alone, e.g. --shape 1 3 224 224, give the first input's)")
    run.add_argument("--output", help="write the outputs to this .npz file")
    run.add_argument("--threads", type=int)
    run.add_argument("--eager", action="store_true", help="no prerecorded work (the paper's baseline)")
    run.add_argument("--no-fallback", action="store_true", help="fail instead of running on the cpu if the backend cannot start")
    run.add_argument("--report", action="store_true", help="print the per-op plan")
    run.set_defaults(fn=cmd_run)

    calibrate = sub.add_parser("calibrate", help="measure each backend's cost-model numbers and cache them")
    calibrate.add_argument("--backend", nargs="+", default=["all"], help="backends to measure (default: all available)")
    calibrate.add_argument("--quick", action="store_true", help="the quick variant a session runs on its own")
    calibrate.add_argument("--save-profile", metavar="FILE",
                           help="also write the calibrations and planning facts measured here as a device profile")
    calibrate.add_argument("--machine", help="the machine's name in the profile (default: the devices')")
    calibrate.set_defaults(fn=cmd_calibrate)

    plan = sub.add_parser("plan", help="placement per op: backend, scheme, estimated cost beside measured time")
    plan.add_argument("model", help="an .onnx file or a zoo model name")
    plan.add_argument("--backend", nargs="+", default=["auto"],
                      help="'auto' (every available backend), one backend, or several to choose among")
    plan.add_argument("--shape", type=int, nargs="+", help="input shape, for models with symbolic dimensions")
    plan.add_argument("--threads", type=int)
    plan.add_argument("--runs", type=int, default=3, help="recorded runs timed for the measured total")
    plan.add_argument("--png", metavar="FILE", help="also chart estimated vs measured per op (needs matplotlib)")
    plan.add_argument("--profile", metavar="FILE",
                      help="plan for the device of this profile (a file, or a bundled one's name: "
                           "nvidia-h100-80gb-hbm3), without it: schemes, ops and estimated ms")
    plan.set_defaults(fn=cmd_plan)

    bench = sub.add_parser("bench", help="time models on backends, recorded and eager, in alternation with ONNX Runtime")
    bench.add_argument("models", nargs="*", help="zoo names or .onnx paths (default: the paper's three; 'all' for the zoo)")
    bench.add_argument("--backend", nargs="+", default=["all"], help="backends to time, or 'all' (default)")
    bench.add_argument("--threads", type=int, help="CPU threads for NumPy and ONNX Runtime (default: all cores)")
    from .benchmark import add_protocol_arguments
    add_protocol_arguments(bench)
    bench.add_argument("--batch", type=batch_list, metavar="B[,B...]",
                       help="batch sizes to time each model at (e.g. 1,8,32), adding items per second beside ONNX "
                            "Runtime's at the same batch (default: the model's own batch)")
    bench.add_argument("--no-eager", action="store_true", help="skip the eager (undecoupled) timing")
    bench.add_argument("--json", action="store_true", help="print JSON (raw samples of every repeat) instead of a table")
    bench.add_argument("--png", metavar="DIR", help="also write charts (latency per model, ratios) into DIR; needs matplotlib")
    bench.add_argument("--progress", action="store_true", help="show progress even when stderr is not a terminal")
    bench.set_defaults(fn=cmd_bench)

    zoo_cmd = sub.add_parser("zoo", help="write the bundled benchmark models as .onnx files")
    zoo_cmd.add_argument("directory")
    zoo_cmd.add_argument("models", nargs="*")
    zoo_cmd.set_defaults(fn=cmd_zoo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except GpumnnError as exc:
        print(f"gpumnn: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # output piped into `head` and friends: stop quietly
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
