"""The onnx node-test cases expected to fail, each group with its reason (tests/test_onnx_node.py).

Each :class:`Group` names the reason, the exception its cases fail with and a pattern its message
must contain (a case failing in another way, or with another message, is a red test) and the backends it applies to (``None``: all). The cases run as strict xfails:
a case that starts to pass fails the run until it is taken off this list. Only cases whose op types
gpumnn claims (``gpumnn.supported_ops()``) run at all; cases with other ops are checked to be
refused by name (test_unimplemented_ops_are_refused_by_name) and need no entry here.

The list today is the same on cpu, opencl, vulkan and gl: no group is backend-specific. Cases whose
shape-determining inputs (Reshape's shape, Resize's scales, Slice's starts, ...) are graph inputs
pass: a session keys its shape sets by those small inputs' values (see gpumnn.runtime.session).
"""
from __future__ import annotations

from dataclasses import dataclass

from gpumnn.errors import InputError, ModelError, UnsupportedOpError


@dataclass(frozen=True)
class Group:
    reason: str
    raises: type[BaseException]
    match: str  # a regular expression the exception's message must contain (re.search)
    cases: tuple[str, ...]
    backends: tuple[str, ...] | None = None  # None: every backend


def _names(text: str) -> tuple[str, ...]:
    return tuple(text.split())


GROUPS: tuple[Group, ...] = (
    Group(
        "Pad mode 'wrap' is not implemented (constant, reflect and edge are)",
        UnsupportedOpError, "mode 'wrap' is not supported", _names("""
        test_wrap_pad
    """)),
    Group(
        'a graph input of a type gpumnn holds no tensors of (bfloat16, the float8 and float4 types, int2/uint2, strings)',
        ModelError, r'graph input .*: gpumnn runs float, integer and bool tensors only', _names("""
        test_attention_3d_causal_bf16_expanded
        test_attention_4d_attn_mask_causal_bf16_expanded
        test_attention_4d_causal_bf16_expanded
        test_attention_4d_causal_padded_kv_bf16_expanded
        test_attention_4d_padded_kv_bf16_expanded
        test_cast_BFLOAT16_to_FLOAT
        test_cast_FLOAT4E2M1_to_FLOAT
        test_cast_FLOAT4E2M1_to_FLOAT16
        test_cast_FLOAT8E4M3FNUZ_to_FLOAT
        test_cast_FLOAT8E4M3FNUZ_to_FLOAT16
        test_cast_FLOAT8E4M3FN_to_FLOAT
        test_cast_FLOAT8E4M3FN_to_FLOAT16
        test_cast_FLOAT8E5M2FNUZ_to_FLOAT
        test_cast_FLOAT8E5M2FNUZ_to_FLOAT16
        test_cast_FLOAT8E5M2_to_FLOAT
        test_cast_FLOAT8E5M2_to_FLOAT16
        test_cast_INT2_to_FLOAT
        test_cast_INT2_to_FLOAT16
        test_cast_INT2_to_INT8
        test_cast_UINT2_to_FLOAT
        test_cast_UINT2_to_FLOAT16
        test_cast_UINT2_to_UINT8
        test_cast_e8m0_FLOAT8E8M0_to_FLOAT
        test_cast_e8m0_FLOAT8E8M0_to_FLOAT16
        test_castlike_BFLOAT16_to_FLOAT
        test_castlike_BFLOAT16_to_FLOAT_expanded
        test_castlike_FLOAT16_to_FLOAT4E2M1
        test_castlike_FLOAT16_to_FLOAT4E2M1_expanded
        test_castlike_FLOAT16_to_FLOAT8E4M3FN
        test_castlike_FLOAT16_to_FLOAT8E4M3FNUZ
        test_castlike_FLOAT16_to_FLOAT8E4M3FNUZ_expanded
        test_castlike_FLOAT16_to_FLOAT8E4M3FN_expanded
        test_castlike_FLOAT16_to_FLOAT8E5M2
        test_castlike_FLOAT16_to_FLOAT8E5M2FNUZ
        test_castlike_FLOAT16_to_FLOAT8E5M2FNUZ_expanded
        test_castlike_FLOAT16_to_FLOAT8E5M2_expanded
        test_castlike_FLOAT16_to_INT2
        test_castlike_FLOAT16_to_INT2_expanded
        test_castlike_FLOAT16_to_UINT2
        test_castlike_FLOAT16_to_UINT2_expanded
        test_castlike_FLOAT4E2M1_to_FLOAT
        test_castlike_FLOAT4E2M1_to_FLOAT16
        test_castlike_FLOAT4E2M1_to_FLOAT16_expanded
        test_castlike_FLOAT4E2M1_to_FLOAT_expanded
        test_castlike_FLOAT8E4M3FNUZ_to_FLOAT
        test_castlike_FLOAT8E4M3FNUZ_to_FLOAT16
        test_castlike_FLOAT8E4M3FNUZ_to_FLOAT16_expanded
        test_castlike_FLOAT8E4M3FNUZ_to_FLOAT_expanded
        test_castlike_FLOAT8E4M3FN_to_FLOAT
        test_castlike_FLOAT8E4M3FN_to_FLOAT16
        test_castlike_FLOAT8E4M3FN_to_FLOAT16_expanded
        test_castlike_FLOAT8E4M3FN_to_FLOAT_expanded
        test_castlike_FLOAT8E5M2FNUZ_to_FLOAT
        test_castlike_FLOAT8E5M2FNUZ_to_FLOAT16
        test_castlike_FLOAT8E5M2FNUZ_to_FLOAT16_expanded
        test_castlike_FLOAT8E5M2FNUZ_to_FLOAT_expanded
        test_castlike_FLOAT8E5M2_to_FLOAT
        test_castlike_FLOAT8E5M2_to_FLOAT16
        test_castlike_FLOAT8E5M2_to_FLOAT16_expanded
        test_castlike_FLOAT8E5M2_to_FLOAT_expanded
        test_castlike_FLOAT_to_BFLOAT16
        test_castlike_FLOAT_to_BFLOAT16_expanded
        test_castlike_FLOAT_to_FLOAT4E2M1
        test_castlike_FLOAT_to_FLOAT4E2M1_expanded
        test_castlike_FLOAT_to_FLOAT8E4M3FN
        test_castlike_FLOAT_to_FLOAT8E4M3FNUZ
        test_castlike_FLOAT_to_FLOAT8E4M3FNUZ_expanded
        test_castlike_FLOAT_to_FLOAT8E4M3FN_expanded
        test_castlike_FLOAT_to_FLOAT8E5M2
        test_castlike_FLOAT_to_FLOAT8E5M2FNUZ
        test_castlike_FLOAT_to_FLOAT8E5M2FNUZ_expanded
        test_castlike_FLOAT_to_FLOAT8E5M2_expanded
        test_castlike_FLOAT_to_INT2
        test_castlike_FLOAT_to_INT2_expanded
        test_castlike_FLOAT_to_UINT2
        test_castlike_FLOAT_to_UINT2_expanded
        test_castlike_INT2_to_FLOAT
        test_castlike_INT2_to_FLOAT16
        test_castlike_INT2_to_FLOAT16_expanded
        test_castlike_INT2_to_FLOAT_expanded
        test_castlike_INT2_to_INT8
        test_castlike_INT2_to_INT8_expanded
        test_castlike_UINT2_to_FLOAT
        test_castlike_UINT2_to_FLOAT16
        test_castlike_UINT2_to_FLOAT16_expanded
        test_castlike_UINT2_to_FLOAT_expanded
        test_castlike_UINT2_to_UINT8
        test_castlike_UINT2_to_UINT8_expanded
        test_castlike_no_saturate_FLOAT16_to_FLOAT8E4M3FN
        test_castlike_no_saturate_FLOAT16_to_FLOAT8E4M3FNUZ
        test_castlike_no_saturate_FLOAT16_to_FLOAT8E4M3FNUZ_expanded
        test_castlike_no_saturate_FLOAT16_to_FLOAT8E4M3FN_expanded
        test_castlike_no_saturate_FLOAT16_to_FLOAT8E5M2
        test_castlike_no_saturate_FLOAT16_to_FLOAT8E5M2FNUZ
        test_castlike_no_saturate_FLOAT16_to_FLOAT8E5M2FNUZ_expanded
        test_castlike_no_saturate_FLOAT16_to_FLOAT8E5M2_expanded
        test_castlike_no_saturate_FLOAT_to_FLOAT8E4M3FN
        test_castlike_no_saturate_FLOAT_to_FLOAT8E4M3FNUZ
        test_castlike_no_saturate_FLOAT_to_FLOAT8E4M3FNUZ_expanded
        test_castlike_no_saturate_FLOAT_to_FLOAT8E4M3FN_expanded
        test_castlike_no_saturate_FLOAT_to_FLOAT8E5M2
        test_castlike_no_saturate_FLOAT_to_FLOAT8E5M2FNUZ
        test_castlike_no_saturate_FLOAT_to_FLOAT8E5M2FNUZ_expanded
        test_castlike_no_saturate_FLOAT_to_FLOAT8E5M2_expanded
        test_celu_bfloat16
        test_celu_bfloat16_expanded
        test_dequantizelinear_e4m3fn
        test_dequantizelinear_e4m3fn_float16
        test_dequantizelinear_e4m3fn_zero_point
        test_dequantizelinear_e5m2
        test_dequantizelinear_float4e2m1
        test_dequantizelinear_int2
        test_dequantizelinear_uint2
        test_einsum_batch_matmul_bfloat16
        test_einsum_sum_bfloat16
        test_einsum_transpose_bfloat16
        test_equal_string
        test_equal_string_broadcast
        test_onehot_with_bfloat16_values
        test_quantizelinear_e4m3fn
        test_quantizelinear_e5m2
        test_quantizelinear_float4e2m1
        test_quantizelinear_int2
        test_quantizelinear_uint2
        test_range_bfloat16_type_positive_delta
        test_range_bfloat16_type_positive_delta_expanded
    """)),
    Group(
        'Cast of run-time data to a type gpumnn holds no tensors of (bfloat16, the float8 and float4 types, int2/uint2)',
        UnsupportedOpError, r'cast of run-time data to \w+: gpumnn holds float, integer and bool tensors only', _names("""
        test_cast_FLOAT16_to_FLOAT4E2M1
        test_cast_FLOAT16_to_FLOAT8E4M3FN
        test_cast_FLOAT16_to_FLOAT8E4M3FNUZ
        test_cast_FLOAT16_to_FLOAT8E5M2
        test_cast_FLOAT16_to_FLOAT8E5M2FNUZ
        test_cast_FLOAT16_to_INT2
        test_cast_FLOAT16_to_UINT2
        test_cast_FLOAT_to_BFLOAT16
        test_cast_FLOAT_to_FLOAT4E2M1
        test_cast_FLOAT_to_FLOAT8E4M3FN
        test_cast_FLOAT_to_FLOAT8E4M3FNUZ
        test_cast_FLOAT_to_FLOAT8E5M2
        test_cast_FLOAT_to_FLOAT8E5M2FNUZ
        test_cast_FLOAT_to_INT2
        test_cast_FLOAT_to_UINT2
        test_cast_e8m0_FLOAT16_to_FLOAT8E8M0
        test_cast_e8m0_FLOAT_to_FLOAT8E8M0
        test_cast_no_saturate_FLOAT16_to_FLOAT8E4M3FN
        test_cast_no_saturate_FLOAT16_to_FLOAT8E4M3FNUZ
        test_cast_no_saturate_FLOAT16_to_FLOAT8E5M2
        test_cast_no_saturate_FLOAT16_to_FLOAT8E5M2FNUZ
        test_cast_no_saturate_FLOAT_to_FLOAT8E4M3FN
        test_cast_no_saturate_FLOAT_to_FLOAT8E4M3FNUZ
        test_cast_no_saturate_FLOAT_to_FLOAT8E5M2
        test_cast_no_saturate_FLOAT_to_FLOAT8E5M2FNUZ
    """)),
    Group(
        "float16 tensors are computed in float32: a few elements differ from the float16 reference by more than the case's rtol of 1e-3",
        AssertionError, r'Not equal to tolerance rtol=0\.001', _names("""
        test_attention_4d_causal_fp16_expanded
    """)),
    Group(
        "Dropout's training_mode is a run-time input: training mode (random masks) is not implemented, and gpumnn needs to know at session creation that it is off",
        UnsupportedOpError, r'training mode \(random masks\) is not supported', _names("""
        test_training_dropout
        test_training_dropout_default
        test_training_dropout_default_mask
        test_training_dropout_mask
        test_training_dropout_zero_ratio
        test_training_dropout_zero_ratio_mask
    """)),
    Group(
        '3D pooling and 3D transposed convolution: the Pool2D and ConvTranspose2D atomic ops are 1D/2D only',
        UnsupportedOpError, r'only 1D and 2D spatial inputs are supported, got shape \[\d+, \d+, \d+, \d+, \d+\]', _names("""
        test_averagepool_3d_default
        test_averagepool_3d_dilations_large_count_include_pad_is_0_ceil_mode_is_False
        test_averagepool_3d_dilations_large_count_include_pad_is_0_ceil_mode_is_True
        test_averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_False
        test_averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_True
        test_averagepool_3d_dilations_small
        test_convtranspose_3d
        test_maxpool_3d_default
        test_maxpool_3d_dilations
        test_maxpool_3d_dilations_use_ref_impl
        test_maxpool_3d_dilations_use_ref_impl_large
    """)),
    Group(
        'dilated pooling: the Pool2D atomic op has no dilations',
        UnsupportedOpError, r'dilated pooling is not supported', _names("""
        test_averagepool_2d_dilations
        test_maxpool_2d_dilations
    """)),
    Group(
        "MaxPool's Indices output is not implemented",
        UnsupportedOpError, r'the Indices output is not supported', _names("""
        test_maxpool_with_argmax_2d_precomputed_pads
        test_maxpool_with_argmax_2d_precomputed_strides
    """)),
    Group(
        'sequence and optional graph inputs/outputs: gpumnn runs tensors only',
        ModelError, r'are not tensors \(sequence, map or optional values\); gpumnn runs tensors only', _names("""
        test_identity_opt
        test_identity_sequence
    """)),
    Group(
        "Scan-8 (batched, with sequence_lens): onnx.version_converter's Scan 8->9 adapter drops the batch axis from "
        "the graph's declared input shapes, so the case's batch-of-1 inputs no longer match the converted model",
        InputError, r'shape \[1, 2\] has rank 2, the model expects rank 1', _names("""
        test_scan_sum
    """)),
    Group(
        'written at opset 1, which onnx.version_converter cannot convert (it starts at opset 7)',
        ModelError, r'opset 1 is outside the supported range', _names("""
        test_not_2d
        test_not_3d
        test_not_4d
    """)),
)

EXPECTED: dict[tuple[str, str | None], Group] = {}
for _group in GROUPS:
    for _case in _group.cases:
        for _backend in _group.backends or (None,):
            if (_case, _backend) in EXPECTED:
                raise ValueError(f"{_case} is listed twice (for backend {_backend})")
            EXPECTED[(_case, _backend)] = _group


def expected_failure(case: str, backend: str) -> Group | None:
    """The group that expects ``case`` (a node-test name, without the device suffix) to fail on ``backend``."""
    return EXPECTED.get((case, backend)) or EXPECTED.get((case, None))
