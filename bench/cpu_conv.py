"""One convolution at a time on the cpu backend (native regions, the Python threads) against ONNX
Runtime: where a model's remaining gap to ONNX Runtime sits, layer by layer.

    python bench/cpu_conv.py 3,64,224,7,2,3 256,512,14,3,2,1 [--threads 2] [--repeats 7]

Each argument is ``in channels, out channels, size, kernel, stride, padding`` of a Conv + Relu
with a bias, batch 1. Each repeat times the three in turn in one process, each for ``runs`` runs
after a pause of ``--pause`` seconds, so that ONNX Runtime's worker, which spins ~50 ms after its
runs, has stopped before the next engine starts; a turn's figure is the median of its runs after
the first ``--skip``. Printed: the median over repeats of each, and the outputs' relative L2
error against ONNX Runtime. Nothing here asserts speed.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's gpumnn, not an installed one

import gpumnn  # noqa: E402


def conv_model(channels: int, out_channels: int, size: int, kernel: int, stride: int, pad: int):
    rng = np.random.default_rng()
    weight = (rng.standard_normal((out_channels, channels, kernel, kernel)) / np.sqrt(channels * kernel ** 2))
    inits = [numpy_helper.from_array(weight.astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal(out_channels).astype(np.float32), "B")]
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], kernel_shape=[kernel, kernel], strides=[stride, stride],
                              pads=[pad] * 4),
             helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=7)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("convolutions", nargs="+", help="in,out,size,kernel,stride,pad")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--skip", type=int, default=15)
    parser.add_argument("--pause", type=float, default=0.06)
    args = parser.parse_args()
    import onnxruntime as ort

    print(f"batch 1, {args.threads} threads; ms: median over {args.repeats} repeats of each turn's median")
    print(f"{'convolution':<28}{'regions':>10}{'threads':>10}{'ort':>10}{'err':>10}")
    for spec in args.convolutions:
        c, oc, size, k, s, p = (int(v) for v in spec.split(","))
        model = conv_model(c, oc, size, k, s, p)
        feed = {"x": np.random.default_rng().standard_normal((1, c, size, size)).astype(np.float32)}
        net = gpumnn.load(model)
        regions = net.session(backend="cpu", threads=args.threads)
        threads = net.session(backend="cpu", threads=args.threads, regions=False)
        options = ort.SessionOptions()
        options.intra_op_num_threads = args.threads
        peer = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        turns = {"regions": lambda: regions.run(feed), "threads": lambda: threads.run(feed),
                 "ort": lambda: peer.run(None, feed)}
        medians = {name: [] for name in turns}
        for _ in range(args.repeats):
            for name, run in turns.items():
                time.sleep(args.pause)
                samples = []
                for _ in range(args.runs):
                    start = time.perf_counter()
                    run()
                    samples.append(time.perf_counter() - start)
                medians[name].append(statistics.median(samples[args.skip:]) * 1000.0)
        ref = peer.run(None, feed)[0]
        err = np.linalg.norm(regions.run(feed)["y"] - ref) / np.linalg.norm(ref)
        cells = "".join(f"{statistics.median(medians[name]):>10.3f}" for name in turns)
        print(f"{spec:<28}{cells}{err:>10.1e}")
        regions.close()
        threads.close()


if __name__ == "__main__":
    main()
