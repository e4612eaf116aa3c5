"""OpenGL-specific behaviour: recorded dispatch lists that create nothing, eager mode, both
kernel families, several backends (contexts) side by side, unaligned tensor offsets, the GL
shader-compile path and the device limits.

Cross-backend numerics of every atomic op live in test_atomic_ops.py; the workload here is the
Vulkan tests' chain (conv -> add+relu -> concat -> pool -> in-place sigmoid -> matmul -> softmax).
"""
from __future__ import annotations

import numpy as np
import pytest

from conftest import rel_l2, require_backend
from gpumnn import atomic as A
from dispatch_chain import CHAIN, CONSTANTS, GL_VARIANTS, SHAPES, X, build, check_eager_with_fresh_pools, check_recorded_replay, cpu_reference


@pytest.fixture(scope="module", autouse=True)
def _gl_here():
    require_backend("gl")


def _backend(**options):
    from gpumnn.backends.gl.backend import GLBackend
    return GLBackend(**options)


@pytest.fixture(scope="module")
def reference():
    return cpu_reference()


@pytest.mark.parametrize("kernels", ["simd", "tiled"])
def test_recorded_submits_create_nothing_and_eager_agrees(kernels, reference):
    be = _backend(kernels=kernels)
    try:
        assert be.kernels == kernels
        _, handles, executions = build(be)
        recording, first = check_recorded_replay(be, handles, executions, reference)
        # eager: re-planned per op, waited on after each, same results
        be.write(handles["s"], np.zeros(SHAPES["s"], np.float32))
        before = dict(be.counters)
        be.run_eager(executions)
        after = dict(be.counters)
        assert after["programs_built"] == before["programs_built"]  # programs are cached by variant
        assert after["buffers_allocated"] == before["buffers_allocated"]
        assert after["submits"] - before["submits"] == len(CHAIN)
        np.testing.assert_allclose(be.read(handles["s"]), first, rtol=1e-6, atol=1e-7)
        # and the recording still replays after eager runs changed the GL state
        be.write(handles["s"], np.zeros(SHAPES["s"], np.float32))
        be.submit(recording)
        np.testing.assert_array_equal(be.read(handles["s"]), first)
    finally:
        be.close()


def test_eager_mode_with_fresh_pools_builds_no_programs_twice(reference):
    be = _backend()
    try:
        check_eager_with_fresh_pools(be, reference)
    finally:
        be.close()


def test_two_backends_share_nothing_and_interleave(reference):
    """Each backend has its own context (with the programs compiled in it) and buffers; using
    them alternately (each call makes its context current) gives both the right answer, and
    closing one leaves the other working."""
    a = _backend()
    b = _backend()
    try:
        assert a.ctx is not b.ctx
        _, ha, ea = build(a)
        built_a = a.counters["programs_built"]
        _, hb, eb = build(b)
        assert set(b._programs) == set(a._programs)  # the same kernels, each in its own context
        assert not {id(p) for p in a._programs.values()} & {id(p) for p in b._programs.values()}
        assert not set(a._buffers) & set(b._buffers)
        ra, rb = a.record(ea), b.record(eb)
        a.write(ha["x"], X)
        b.write(hb["x"], 2 * X)
        a.submit(ra)
        b.submit(rb)
        out_a, out_b = a.read(ha["s"]), b.read(hb["s"])
        assert rel_l2(out_a, reference) < 1e-4
        assert rel_l2(out_b, reference) > 1e-3  # a different input really ran on b
        b.close()
        a.submit(ra)
        np.testing.assert_array_equal(a.read(ha["s"]), out_a)
        assert a.counters["programs_built"] == built_a
    finally:
        a.close()
        b.close()


def test_unaligned_offsets_bind_aligned_windows():
    """Tensors at element offsets that are not multiples of the SSBO offset alignment."""
    be = _backend()
    try:
        pool = be.allocate(4 * 4096)
        x = be.tensor(pool, 3, (1000,))
        y = be.tensor(pool, 1500 + 5, (1000,))
        exe = be.create_execution(A.Unary(("x",), ("y",), "neg", op="neg", count=1000), [x], [y])
        (d,) = exe.work
        assert all(off % be.storage_align == 0 for _, _, off, _ in d.binds)
        data = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
        be.write(x, data)
        be.submit(be.record([exe]))
        np.testing.assert_array_equal(be.read(y), -data)
        np.testing.assert_array_equal(be.read(x), data)
    finally:
        be.close()


def test_info_alignment_and_limits():
    be = _backend()
    try:
        info = be.info
        assert info.name == "gl" and info.t_schedule_ms == 0.05 and info.flops > 0
        assert be.renderer in info.device and "OpenGL" in info.device
        if be.software:
            assert not info.is_gpu and be.kernels == "simd"
        assert be.alignment >= 64 and be.alignment % be.storage_align == 0
        assert all(be.unsupported_reason(op) is None for op in CHAIN)
        huge = A.MatMul(("a", "b"), ("c",), "fc", m=1, n=be.max_storage_range // 4, k=2)
        assert "GL_MAX_SHADER_STORAGE_BLOCK_SIZE" in be.unsupported_reason(huge)
        z = be.max_group_count[2] + 1
        wide = A.MatMul(("a", "b"), ("c",), "bmm", batch=z, m=1, n=1, k=1, a_batch_stride=1, b_batch_stride=1)
        assert "workgroup grid" in be.unsupported_reason(wide)
        assert "no kernel" in be.unsupported_reason(A.AtomicOp(("x",), ("y",), "odd"))
    finally:
        be.close()
    from gpumnn.backends.gl.backend import GLError
    with pytest.raises(GLError, match="closed"):
        be.allocate(16)


def test_kernel_variants_compile_in_the_gl_driver():
    """The GL prelude + API-neutral bodies compile and link in the driver (not just glslang)."""
    be = _backend()
    try:
        for name, defines in GL_VARIANTS:
            program = be._program(name, defines)
            assert 0 < program.nparams <= 32  # the driver keeps the array up to the last index used
        built = be.counters["programs_built"]
        be._program(*GL_VARIANTS[0])
        assert be.counters["programs_built"] == built  # cached per (kernel, defines)
        from gpumnn.backends.kernels.glsl.compile import ShaderCompileError
        with pytest.raises(ShaderCompileError, match="OpenGL driver rejected"):
            be._program("unary", {"OP": "undeclared_name"})
    finally:
        be.close()


def test_constants_survive_pool_release(reference):
    be = _backend()
    try:
        w = be.constant(CONSTANTS["w"])
        pool = be.allocate(1024)
        be.release(pool)
        be.release(pool)  # twice is harmless
        np.testing.assert_array_equal(be.read(w), CONSTANTS["w"])
        empty = be.constant(np.zeros((0, 3), np.float32))
        assert be.read(empty).shape == (0, 3)
    finally:
        be.close()
