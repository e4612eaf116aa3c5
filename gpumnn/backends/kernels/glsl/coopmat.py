"""The tiled GEMM on cooperative matrices (VK_KHR_cooperative_matrix; ``gemm_coopmat.glsl``).

A Vulkan device that lists subgroup-scope products of float16 x float16 summing into float32
(and, where it also lists them, float32 x float32 ones), with the features such a shader needs,
multiplies the tiles of ``precision="fp16"``'s convolutions and GEMMs on them. What the device
offers (:class:`CooperativeMatrixSupport`, read from the driver by ``vulkan/device.py``, or made
by hand in tests) becomes the backend's :class:`CooperativeGemm` in one decision,
:func:`choose`, once per backend; the GLSL planner then asks :func:`tile_defines` per product
for the tile (or None: the plain tiled GEMM). OpenGL and devices without them plan the plain
GEMM, ``gemm_core.glsl``, as before.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Mapping

from ....errors import BackendOptionError

#: the environment variable the vulkan backend's ``cooperative_matrix`` option defaults to
ENV_VARIABLE = "GPUMNN_VULKAN_COOPERATIVE_MATRIX"
#: "auto": the cooperative-matrix GEMM where the device has it; "off": the plain tiled GEMM always
CHOICES = ("auto", "off")
#: what a scheme in the report ends with where its tiles multiply on cooperative matrices
LABEL = "coopmat"
#: the product types (A, B, C, result) a GEMM over tensors of each storage dtype multiplies in
PRODUCT_TYPES: Mapping[str, tuple[str, str, str, str]] = {
    "float16": ("float16", "float16", "float32", "float32"), "float32": ("float32",) * 4}
#: subgroups along M and N in a workgroup (gemm_coopmat.glsl's SGM, SGN)
SUBGROUPS_M = SUBGROUPS_N = 2
#: fragments of C along M and N per subgroup in the wide tile; the narrow one has one each
WIDE_FRAGMENTS = 2
#: K steps (CM_K deep each) staged in shared memory per pass over K (TK = K_STEPS * CM_K)
K_STEPS = 2
#: bytes each shared-memory row of a staged tile is padded by: the 16-byte alignment
#: OpCooperativeMatrixLoadKHR asks of a row's start, and rows that start in other banks
ROW_PAD_BYTES = 16
#: floats each row of a subgroup's accumulator slice (the epilogue's) is padded by
C_PAD = 4
#: the shortest side of a product whose tiles go on cooperative matrices: narrower ones keep
#: the plain GEMM's skinny tiles (gemm_core.glsl), as ``planner._gemm_tiles`` shapes them
MIN_SIDE = 48


@dataclass(frozen=True)
class CooperativeMatrixShape:
    """One product a device's cooperative matrices compute (VkCooperativeMatrixPropertiesKHR):
    result (M x N, ``result`` type) = A (M x K, ``a``) B (K x N, ``b``) + C (``c``), per subgroup
    or wider ``scope``."""

    m: int
    n: int
    k: int
    a: str
    b: str
    c: str
    result: str
    scope: str

    def __str__(self) -> str:
        return f"{self.m}x{self.n}x{self.k} {self.a}*{self.b}+{self.c}->{self.result} ({self.scope})"


@dataclass(frozen=True)
class CooperativeMatrixSupport:
    """What a Vulkan device offers a cooperative-matrix GEMM: the shapes it lists, its subgroup
    size and workgroup limits, whether float16 arithmetic (shaderFloat16) is enabled, and
    ``missing``: why no cooperative-matrix shader can run on it ("" where one can: the
    extension, ``cooperativeMatrix``, the Vulkan memory model, basic subgroup operations in
    compute shaders and compute among its supported stages are all there and enabled)."""

    shapes: tuple[CooperativeMatrixShape, ...]
    subgroup_size: int
    max_shared_memory: int
    max_invocations: int
    float16_arithmetic: bool
    missing: str = ""


@dataclass(frozen=True)
class CooperativeGemm:
    """The cooperative-matrix GEMM of one device: the product shape per storage dtype whose
    tiles use it, the subgroup size and the shared memory a workgroup may take."""

    shapes: tuple[tuple[str, CooperativeMatrixShape], ...]  # (storage dtype, shape)
    subgroup_size: int
    max_shared_memory: int

    def shape(self, dtype: str) -> CooperativeMatrixShape | None:
        return dict(self.shapes).get(dtype)

    def describe(self) -> str:
        per_dtype = "; ".join(f"{dtype} tensors: {shape.m}x{shape.n}x{shape.k} {shape.a}*{shape.b}+{shape.c}"
                              for dtype, shape in self.shapes)
        return (f"cooperative matrices (VK_KHR_cooperative_matrix, gemm_coopmat.glsl) for products of "
                f"{MIN_SIDE} x {MIN_SIDE} and more; {per_dtype}; {SUBGROUPS_M * SUBGROUPS_N} subgroups of "
                f"{self.subgroup_size} a workgroup")


def cooperative_matrix_option(value: str | None, backend: str) -> str:
    """The ``cooperative_matrix=`` value asked for (unset: ``$GPUMNN_VULKAN_COOPERATIVE_MATRIX``,
    else "auto"), or a BackendOptionError naming the valid values."""
    where = "cooperative_matrix="
    if value is None:
        value, where = os.environ.get(ENV_VARIABLE, "").strip().lower() or "auto", f"${ENV_VARIABLE}="
    if value not in CHOICES:
        raise BackendOptionError(f"backend {backend!r}: {where}{value!r} is not one of {', '.join(map(repr, CHOICES))}")
    return value


def _fits(shape: CooperativeMatrixShape, dtype: str, support: CooperativeMatrixSupport) -> bool:
    """Whether ``shape`` multiplies ``dtype`` tensors' tiles in gemm_coopmat.glsl on ``support``:
    subgroup scope, the dtype's product types, sides that whole 16-byte rows of shared memory
    hold (the loads' alignment), and the workgroup's shared memory within the device's."""
    size = 2 if dtype == "float16" else 4
    if shape.scope != "subgroup" or (shape.a, shape.b, shape.c, shape.result) != PRODUCT_TYPES[dtype]:
        return False
    if any(side * size % ROW_PAD_BYTES for side in (shape.m, shape.n, shape.k)):
        return False
    return shared_bytes(_defines(shape, dtype, 1, support.subgroup_size)) <= support.max_shared_memory


def choose(support: CooperativeMatrixSupport | None, option: str,
           compiler_missing: Callable[[], str]) -> tuple[CooperativeGemm | None, str]:
    """(the device's cooperative-matrix GEMM, or None; what ``gpumnn info`` says of it): the one
    place that decides. A storage dtype gets it where the device lists a subgroup shape of its
    product types (float16 ones with shaderFloat16 enabled), the device has what every such
    shader needs (``support.missing`` empty), ``option`` is "auto", the workgroup of
    SUBGROUPS_M x SUBGROUPS_N subgroups fits, and the GLSL compiler compiles
    GL_KHR_cooperative_matrix (``compiler_missing()``: why not, "" where it does; asked last)."""
    plain = "plain tiled GEMM (gemm_core.glsl)"
    if support is None:
        return None, f"{plain}: the device reports no cooperative matrices"
    if support.missing:
        return None, f"{plain}: {support.missing}"
    if option == "off":
        return None, f"{plain}: cooperative_matrix='off' or ${ENV_VARIABLE}=off"
    invocations = SUBGROUPS_M * SUBGROUPS_N * support.subgroup_size
    if support.subgroup_size <= 0 or invocations > support.max_invocations:
        return None, (f"{plain}: {SUBGROUPS_M * SUBGROUPS_N} subgroups of {support.subgroup_size} exceed the "
                      f"device's {support.max_invocations} invocations a workgroup")
    chosen = []
    for dtype in PRODUCT_TYPES:
        if dtype == "float16" and not support.float16_arithmetic:
            continue
        fitting = [s for s in support.shapes if _fits(s, dtype, support)]
        if fitting:  # the largest product, then the squarest
            chosen.append((dtype, max(fitting, key=lambda s: (s.m * s.n * s.k, -abs(s.m - s.n)))))
    if not chosen:
        listed = ", ".join(map(str, support.shapes)) or "none"
        return None, (f"{plain}: no subgroup shape of float16*float16+float32 (with shaderFloat16) or "
                      f"float32 products that gemm_coopmat.glsl can use among the device's ({listed})")
    why = compiler_missing()
    if why:
        return None, f"{plain}: the device has cooperative matrices but {why}"
    gemm = CooperativeGemm(tuple(chosen), support.subgroup_size, support.max_shared_memory)
    return gemm, gemm.describe()


def _defines(shape: CooperativeMatrixShape, dtype: str, fragments: int, subgroup_size: int) -> dict[str, int]:
    cm_m, cm_n, cm_k = shape.m, shape.n, shape.k
    defines = {"COOPMAT": 1, "CM_M": cm_m, "CM_N": cm_n, "CM_K": cm_k, "SGM": SUBGROUPS_M, "SGN": SUBGROUPS_N,
               "TM": SUBGROUPS_M * fragments * cm_m, "TN": SUBGROUPS_N * fragments * cm_n, "TK": K_STEPS * cm_k,
               "NT": SUBGROUPS_M * SUBGROUPS_N * subgroup_size}
    if dtype == "float32":
        defines["CM_FLOAT32"] = 1
    return defines


def element_bytes(defines: Mapping[str, int]) -> int:
    """Bytes of one staged element of A and B (gemm_coopmat.glsl's CM_T)."""
    return 4 if defines.get("CM_FLOAT32") else 2


def shared_bytes(defines: Mapping[str, int]) -> int:
    """Shared memory of one gemm_coopmat.glsl workgroup: A's [TM][AS] and B's [TK][BS] staged
    elements and each subgroup's CM_M x CS float slice for the epilogue."""
    size = element_bytes(defines)
    pad = ROW_PAD_BYTES // size
    staged = defines["TM"] * (defines["TK"] + pad) + defines["TK"] * (defines["TN"] + pad)
    slices = defines["SGM"] * defines["SGN"] * defines["CM_M"] * (defines["CM_N"] + C_PAD)
    return size * staged + 4 * slices


def tile_defines(gemm: CooperativeGemm | None, dtype: str, m: int, n: int, batch: int,
                 compute_units: int) -> dict[str, int] | None:
    """gemm_coopmat.glsl's defines for an ``m`` x ``n`` product (``batch`` of them) over
    ``dtype`` tensors, or None where it keeps the plain tiled GEMM (no cooperative GEMM, no shape
    for the dtype, a side under MIN_SIDE). The wide tile (WIDE_FRAGMENTS x WIDE_FRAGMENTS
    fragments per subgroup) unless its tiles would be fewer than two per compute unit, or its
    shared memory more than the device's; then one fragment per subgroup."""
    shape = gemm.shape(dtype) if gemm is not None else None
    if shape is None or m < MIN_SIDE or n < MIN_SIDE:
        return None
    wide = _defines(shape, dtype, WIDE_FRAGMENTS, gemm.subgroup_size)
    tiles = -(-m // wide["TM"]) * -(-n // wide["TN"]) * batch
    if tiles >= 2 * compute_units and shared_bytes(wide) <= gemm.max_shared_memory:
        return wide
    return _defines(shape, dtype, 1, gemm.subgroup_size)


__all__ = ["CHOICES", "CooperativeGemm", "CooperativeMatrixShape", "CooperativeMatrixSupport", "ENV_VARIABLE",
           "LABEL", "PRODUCT_TYPES", "choose", "cooperative_matrix_option", "element_bytes", "shared_bytes",
           "tile_defines"]
