"""Lifetime soak: sessions of mixed models on every API, dropped and collected at awkward moments.

Issue 27: a text recogniser and a voice-activity model, run one after the other on cpu and
vulkan in one process with sessions left to the garbage collector, once hung in a Vulkan
submission and died with ``double free or corruption`` at exit. This soak repeats that kind of
life, hundreds of times, in one process: each cycle creates a session of one of three small
models (convolutions; a bidirectional LSTM; an If on an int64 scalar input with an LSTM cell,
like silero-vad) on one of the backends, runs it, and then closes it, drops it (reference
counting frees it at once), drops it inside a reference cycle (only the cyclic collector frees
it, at whatever allocation triggers the next collection: inside another session's work) or
keeps it for a few cycles. The collector runs often (``gc.set_threshold`` low), a weak-reference
callback collects again from inside a collection's finalizers, and a second thread (``--threads``)
does the same on its own sessions meanwhile, so finalizers of one thread's sessions run in the
middle of another session's device calls, on the same thread and on the other.

Vulkan runs under VK_LAYER_KHRONOS_validation (``--no-validation`` to skip it) and every message
the layer sends counts as a failure. Run it with ``PYTHONMALLOC=debug`` (the test does) to have
the allocator check for frees of freed memory; a hang fails through ``--hang-seconds`` (a
traceback of every thread, then exit code 3). Exit code 0 only when every cycle ran, every result
matched the cpu's, the layer said nothing and the interpreter got as far as printing "clean exit".

    PYTHONMALLOC=debug python bench/soak_lifetime.py --cycles 600 --threads 2
    python bench/soak_lifetime.py --backend vulkan,gl --cycles 200 --seed 3

tests/test_device_lifetime.py runs a short version in a subprocess.
"""
from __future__ import annotations

import argparse
import faulthandler
import gc
import random
import sys
import threading
import time
import weakref
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gpumnn  # noqa: E402

F, I64 = TensorProto.FLOAT, TensorProto.INT64
#: sessions still open when the interpreter exits (its teardown must close them cleanly)
LEFT_OPEN: list = []
HIDDEN, FEATURES, STEPS = 8, 8, 4


def _model(name: str, nodes, inputs, outputs, initializers) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)], ir_version=8)
    model.ir_version = 8
    return model


def _weights(rng: np.random.Generator, **shapes) -> list[onnx.TensorProto]:
    return [numpy_helper.from_array((rng.standard_normal(s) * 0.4).astype(np.float32), n) for n, s in shapes.items()]


def conv_model() -> onnx.ModelProto:
    """Convolution, ReLU, pooling, a Gemm: a recogniser's front end."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p1", "w2"], ["c2"], group=4, pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["c2"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1)]
    return _model("conv", nodes, [helper.make_tensor_value_info("x", F, [1, 1, 8, 16])],
                  [helper.make_tensor_value_info("y", F, [1, 5])],
                  _weights(rng, w1=(4, 1, 3, 3), b1=(4,), w2=(4, 1, 3, 3), fw=(5, 4), fb=(5,)))


def lstm_model() -> onnx.ModelProto:
    """A bidirectional LSTM over a short sequence, then a Gemm on its last states."""
    rng = np.random.default_rng(2)
    g = 4 * HIDDEN
    nodes = [helper.make_node("LSTM", ["x", "W", "R", "B"], ["Y", "Y_h"], hidden_size=HIDDEN,
                              direction="bidirectional"),
             helper.make_node("Transpose", ["Y_h"], ["t"], perm=[1, 0, 2]),
             helper.make_node("Flatten", ["t"], ["f"]),
             helper.make_node("Gemm", ["f", "fw"], ["y"], transB=1)]
    return _model("lstm", nodes, [helper.make_tensor_value_info("x", F, [STEPS, 1, FEATURES])],
                  [helper.make_tensor_value_info("y", F, [1, 3]), helper.make_tensor_value_info("Y", F, None)],
                  _weights(rng, W=(2, g, FEATURES), R=(2, g, HIDDEN), B=(2, 2 * g), fw=(3, 2 * HIDDEN)))


def vad_model() -> onnx.ModelProto:
    """What silero-vad does per chunk, small: an If over an int64 scalar (the sample rate) picks
    one of two scalings (a run-time condition: both branches and a Select), then an LSTM cell
    steps from a state input and the new state is an output."""
    rng = np.random.default_rng(3)
    g = 4 * HIDDEN
    then_branch = helper.make_graph([helper.make_node("Mul", ["x", "two"], ["ty"])], "then", [],
                                    [helper.make_tensor_value_info("ty", F, None)])
    else_branch = helper.make_graph([helper.make_node("Add", ["x", "two"], ["ey"])], "else", [],
                                    [helper.make_tensor_value_info("ey", F, None)])
    nodes = [helper.make_node("Equal", ["sr", "rate"], ["cond"]),
             helper.make_node("If", ["cond"], ["s"], then_branch=then_branch, else_branch=else_branch),
             helper.make_node("Reshape", ["s", "seq_shape"], ["seq"]),
             helper.make_node("Split", ["state", "split"], ["h0", "c0"], axis=0),
             helper.make_node("LSTM", ["seq", "W", "R", "B", "", "h0", "c0"], ["", "h", "c"], hidden_size=HIDDEN),
             helper.make_node("Concat", ["h", "c"], ["new_state"], axis=0),
             helper.make_node("Squeeze", ["h", "zero"], ["hs"]),
             helper.make_node("Gemm", ["hs", "fw"], ["logit"], transB=1),
             helper.make_node("Sigmoid", ["logit"], ["p"])]
    consts = [numpy_helper.from_array(np.array(16000, dtype=np.int64), "rate"),
              numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two"),
              numpy_helper.from_array(np.array([1, 1, FEATURES], dtype=np.int64), "seq_shape"),
              numpy_helper.from_array(np.array([1, 1], dtype=np.int64), "split"),
              numpy_helper.from_array(np.array([0], dtype=np.int64), "zero")]
    return _model("vad", nodes,
                  [helper.make_tensor_value_info("x", F, [1, FEATURES]),
                   helper.make_tensor_value_info("state", F, [2, 1, HIDDEN]),
                   helper.make_tensor_value_info("sr", I64, [])],
                  [helper.make_tensor_value_info("p", F, [1, 1]),
                   helper.make_tensor_value_info("new_state", F, [2, 1, HIDDEN])],
                  consts + _weights(rng, W=(1, g, FEATURES), R=(1, g, HIDDEN), B=(1, 2 * g), fw=(1, HIDDEN)))


def feeds(name: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    if name == "conv":
        return {"x": rng.standard_normal((1, 1, 8, 16)).astype(np.float32)}
    if name == "lstm":
        return {"x": rng.standard_normal((STEPS, 1, FEATURES)).astype(np.float32)}
    return {"x": rng.standard_normal((1, FEATURES)).astype(np.float32),
            "state": rng.standard_normal((2, 1, HIDDEN)).astype(np.float32),
            "sr": np.array(rng.choice([8000, 16000]), dtype=np.int64)}


MODELS = {"conv": conv_model, "lstm": lstm_model, "vad": vad_model}
FATES = ("close", "drop", "cycle", "keep")


class Soak:
    """The shared state of one soak: nets, reference outputs, messages, counts and failures."""

    def __init__(self, backends: list[str], validation: bool, seed: int, options: dict):
        self.backends = backends
        self.validation = validation
        self.options = options
        self.nets = {name: gpumnn.load(make()) for name, make in MODELS.items()}
        self.messages: list[list[str]] = []  # every Vulkan backend's validation messages
        self.failures: list[str] = []
        self.counts = {fate: 0 for fate in FATES}
        self.lock = threading.Lock()
        self.seed = seed
        self._collecting = threading.local()

    def session_options(self, backend: str) -> dict:
        options = dict(self.options.get(backend, {}))
        if backend == "vulkan" and self.validation:
            options["validation"] = True
        return options

    def collect_from_a_finalizer(self, _ref=None) -> None:
        """A weakref callback (it runs inside a collection, or as reference counting frees a
        session): collect again, so finalizers run where a finalizer already runs."""
        if getattr(self._collecting, "on", False):
            return
        self._collecting.on = True
        try:
            gc.collect(0)
        finally:
            self._collecting.on = False

    def worker(self, index: int, cycles: int) -> None:
        rng = np.random.default_rng(self.seed * 1000 + index)
        pick = random.Random(self.seed * 1000 + index)
        kept: list = []
        sentinels: list = []
        for cycle in range(cycles):
            name = pick.choice(list(MODELS))
            backend = self.backends[(cycle + index) % len(self.backends)]
            inputs = feeds(name, rng)
            try:
                sess = self.nets[name].session(backend=backend, fallback=False, **self.session_options(backend))
                vk = sess.backends.get("vulkan")
                if vk is not None and self.validation:
                    with self.lock:
                        self.messages.append(vk.validation_messages)
                got = sess.run(inputs)
                want = self.reference(name, inputs)
                for key, value in want.items():
                    if not np.allclose(got[key], value, rtol=1e-3, atol=1e-4):
                        self.fail(f"thread {index} cycle {cycle}: {name} on {backend}: {key} differs from cpu "
                                  f"by {np.max(np.abs(got[key] - value)):.3g}")
            except Exception as exc:  # noqa: BLE001 -- counted, the soak goes on
                self.fail(f"thread {index} cycle {cycle}: {name} on {backend}: {type(exc).__name__}: {exc}")
                continue
            fate = pick.choice(FATES)
            with self.lock:
                self.counts[fate] += 1
            if fate == "close":
                sess.close()
            elif fate == "cycle":  # only the cyclic collector frees it, at some later allocation
                holder = {"session": sess}
                holder["self"] = holder
                sentinels.append(weakref.ref(sess, self.collect_from_a_finalizer))
            elif fate == "keep":  # dropped a few cycles later, while others are created and run
                kept.append(sess)
                if len(kept) > 3:
                    kept.pop(pick.randrange(len(kept)))
            del sess
            sentinels = sentinels[-8:]
        with self.lock:
            LEFT_OPEN.extend(kept)  # closed by interpreter exit, with the shared devices

    def reference(self, name: str, inputs: dict) -> dict[str, np.ndarray]:
        with self.nets[name].session(backend="cpu") as cpu:
            return cpu.run(inputs)

    def fail(self, text: str) -> None:
        with self.lock:
            self.failures.append(text)
        print("FAIL", text, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", action="append", help="backends (repeat or comma list; default: every "
                        "available one)")
    parser.add_argument("--cycles", type=int, default=300, help="cycles per thread (default 300)")
    parser.add_argument("--threads", type=int, default=2, help="threads soaking at once (default 2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gc-threshold", type=int, default=50, help="gc.set_threshold's first value (default 50)")
    parser.add_argument("--hang-seconds", type=float, default=600, help="dump every thread and exit 3 after this")
    parser.add_argument("--no-validation", action="store_true", help="run Vulkan without the validation layer")
    args = parser.parse_args(argv)
    faulthandler.enable()
    faulthandler.dump_traceback_later(args.hang_seconds, exit=True)  # exits with 1 after the dump
    backends = ([b for arg in args.backend for b in arg.split(",") if b] if args.backend
                else gpumnn.available_backends())
    validation = not args.no_validation and "vulkan" in backends
    if validation:
        from gpumnn.backends.vulkan.device import validation_layer_available

        validation = validation_layer_available()
        if not validation:
            print("VK_LAYER_KHRONOS_validation is not installed: Vulkan runs without it", file=sys.stderr)
    soak = Soak(backends, validation, args.seed, {})
    gc.set_threshold(max(1, args.gc_threshold), 2, 2)
    started = time.perf_counter()
    threads = [threading.Thread(target=soak.worker, args=(i, args.cycles), name=f"soak-{i}")
               for i in range(max(1, args.threads))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    gc.collect()
    messages = [m for listener in soak.messages for m in listener]
    print(f"backends {','.join(backends)}; {args.threads} threads x {args.cycles} cycles in "
          f"{time.perf_counter() - started:.1f} s; sessions closed {soak.counts['close']}, dropped "
          f"{soak.counts['drop']}, dropped in a cycle {soak.counts['cycle']}, kept a while {soak.counts['keep']}; "
          f"validation {'on' if validation else 'off'}: {len(messages)} messages; failures {len(soak.failures)}",
          flush=True)
    for message in sorted(set(messages))[:10]:
        print("  VALIDATION", message[:400], flush=True)
    faulthandler.cancel_dump_traceback_later()
    print("clean exit" if not soak.failures and not messages else "exit with failures", flush=True)
    return 1 if soak.failures or messages else 0


if __name__ == "__main__":
    sys.exit(main())  # LEFT_OPEN's sessions and the shared devices go at exit, after this
