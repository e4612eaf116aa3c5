"""A one-thread cpu session with the regions' kernels on the calling thread against one without
(``regions=False``: NumPy where no compiled loop stands alone), beside ONNX Runtime on one thread:
process CPU time per run, the three alternating in one process.

    .venv/bin/python bench/one_thread_regions.py --models text_direction crnn --rounds 5 --runs 100
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpumnn.tools.benchmark import Spread, load_model, onnxruntime_runner, rel_l2  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=["text_direction", "crnn", "byte_cnn", "yolox_nano",
                                                        "voice_activity"])
    parser.add_argument("--folder", default="/tmp/gpumnn-real-models", help="where bench/real_models.py saved them")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=100)
    args = parser.parse_args()
    print(f"ms of process CPU time per run, median (min-max) of {args.rounds} rounds of {args.runs} runs")
    print(f"{'model':<16} {'regions=False':>20} {'regions':>20} {'ORT':>20} {'new/old':>7} {'new/ORT':>7}  err")
    for name in args.models:
        net, model_bytes, feed = load_model(str(Path(args.folder) / f"{name}.onnx"))
        ort = onnxruntime_runner(model_bytes, 1)
        old = net.session(backend="cpu", threads=1, regions=False)
        new = net.session(backend="cpu", threads=1)
        reference = ort(feed)
        err = max(rel_l2(next(iter(s.run(feed).values())), reference) for s in (old, new))
        runs = {"old": lambda: old.run(feed), "new": lambda: new.run(feed), "ort": lambda: ort(feed)}
        times: dict[str, list[float]] = {key: [] for key in runs}
        for _ in range(args.rounds):
            for key, fn in runs.items():
                start = time.process_time()
                for _ in range(args.runs):
                    fn()
                times[key].append(1e3 * (time.process_time() - start) / args.runs)
        spreads = {key: Spread.of(value) for key, value in times.items()}
        print(f"{name:<16} {spreads['old']:.3f}  {spreads['new']:.3f}  {spreads['ort']:.3f} "
              f"{spreads['new'].median / spreads['old'].median:7.2f} {spreads['new'].median / spreads['ort'].median:7.2f}"
              f"  {err:.1e}", flush=True)
        old.close()
        new.close()


if __name__ == "__main__":
    main()
