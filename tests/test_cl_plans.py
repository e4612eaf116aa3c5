"""The OpenCL C planner is API-neutral: it imports no GPU API and plans without a device, so a
backend on another API (CUDA) can consume the same plans. Numerics of the plans run on PoCL in
test_atomic_ops.py; here: what a consumer relies on -- every launch names a kernel its family's
source defines, sizes fit their work-groups, and scratch buffers are declared."""
from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest

from dispatch_chain import CHAIN, CONSTANTS, SHAPES
from gpumnn import atomic as A
from gpumnn.backends.kernels.cl import planner as cl_plans
from gpumnn.backends.base import TensorHandle


def test_the_planner_imports_no_gpu_api():
    code = ("import sys, gpumnn.backends.kernels.cl.planner; "
            "print(sorted(m for m in ('pyopencl', 'cupy', 'vulkan', 'moderngl') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@dataclass
class _Target:
    """A device described by what the planners read (cl_plans.PlannerTarget), none opened."""

    kernels: str
    is_gpu: bool
    compute_units: int = 4
    max_wg: int = 256
    tf32: bool = False
    float16_tensor_cores: bool = False

    @staticmethod
    def is_constant(handle: TensorHandle) -> bool:
        return handle.buffer == "constants"


def _declared(family: str) -> tuple[set[str], tuple[str, ...]]:
    """Kernel names the family's source declares, and the stems of macro-generated ones (``name_##SUF``)."""
    found = re.findall(r"kernel\w*\b[^\n;{]*?\bvoid\s+(\w+)(##)?", cl_plans.family_source(family), re.IGNORECASE)
    return {n for n, paste in found if not paste}, tuple(n for n, paste in found if paste)


EXTRA = [  # ops the chain lacks, with paths that need scratch and preparation on the simd family
    (A.MatMul(("p", "wt"), ("q",), "fc_t", batch=1, m=6, n=5, k=6, trans_b=True), {"wt": (5, 6)}, {"q": (6, 5)}),
    (A.MatMul(("v", "wt"), ("g",), "gemv_t", batch=1, m=1, n=5, k=6, trans_b=True, scheme="gemv"), {"v": (1, 6)},
     {"g": (1, 5)}),
    (A.MatMul(("v", "wv"), ("g2",), "gemv_split", batch=1, m=1, n=5, k=1024, scheme="gemv"),
     {"v": (1, 1024), "wv": (1024, 5)}, {"g2": (1, 5)}),
    (A.Resize(("x",), ("r",), "up", planes=8, in_hw=(12, 12), out_hw=(24, 24), scales=(2.0, 2.0), mode="linear"),
     {}, {"r": (1, 8, 24, 24)}),
    (A.Scatter(("x", "i", "u"), ("t",), "scatter", rows=8, inner=144, count=2, reduction="add"),
     {"i": (2,), "u": (2, 144)}, {"t": (8, 144)}),
]


@pytest.mark.parametrize("kernels,is_gpu", [("simd", False), ("tiled", True), ("tiled", False)])
def test_every_launch_names_a_declared_kernel_and_fits_its_work_groups(kernels, is_gpu):
    target = _Target(kernels, is_gpu)
    shapes = dict(SHAPES)
    cases = [(op, {}, {}) for op in CHAIN] + EXTRA
    prepared = 0
    for op, more_inputs, more_outputs in cases:
        shapes.update(more_inputs, **more_outputs)
        handles = {n: TensorHandle("constants" if n in CONSTANTS or n in ("wt", "wv") else "pool", 0, tuple(s))
                   for n, s in {**shapes, **{k: v.shape for k, v in CONSTANTS.items()}}.items()}
        planned = cl_plans.plan(target, op, [handles[n] for n in op.inputs], [handles[n] for n in op.outputs])
        assert planned.work, f"{op.source}: nothing to launch"
        prepared += len(planned.prepare)
        for ln in planned.prepare + planned.work:
            names, stems = _declared(ln.family)
            assert ln.name in names or ln.name.startswith(stems), f"{op.source}: {ln.family} has no kernel {ln.name}"
            if ln.lsize is not None:
                assert len(ln.lsize) == len(ln.gsize)
                assert all(g % s == 0 for g, s in zip(ln.gsize, ln.lsize)), f"{op.source}: {ln.gsize} / {ln.lsize}"
            for arg in ln.args:
                assert arg in ("pool", "constants") or isinstance(arg, (np.integer, np.floating)) or arg in planned.keep, (
                    f"{op.source}: argument {arg!r} is neither a tensor's buffer, a scalar nor a declared Scratch")
    if kernels == "simd":
        assert prepared, "the simd family packs constant weights once, at creation"


def test_raster_regions_of_one_source_share_a_launch_on_gpus_unless_they_collide():
    """Tiled (GPU) plans copy the regions of one source in one launch when no element is written
    twice (any order is then right); regions that collide keep one launch each, in order."""
    from test_atomic_ops import _tile_regions

    def plan(collide: bool, kernels: str = "tiled"):
        op = A.Raster(("x",), ("y",), "tiles", out_shape=(3, 4, 6), regions=_tile_regions(collide))
        ins = [TensorHandle("pool", 64, (4, 3, 2, 3))]
        outs = [TensorHandle("pool", 256, (3, 4, 6))]
        return cl_plans.PLANNERS[A.Raster](_Target(kernels, kernels == "tiled"), op, ins, outs)

    merged = plan(False)
    assert [ln.name for ln in merged.work] == ["raster_copy_regions"] and len(merged.keep) == 1
    table = merged.keep[0].data.reshape(4, cl_plans.RASTER_REGION_WORDS)
    assert list(table[:, 0]) == [18] * 4 and list(table[:, 5]) == [256, 257, 262, 263]  # counts, destination offsets
    assert [ln.name for ln in plan(True).work] == ["raster_copy"] * 4
    assert [ln.name for ln in plan(False, "simd").work] == ["raster_copy_vec"] * 4
