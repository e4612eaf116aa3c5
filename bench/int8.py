"""precision="int8" against fp32 on one backend: alternating runs in one process, medians with spread.

    python bench/int8.py [--model transformer_encoder] [--backend cpu] [--kernels auto] [--threads 2]
                         [--rounds 7] [--runs 20] [--inputs 50] [--paths all] [--product 128,256,1024] [--int4]

Each round times ``runs`` runs of the fp32 session, then ``runs`` of the int8 one (alternating, so
that a busy machine slows both alike); the median per run of each round is kept, and the median of
the rounds is reported with their range. Also reports the relative error of int8 against fp32
(||int8 - fp32|| / ||fp32|| over ``inputs`` random inputs: the worst and the median) and the bytes
of the weights the products read, before and after. ``--paths all`` (or a comma-separated list)
adds an int8 session per product path of the cpu kernel this host runs (``cpu_int8.host_paths()``:
vnni512, avx512bw, avx2, portable), all in the same alternation; ``--product M,K,N`` times one
QuantizedMatMul of that size on one thread on each path beside the cpu backend's float32 MatMul, instead of
a model. ``--backend`` (opencl, vulkan, gl, cuda; ``--kernels`` picks the kernel family) runs both
sessions there and says how many of the int8 session's QuantizedMatMuls that backend runs (the rest
were placed on the cpu); ONNX Runtime's float32 session of the model takes its turn in the
alternation as the peer. ``--int4`` adds a ``precision="int4"`` session (4-bit weights in blocks; on
the GPU backends its products are placed on the cpu), and with ``--product`` the int4 product in
blocks of 32, 64 and 128. Nothing here asserts speed.
"""
from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's gpumnn, not an installed one

import gpumnn  # noqa: E402
from gpumnn import atomic as A, zoo  # noqa: E402
from gpumnn.backends.cpu import int8 as cpu_int8  # noqa: E402
from gpumnn.backends.cpu.backend import CpuBackend  # noqa: E402


def product_weight_bytes(session) -> int:
    """Bytes of the constants the session's matrix products read as weights."""
    program = session.program
    names = {op.inputs[i] for op in program.ops for i in
             ((1, 2) if isinstance(op, A.QuantizedMatMul) else (1,) if isinstance(op, A.MatMul) else ())
             if op.inputs[i] in program.constants}
    return sum(program.nbytes_of(n) for n in names)


def alternate(timers: dict, rounds: int, runs: int) -> dict[str, list[float]]:
    """name -> the median ms of ``runs`` calls of ``timers[name]`` in each of ``rounds`` rounds, the
    timers taking turns within every round."""
    medians: dict[str, list[float]] = {name: [] for name in timers}
    for _ in range(rounds):
        for name, call in timers.items():
            times = []
            for _ in range(runs):
                started = time.perf_counter()
                call()
                times.append(time.perf_counter() - started)
            medians[name].append(statistics.median(times) * 1e3)
    return medians


def report(medians: dict[str, list[float]], baseline: str) -> None:
    base = statistics.median(medians[baseline])
    for name, ms in medians.items():
        middle = statistics.median(ms)
        print(f"  {name:16s} median {middle:8.3f} ms  (rounds {min(ms):.3f} .. {max(ms):.3f})  "
              f"{base / middle:.2f}x {baseline}")


def time_product(size: str, paths: list[str], rounds: int, runs: int, int4: bool = False) -> None:
    """One QuantizedMatMul of ``size`` (M,K,N) on one thread per path (and with ``int4``, its int4
    form in blocks of 32, 64 and 128 on each), beside the backend's float32 MatMul."""
    m, k, n = (int(v) for v in size.split(","))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((m, k)).astype(np.float32)
    weight = rng.standard_normal((k, n)).astype(np.float32)
    from gpumnn.scheduler.precision import quantize_blocks, quantize_columns
    values, scale = quantize_columns(weight)
    bias = np.zeros(n, np.float32)
    be = CpuBackend(jit=True, threads=1)
    pool = be.allocate(4 * (m * k + m * n + 64))
    xh = be.tensor(pool, 0, (m, k), A.FLOAT32)
    out = be.tensor(pool, m * k + 16, (m, n), A.FLOAT32)
    be.write(xh, x)
    ins = [xh, be.constant(values), be.constant(scale), be.constant(bias)]
    op = A.QuantizedMatMul(("x", "w", "s", "b"), ("y",), "bench", m=m, n=n, k=k, has_bias=True)
    float_op = A.MatMul(("x", "w", "b"), ("y",), "bench", m=m, n=n, k=k, has_bias=True)
    timers = {"fp32": functools.partial(be.submit, be.record([be.create_execution(
        float_op, [xh, be.constant(weight), be.constant(bias)], [out])]))}
    for path in paths:
        cpu_int8.use_path(path)
        recorded = be.record([be.create_execution(op, ins, [out])])
        timers[f"int8 {path}"] = functools.partial(be.submit, recorded)
        for block in (32, 64, 128) if int4 else ():
            packed, block_scale = quantize_blocks(weight, block)
            block_op = A.QuantizedMatMul(op.inputs, op.outputs, "bench", m=m, n=n, k=k, has_bias=True, block=block)
            recorded = be.record([be.create_execution(
                block_op, [xh, be.constant(packed), be.constant(block_scale), be.constant(bias)], [out])])
            timers[f"int4/{block} {path}"] = functools.partial(be.submit, recorded)
    print(f"QuantizedMatMul {m} x {k} x {n}, cpu, one thread, {rounds} rounds of {runs} runs each, alternating")
    report(alternate(timers, rounds, runs), "fp32")


def onnxruntime_session(model, threads: int):
    """ONNX Runtime's float32 session of the model (the peer), or None where it is not installed."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="transformer_encoder")
    parser.add_argument("--backend", default="cpu")
    parser.add_argument("--kernels", default="auto", help="the GPU backends' kernel family: auto, tiled or simd")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--inputs", type=int, default=50)
    parser.add_argument("--paths", default="", help="'all' or a comma-separated list of int8 product paths")
    parser.add_argument("--product", default="", help="M,K,N: time one product instead of a model")
    parser.add_argument("--int4", action="store_true", help="add a precision='int4' session to the alternation")
    args = parser.parse_args()
    paths = list(cpu_int8.host_paths()) if args.paths == "all" else [p for p in args.paths.split(",") if p]
    if args.product:
        time_product(args.product, paths or [cpu_int8.current_path()], args.rounds, args.runs, args.int4)
        return
    model = getattr(zoo, args.model)()
    net = gpumnn.load(model)
    info = net.inputs[0]
    shape = tuple(int(d) for d in info.shape)
    rng = np.random.default_rng(0)
    options = {} if args.backend == "cpu" or args.kernels == "auto" else {"kernels": args.kernels}
    sessions = {"fp32": net.session(backend=args.backend, threads=args.threads, **options)}
    for path in paths or [cpu_int8.current_path()]:
        cpu_int8.use_path(path)
        sessions["int8" if not paths else f"int8 {path}"] = net.session(backend=args.backend, threads=args.threads,
                                                                        precision="int8", **options)
    if args.int4:
        sessions["int4"] = net.session(backend=args.backend, threads=args.threads, precision="int4", **options)
    errors: dict[str, list[float]] = {name: [] for name in sessions if name != "fp32"}
    for _ in range(args.inputs):
        feed = {info.name: rng.standard_normal(shape).astype(np.float32)}
        ref = next(iter(sessions["fp32"].run(feed).values()))
        for name, errs in errors.items():
            low = next(iter(sessions[name].run(feed).values()))
            errs.append(float(np.linalg.norm(low - ref) / np.linalg.norm(ref)))
    feed = {info.name: rng.standard_normal(shape).astype(np.float32)}
    timers = {name: functools.partial(sess.run, feed) for name, sess in sessions.items()}
    peer = onnxruntime_session(model, args.threads)
    if peer is not None:
        timers["onnxruntime fp32"] = functools.partial(peer.run, None, feed)
    medians = alternate(timers, args.rounds, args.runs)
    print(f"{args.model}, {args.backend}{'' if not options else f' kernels={args.kernels}'}, {args.threads} threads, "
          f"{args.rounds} rounds of {args.runs} runs each, alternating")
    print(f"{args.backend} backend: {sessions['fp32'].backends[args.backend].info.device}")
    report(medians, "fp32")
    for name, sess in sessions.items():
        if name != "fp32":
            placement = sess.placement
            quantized = [i for i, op in enumerate(sess.program.ops) if isinstance(op, A.QuantizedMatMul)]
            on_backend = sum(placement.op_backends[i] == args.backend for i in quantized)
            print(f"  {name}: {on_backend} of {len(quantized)} QuantizedMatMul on {args.backend}")
    for name, errs in errors.items():
        print(f"  relative error {name} vs fp32 over {args.inputs} inputs: median {statistics.median(errs):.4f}, "
              f"worst {max(errs):.4f}")
    print("  product weights (values and float32 scales): "
          + ", ".join(f"{name} {product_weight_bytes(sess)} bytes" for name, sess in sessions.items()))
    for sess in sessions.values():
        sess.close()


if __name__ == "__main__":
    main()
