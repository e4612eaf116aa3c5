"""The onnx node-test cases expected to fail, each group with its reason (tests/test_onnx_node.py).

Each :class:`Group` names the reason, the exception its cases fail with (a case failing in another
way is a red test) and the backends it applies to (``None``: all). The cases run as strict xfails:
a case that starts to pass fails the run until it is taken off this list. Only cases whose op types
gpumnn claims (``gpumnn.supported_ops()``) run at all; cases with other ops are checked to be
refused by name (test_unimplemented_ops_are_refused_by_name) and need no entry here.

The list today is the same on cpu, opencl, vulkan and gl: no group is backend-specific.
"""
from __future__ import annotations

from dataclasses import dataclass

from gpumnn.errors import ModelError, UnsupportedOpError


@dataclass(frozen=True)
class Group:
    reason: str
    raises: type[BaseException]
    cases: tuple[str, ...]
    backends: tuple[str, ...] | None = None  # None: every backend


def _names(text: str) -> tuple[str, ...]:
    return tuple(text.split())


GROUPS: tuple[Group, ...] = (
    Group(
        'a shape-determining input (axes, pads, starts/ends, split sizes, target shape, repeats, '
        "ConstantOfShape's shape) is a run-time graph input in the case; gpumnn fixes every shape when a "
        'session is created and needs these as constants or values computable from input shapes',
        UnsupportedOpError, _names("""
        test_center_crop_pad_crop_and_pad_expanded
        test_center_crop_pad_crop_axes_chw_expanded
        test_center_crop_pad_crop_axes_hwc_expanded
        test_center_crop_pad_crop_expanded
        test_center_crop_pad_crop_negative_axes_hwc_expanded
        test_center_crop_pad_pad_expanded
        test_constant_pad
        test_constant_pad_axes
        test_constant_pad_negative_axes
        test_constantofshape_float_ones
        test_constantofshape_int_shape_zero
        test_constantofshape_int_zeros
        test_edge_pad
        test_expand_dim_changed
        test_expand_dim_unchanged
        test_reduce_l1_default_axes_keepdims_example_expanded
        test_reduce_l1_default_axes_keepdims_random_expanded
        test_reduce_l1_do_not_keepdims_example_expanded
        test_reduce_l1_do_not_keepdims_random_expanded
        test_reduce_l1_empty_set_expanded
        test_reduce_l1_keep_dims_example_expanded
        test_reduce_l1_keep_dims_random_expanded
        test_reduce_l1_negative_axes_keep_dims_example_expanded
        test_reduce_l1_negative_axes_keep_dims_random_expanded
        test_reduce_log_sum_asc_axes_expanded
        test_reduce_log_sum_default_expanded
        test_reduce_log_sum_desc_axes_expanded
        test_reduce_log_sum_empty_set_expanded
        test_reduce_log_sum_negative_axes_expanded
        test_reduce_max_bool_inputs
        test_reduce_max_do_not_keepdims_example
        test_reduce_max_do_not_keepdims_random
        test_reduce_max_empty_set
        test_reduce_max_empty_set_bool
        test_reduce_max_keepdims_example
        test_reduce_max_keepdims_random
        test_reduce_max_negative_axes_keepdims_example
        test_reduce_max_negative_axes_keepdims_random
        test_reduce_mean_default_axes_keepdims_example
        test_reduce_mean_default_axes_keepdims_random
        test_reduce_mean_do_not_keepdims_example
        test_reduce_mean_do_not_keepdims_random
        test_reduce_mean_keepdims_example
        test_reduce_mean_keepdims_random
        test_reduce_mean_negative_axes_keepdims_example
        test_reduce_mean_negative_axes_keepdims_random
        test_reduce_min_bool_inputs
        test_reduce_min_do_not_keepdims_example
        test_reduce_min_do_not_keepdims_random
        test_reduce_min_empty_set
        test_reduce_min_keepdims_example
        test_reduce_min_keepdims_random
        test_reduce_min_negative_axes_keepdims_example
        test_reduce_min_negative_axes_keepdims_random
        test_reduce_sum_default_axes_keepdims_example
        test_reduce_sum_default_axes_keepdims_random
        test_reduce_sum_do_not_keepdims_example
        test_reduce_sum_do_not_keepdims_random
        test_reduce_sum_empty_axes_input_noop
        test_reduce_sum_empty_axes_input_noop_example
        test_reduce_sum_empty_set
        test_reduce_sum_empty_set_non_reduced_axis_zero
        test_reduce_sum_keepdims_example
        test_reduce_sum_keepdims_random
        test_reduce_sum_negative_axes_keepdims_example
        test_reduce_sum_negative_axes_keepdims_random
        test_reduce_sum_square_default_axes_keepdims_example_expanded
        test_reduce_sum_square_default_axes_keepdims_random_expanded
        test_reduce_sum_square_do_not_keepdims_example_expanded
        test_reduce_sum_square_do_not_keepdims_random_expanded
        test_reduce_sum_square_empty_set_expanded
        test_reduce_sum_square_keepdims_example_expanded
        test_reduce_sum_square_keepdims_random_expanded
        test_reduce_sum_square_negative_axes_keepdims_example_expanded
        test_reduce_sum_square_negative_axes_keepdims_random_expanded
        test_reflect_pad
        test_reshape_allowzero_reordered
        test_reshape_extended_dims
        test_reshape_negative_dim
        test_reshape_negative_extended_dims
        test_reshape_one_dim
        test_reshape_reduced_dims
        test_reshape_reordered_all_dims
        test_reshape_reordered_last_dims
        test_reshape_zero_and_negative_dim
        test_reshape_zero_dim
        test_slice
        test_slice_default_axes
        test_slice_default_steps
        test_slice_end_out_of_bounds
        test_slice_neg
        test_slice_neg_steps
        test_slice_negative_axes
        test_slice_start_out_of_bounds
        test_split_variable_parts_1d_opset13
        test_split_variable_parts_1d_opset18
        test_split_variable_parts_2d_opset13
        test_split_variable_parts_2d_opset18
        test_split_variable_parts_default_axis_opset13
        test_split_variable_parts_default_axis_opset18
        test_split_zero_size_splits_opset13
        test_split_zero_size_splits_opset18
        test_squeeze
        test_squeeze_negative_axes
        test_tile
        test_tile_precomputed
        test_unsqueeze_axis_0
        test_unsqueeze_axis_1
        test_unsqueeze_axis_2
        test_unsqueeze_negative_axes
        test_unsqueeze_three_axes
        test_unsqueeze_two_axes
        test_unsqueeze_unsorted_axes
        test_wrap_pad
    """)),
    Group(
        'Resize scales or sizes are run-time graph inputs in the case; gpumnn needs them at session creation '
        '(issue 8 part 4)',
        UnsupportedOpError, _names("""
        test_resize_downsample_scales_linear
        test_resize_downsample_scales_linear_align_corners
        test_resize_downsample_scales_nearest
        test_resize_downsample_sizes_linear_pytorch_half_pixel
        test_resize_downsample_sizes_nearest
        test_resize_downsample_sizes_nearest_not_larger
        test_resize_downsample_sizes_nearest_not_smaller
        test_resize_upsample_scales_linear
        test_resize_upsample_scales_linear_align_corners
        test_resize_upsample_scales_nearest
        test_resize_upsample_scales_nearest_axes_2_3
        test_resize_upsample_scales_nearest_axes_3_2
        test_resize_upsample_sizes_nearest
        test_resize_upsample_sizes_nearest_axes_2_3
        test_resize_upsample_sizes_nearest_axes_3_2
        test_resize_upsample_sizes_nearest_ceil_half_pixel
        test_resize_upsample_sizes_nearest_floor_align_corners
        test_resize_upsample_sizes_nearest_not_larger
        test_resize_upsample_sizes_nearest_not_smaller
        test_resize_upsample_sizes_nearest_round_prefer_ceil_asymmetric
        test_upsample_nearest
    """)),
    Group(
        "Resize modes gpumnn does not implement: mode 'cubic', antialias, coordinate_transformation_mode "
        "'half_pixel_symmetric' and 'tf_crop_and_resize' (issue 8 part 4)",
        UnsupportedOpError, _names("""
        test_resize_downsample_scales_cubic
        test_resize_downsample_scales_cubic_A_n0p5_exclude_outside
        test_resize_downsample_scales_cubic_align_corners
        test_resize_downsample_scales_cubic_antialias
        test_resize_downsample_scales_linear_antialias
        test_resize_downsample_scales_linear_half_pixel_symmetric
        test_resize_downsample_sizes_cubic
        test_resize_downsample_sizes_cubic_antialias
        test_resize_downsample_sizes_linear_antialias
        test_resize_tf_crop_and_resize
        test_resize_tf_crop_and_resize_axes_2_3
        test_resize_tf_crop_and_resize_axes_3_2
        test_resize_tf_crop_and_resize_extrapolation_value
        test_resize_upsample_scales_cubic
        test_resize_upsample_scales_cubic_A_n0p5_exclude_outside
        test_resize_upsample_scales_cubic_align_corners
        test_resize_upsample_scales_cubic_asymmetric
        test_resize_upsample_scales_linear_half_pixel_symmetric
        test_resize_upsample_sizes_cubic
    """)),
    Group(
        "LayerNormalization's optional Mean and InvStdDev outputs are not implemented (issue 8 part 4)",
        UnsupportedOpError, _names("""
        test_layer_normalization_2d_axis0
        test_layer_normalization_2d_axis1
        test_layer_normalization_2d_axis_negative_1
        test_layer_normalization_2d_axis_negative_2
        test_layer_normalization_3d_axis0_epsilon
        test_layer_normalization_3d_axis1_epsilon
        test_layer_normalization_3d_axis2_epsilon
        test_layer_normalization_3d_axis_negative_1_epsilon
        test_layer_normalization_3d_axis_negative_2_epsilon
        test_layer_normalization_3d_axis_negative_3_epsilon
        test_layer_normalization_4d_axis0
        test_layer_normalization_4d_axis1
        test_layer_normalization_4d_axis2
        test_layer_normalization_4d_axis3
        test_layer_normalization_4d_axis_negative_1
        test_layer_normalization_4d_axis_negative_2
        test_layer_normalization_4d_axis_negative_3
        test_layer_normalization_4d_axis_negative_4
        test_layer_normalization_default_axis
    """)),
    Group(
        'BatchNormalization with run-time scale/bias/mean/var (folded into constants today) or training-mode '
        'outputs (issue 8 part 4)',
        UnsupportedOpError, _names("""
        test_batchnorm_epsilon
        test_batchnorm_epsilon_training_mode
        test_batchnorm_example
        test_batchnorm_example_training_mode
    """)),
    Group(
        'Cast of run-time data to a type gpumnn has no tensors of (bfloat16, float8 variants, float4, '
        'int4/uint4, int2/uint2)',
        UnsupportedOpError, _names("""
        test_cast_FLOAT16_to_FLOAT4E2M1
        test_cast_FLOAT16_to_FLOAT8E4M3FN
        test_cast_FLOAT16_to_FLOAT8E4M3FNUZ
        test_cast_FLOAT16_to_FLOAT8E5M2
        test_cast_FLOAT16_to_FLOAT8E5M2FNUZ
        test_cast_FLOAT16_to_INT2
        test_cast_FLOAT16_to_INT4
        test_cast_FLOAT16_to_UINT2
        test_cast_FLOAT16_to_UINT4
        test_cast_FLOAT_to_BFLOAT16
        test_cast_FLOAT_to_FLOAT4E2M1
        test_cast_FLOAT_to_FLOAT8E4M3FN
        test_cast_FLOAT_to_FLOAT8E4M3FNUZ
        test_cast_FLOAT_to_FLOAT8E5M2
        test_cast_FLOAT_to_FLOAT8E5M2FNUZ
        test_cast_FLOAT_to_INT2
        test_cast_FLOAT_to_INT4
        test_cast_FLOAT_to_UINT2
        test_cast_FLOAT_to_UINT4
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
        test_castlike_FLOAT16_to_FLOAT4E2M1_expanded
        test_castlike_FLOAT16_to_FLOAT8E4M3FNUZ_expanded
        test_castlike_FLOAT16_to_FLOAT8E4M3FN_expanded
        test_castlike_FLOAT16_to_FLOAT8E5M2FNUZ_expanded
        test_castlike_FLOAT16_to_FLOAT8E5M2_expanded
        test_castlike_FLOAT16_to_INT2_expanded
        test_castlike_FLOAT16_to_INT4_expanded
        test_castlike_FLOAT16_to_UINT2_expanded
        test_castlike_FLOAT16_to_UINT4_expanded
        test_castlike_FLOAT_to_BFLOAT16_expanded
        test_castlike_FLOAT_to_FLOAT4E2M1_expanded
        test_castlike_FLOAT_to_FLOAT8E4M3FNUZ_expanded
        test_castlike_FLOAT_to_FLOAT8E4M3FN_expanded
        test_castlike_FLOAT_to_FLOAT8E5M2FNUZ_expanded
        test_castlike_FLOAT_to_FLOAT8E5M2_expanded
        test_castlike_FLOAT_to_INT2_expanded
        test_castlike_FLOAT_to_INT4_expanded
        test_castlike_FLOAT_to_UINT2_expanded
        test_castlike_FLOAT_to_UINT4_expanded
        test_castlike_no_saturate_FLOAT16_to_FLOAT8E4M3FNUZ_expanded
        test_castlike_no_saturate_FLOAT16_to_FLOAT8E4M3FN_expanded
        test_castlike_no_saturate_FLOAT16_to_FLOAT8E5M2FNUZ_expanded
        test_castlike_no_saturate_FLOAT16_to_FLOAT8E5M2_expanded
        test_castlike_no_saturate_FLOAT_to_FLOAT8E4M3FNUZ_expanded
        test_castlike_no_saturate_FLOAT_to_FLOAT8E4M3FN_expanded
        test_castlike_no_saturate_FLOAT_to_FLOAT8E5M2FNUZ_expanded
        test_castlike_no_saturate_FLOAT_to_FLOAT8E5M2_expanded
    """)),
    Group(
        "float16 and float64 tensors are computed as float32 and come back as float32, so the case's output "
        'dtype check fails (dtypes are issue 8 part 3)',
        AssertionError, _names("""
        test_cast_DOUBLE_to_FLOAT16
        test_cast_FLOAT16_to_DOUBLE
        test_cast_FLOAT4E2M1_to_FLOAT16
        test_cast_FLOAT8E4M3FNUZ_to_FLOAT16
        test_cast_FLOAT8E4M3FN_to_FLOAT16
        test_cast_FLOAT8E5M2FNUZ_to_FLOAT16
        test_cast_FLOAT8E5M2_to_FLOAT16
        test_cast_FLOAT_to_DOUBLE
        test_cast_FLOAT_to_FLOAT16
        test_cast_INT2_to_FLOAT16
        test_cast_INT4_to_FLOAT16
        test_cast_UINT2_to_FLOAT16
        test_cast_UINT4_to_FLOAT16
        test_cast_e8m0_FLOAT8E8M0_to_FLOAT16
        test_castlike_DOUBLE_to_FLOAT16_expanded
        test_castlike_FLOAT16_to_DOUBLE_expanded
        test_castlike_FLOAT4E2M1_to_FLOAT16_expanded
        test_castlike_FLOAT8E4M3FNUZ_to_FLOAT16_expanded
        test_castlike_FLOAT8E4M3FN_to_FLOAT16_expanded
        test_castlike_FLOAT8E5M2FNUZ_to_FLOAT16_expanded
        test_castlike_FLOAT8E5M2_to_FLOAT16_expanded
        test_castlike_FLOAT_to_DOUBLE_expanded
        test_castlike_FLOAT_to_FLOAT16_expanded
        test_castlike_INT2_to_FLOAT16_expanded
        test_castlike_INT4_to_FLOAT16_expanded
        test_castlike_UINT2_to_FLOAT16_expanded
        test_castlike_UINT4_to_FLOAT16_expanded
        test_flexattention_double_expanded_ver26
        test_flexattention_fp16_expanded_ver26
        test_max_float16
        test_max_float64
        test_min_float16
        test_min_float64
    """)),
    Group(
        'Range with run-time start/limit/delta: gpumnn folds Range at session creation and has no run-time '
        'kernel (issue 8 part 3)',
        UnsupportedOpError, _names("""
        test_range_bfloat16_type_positive_delta
        test_range_float16_type_positive_delta
        test_range_float_type_positive_delta
        test_range_int32_type_negative_delta
    """)),
    Group(
        "Dropout's training_mode is a run-time input: training mode (random masks) is not implemented, and "
        'gpumnn needs to know at session creation that it is off',
        UnsupportedOpError, _names("""
        test_training_dropout
        test_training_dropout_default
        test_training_dropout_default_mask
        test_training_dropout_mask
        test_training_dropout_zero_ratio
        test_training_dropout_zero_ratio_mask
    """)),
    Group(
        '3D pooling and 3D transposed convolution: the Pool2D and ConvTranspose2D atomic ops are 1D/2D only',
        UnsupportedOpError, _names("""
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
        UnsupportedOpError, _names("""
        test_averagepool_2d_dilations
        test_maxpool_2d_dilations
    """)),
    Group(
        "MaxPool's Indices output is not implemented",
        UnsupportedOpError, _names("""
        test_maxpool_with_argmax_2d_precomputed_pads
        test_maxpool_with_argmax_2d_precomputed_strides
    """)),
    Group(
        'sequence and optional graph inputs/outputs: gpumnn runs tensors only',
        ModelError, _names("""
        test_identity_opt
        test_identity_sequence
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
