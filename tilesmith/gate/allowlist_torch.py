"""Names from torch 2.13's own namespaces that a candidate may use, as data (stdlib only; read by gate/allowlist.py).

Generated from the installed torch, then reviewed; regenerate with the expressions below when torch moves:
- ATEN_FUNCTIONS: `dir(torch._C._VariableFunctions)` (no dunders): each `torch.<name>` is one ATen operator
  (tensors in, tensors out; the underscored ones too: `torch._addmm_activation` is cuBLASLt's fused epilogue).
  Left out: `from_file` (reads a file), `_from_blob` (a tensor over any address), `_print` (the console),
  `_cufft_set_plan_cache_max_size` and `_cufft_clear_plan_cache` (a process-wide cache), functorch's batch levels
  (`_add_batch_dim`, `_remove_batch_dim`), and ops that exist for torch's own tests (`_test_*`, `_foobar`,
  `_propagate_xla_data`, `_make_dep_token`).
- NN_FUNCTIONAL: the functions of `torch.nn.functional` (not its imported modules `torch`, `math`, `np`, `importlib`,
  `warnings`, `dataclasses`, nor `handle_torch_function` and friends): tensor math like the above.
- TENSOR_ATTRS: `dir(torch.Tensor)` without underscores, less what reaches beyond tensor math: storages and their
  files and shared memory (`storage`, `untyped_storage`, `share_memory_`, `from_file`), numpy arrays (`numpy`: their
  `tofile`, `dump`, `ctypes`), autograd's graph and hooks (`grad_fn`, `register_hook`, `backward`, ...), a storage swapped
  under a tensor (`set_`, `data`), streams (`record_stream`), Python callables run per element (`apply_`, `map_`), a
  change of class (`as_subclass`), module loading hooks (`module_load`).
They are the attribute names allowed on values (a tensor, a size, a dtype); `tensor.from_file` and the like stay out.
"""

ATEN_FUNCTIONS = frozenset("""
    _adaptive_avg_pool2d _adaptive_avg_pool3d _add_relu _add_relu_ _addmm_activation _aminmax
    _amp_foreach_non_finite_check_and_unscale_ _amp_update_scale_ _assert_async _assert_scalar
    _assert_tensor_metadata _batch_norm_impl_index _cast_Byte _cast_Char _cast_Double _cast_Float _cast_Half
    _cast_Int _cast_Long _cast_Short _choose_qparams_per_tensor _chunk_cat _coalesce _compute_linear_combination
    _conj _conj_copy _conj_physical _convert_indices_from_coo_to_csr _convert_indices_from_csr_to_coo
    _convert_weight_to_int4pack _convert_weight_to_int4pack_for_cpu _convolution _convolution_mode _copy_from
    _copy_from_and_resize _cslt_compress _cslt_sparse_mm _cslt_sparse_mm_search _ctc_loss _cudnn_ctc_loss
    _cudnn_init_dropout_state _cudnn_rnn _cudnn_rnn_flatten_weight _cufft_get_plan_cache_max_size
    _cufft_get_plan_cache_size _cummax_helper _cummin_helper _debug_has_internal_overlap _dim_arange _dirichlet_grad
    _dyn_quant_matmul_4bit _dyn_quant_pack_4bit_weight _efficientzerotensor _embedding_bag
    _embedding_bag_forward_only _empty_affine_quantized _empty_per_channel_affine_quantized _euclidean_dist
    _fake_quantize_learnable_per_channel_affine _fake_quantize_learnable_per_tensor_affine
    _fake_quantize_per_tensor_affine_cachemask_tensor_qparams _fft_c2c _fft_c2r _fft_r2c _fill_mem_eff_dropout_mask_
    _flash_attention_forward_no_dropout_inplace _foreach_abs _foreach_abs_ _foreach_acos _foreach_acos_ _foreach_add
    _foreach_add_ _foreach_addcdiv _foreach_addcdiv_ _foreach_addcmul _foreach_addcmul_ _foreach_asin _foreach_asin_
    _foreach_atan _foreach_atan_ _foreach_ceil _foreach_ceil_ _foreach_clamp_max _foreach_clamp_max_
    _foreach_clamp_min _foreach_clamp_min_ _foreach_clone _foreach_copy_ _foreach_cos _foreach_cos_ _foreach_cosh
    _foreach_cosh_ _foreach_div _foreach_div_ _foreach_erf _foreach_erf_ _foreach_erfc _foreach_erfc_ _foreach_exp
    _foreach_exp_ _foreach_expm1 _foreach_expm1_ _foreach_floor _foreach_floor_ _foreach_frac _foreach_frac_
    _foreach_lerp _foreach_lerp_ _foreach_lgamma _foreach_lgamma_ _foreach_log _foreach_log10 _foreach_log10_
    _foreach_log1p _foreach_log1p_ _foreach_log2 _foreach_log2_ _foreach_log_ _foreach_max _foreach_maximum
    _foreach_maximum_ _foreach_minimum _foreach_minimum_ _foreach_mm _foreach_mul _foreach_mul_ _foreach_neg
    _foreach_neg_ _foreach_norm _foreach_pow _foreach_pow_ _foreach_powsum _foreach_reciprocal _foreach_reciprocal_
    _foreach_round _foreach_round_ _foreach_rsqrt _foreach_rsqrt_ _foreach_sigmoid _foreach_sigmoid_ _foreach_sign
    _foreach_sign_ _foreach_sin _foreach_sin_ _foreach_sinh _foreach_sinh_ _foreach_sqrt _foreach_sqrt_ _foreach_sub
    _foreach_sub_ _foreach_tan _foreach_tan_ _foreach_tanh _foreach_tanh_ _foreach_trunc _foreach_trunc_
    _foreach_zero_ _functional_assert_async _functional_assert_scalar _functional_sym_constrain_range
    _functional_sym_constrain_range_for_size _fused_adagrad_ _fused_adam_ _fused_adamw_ _fused_dropout
    _fused_moving_avg_obs_fq_helper _fused_rms_norm _fused_sdp_choice _fused_sgd_ _fw_primal_copy
    _grid_sampler_2d_cpu_fallback _grouped_mm _has_compatible_shallow_copy_type _histogramdd_bin_edges
    _histogramdd_from_bin_cts _histogramdd_from_bin_tensors _index_put_impl_ _indices_copy _int_mm _is_all_true
    _is_any_true _is_zerotensor _lazy_clone _linalg_check_errors _linalg_det _linalg_eigh _linalg_slogdet
    _linalg_solve_ex _linalg_svd _log_softmax _log_softmax_backward_data _logcumsumexp _lstm_mps _lu_with_info
    _make_dual _make_dual_copy _make_per_channel_quantized_tensor _make_per_tensor_quantized_tensor _masked_scale
    _masked_softmax _mixed_dtypes_linear _mkldnn_reshape _mkldnn_transpose _mkldnn_transpose_ _mps_convolution
    _mps_convolution_transpose _native_batch_norm_legit _native_batch_norm_legit_no_training
    _native_multi_head_attention _neg_view _neg_view_copy _nested_compute_contiguous_strides_offsets
    _nested_from_padded _nested_from_padded_and_nested_example _nested_from_padded_tensor _nested_get_jagged_dummy
    _nested_get_lengths _nested_get_max_seqlen _nested_get_min_seqlen _nested_get_offsets _nested_get_ragged_idx
    _nested_get_values _nested_get_values_copy _nested_tensor_from_mask _nested_tensor_from_mask_left_aligned
    _nested_tensor_from_tensor_list _nested_tensor_softmax_with_shape _nested_view_from_buffer
    _nested_view_from_buffer_copy _nested_view_from_jagged _nested_view_from_jagged_copy _nnpack_available
    _nnpack_spatial_convolution _pack_padded_sequence _pad_packed_sequence _philox_key_fold_in _philox_key_split
    _philox_normal_ _philox_uniform_ _pin_memory _prelu_kernel _reshape_alias_copy _reshape_from_tensor
    _resize_output_ _rowwise_prune _safe_softmax _sample_dirichlet _saturate_weight_to_fp16
    _scaled_dot_product_attention_math _scaled_dot_product_attention_math_for_mps
    _scaled_dot_product_cudnn_attention _scaled_dot_product_efficient_attention _scaled_dot_product_flash_attention
    _scaled_dot_product_flash_attention_for_cpu _scaled_grouped_mm _scaled_grouped_mm_v2 _scaled_mm _scaled_mm_v2
    _shape_as_tensor _sobol_engine_draw _sobol_engine_ff_ _sobol_engine_initialize_state_ _sobol_engine_scramble_
    _softmax _softmax_backward_data _sparse_broadcast_to _sparse_broadcast_to_copy _sparse_csr_prod _sparse_csr_sum
    _sparse_log_softmax_backward_data _sparse_semi_structured_addmm _sparse_semi_structured_apply
    _sparse_semi_structured_apply_dense _sparse_semi_structured_linear _sparse_semi_structured_mm
    _sparse_semi_structured_tile _sparse_softmax_backward_data _sparse_sparse_matmul _sparse_sum _stack
    _standard_gamma _standard_gamma_grad _to_cpu _to_sparse_semi_structured _transform_bias_rescale_qkv
    _transformer_encoder_layer_fwd _trilinear _triton_multi_head_attention _triton_scaled_dot_attention _unique
    _unique2 _unpack_dual _unsafe_index _unsafe_index_put _unsafe_masked_index _unsafe_masked_index_put_accumulate
    _use_cudnn_ctc_loss _use_cudnn_rnn_flatten_weight _use_miopen_ctc_loss _validate_compressed_sparse_indices
    _validate_sparse_bsc_tensor_args _validate_sparse_bsr_tensor_args _validate_sparse_compressed_tensor_args
    _validate_sparse_coo_tensor_args _validate_sparse_csc_tensor_args _validate_sparse_csr_tensor_args _values_copy
    _weight_int4pack_mm _weight_int4pack_mm_for_cpu _weight_int4pack_mm_with_scales_and_zeros _weight_int8pack_mm
    _weight_norm _weight_norm_interface _wrapped_linear_prepack _wrapped_quantized_linear_prepacked abs abs_
    absolute acos acos_ acosh acosh_ adaptive_avg_pool1d adaptive_max_pool1d add addbmm addcdiv addcmul addmm addmv
    addmv_ addr adjoint affine_grid_generator alias_copy all allclose alpha_dropout alpha_dropout_ amax amin aminmax
    angle any arange arccos arccos_ arccosh arccosh_ arcsin arcsin_ arcsinh arcsinh_ arctan arctan2 arctan_ arctanh
    arctanh_ argmax argmin argsort argwhere as_strided as_strided_ as_strided_copy as_strided_scatter as_tensor
    asarray asin asin_ asinh asinh_ atan atan2 atan_ atanh atanh_ atleast_1d atleast_2d atleast_3d avg_pool1d
    baddbmm bartlett_window batch_norm batch_norm_backward_elemt batch_norm_backward_reduce batch_norm_elemt
    batch_norm_gather_stats batch_norm_gather_stats_with_counts batch_norm_stats batch_norm_update_stats bernoulli
    bilinear binary_cross_entropy_with_logits bincount binomial bitwise_and bitwise_left_shift bitwise_not
    bitwise_or bitwise_right_shift bitwise_xor blackman_window block_diag bmm broadcast_tensors broadcast_to
    bucketize can_cast cartesian_prod cat ccol_indices_copy cdist ceil ceil_ celu celu_ chain_matmul channel_shuffle
    cholesky cholesky_inverse cholesky_solve choose_qparams_optimized chunk clamp clamp_ clamp_max clamp_max_
    clamp_min clamp_min_ clip clip_ clone col_indices_copy column_stack combinations complex concat concatenate conj
    conj_physical conj_physical_ constant_pad_nd conv1d conv2d conv3d conv_tbc conv_transpose1d conv_transpose2d
    conv_transpose3d convolution copysign corrcoef cos cos_ cosh cosh_ cosine_embedding_loss cosine_similarity
    count_nonzero cov cross crow_indices_copy ctc_loss cudnn_affine_grid_generator cudnn_batch_norm
    cudnn_convolution cudnn_convolution_add_relu cudnn_convolution_relu cudnn_convolution_transpose
    cudnn_grid_sampler cudnn_is_acceptable cummax cummin cumprod cumsum cumulative_trapezoid deg2rad deg2rad_
    dequantize det detach detach_ detach_copy diag diag_embed diagflat diagonal diagonal_copy diagonal_scatter diff
    digamma dist div divide dot dropout dropout_ dsmm dsplit dstack einsum embedding embedding_bag embedding_renorm_
    empty empty_like empty_permuted empty_quantized empty_strided eq equal erf erf_ erfc erfc_ erfinv exp exp2 exp2_
    exp_ expand_copy expm1 expm1_ eye fake_quantize_per_channel_affine fake_quantize_per_tensor_affine
    fbgemm_linear_fp16_weight fbgemm_linear_fp16_weight_fp32_activation fbgemm_linear_int8_weight
    fbgemm_linear_int8_weight_fp32_activation fbgemm_linear_quantize_weight fbgemm_pack_gemm_matrix_fp16
    fbgemm_pack_quantized_matrix feature_alpha_dropout feature_alpha_dropout_ feature_dropout feature_dropout_ fill
    fill_ fix fix_ flatten flip fliplr flipud float_power floor floor_ floor_divide fmax fmin fmod frac frac_ frexp
    frobenius_norm from_numpy frombuffer full full_like fused_moving_avg_obs_fake_quant gather gcd gcd_ ge geqrf ger
    get_device gradient greater greater_equal grid_sampler grid_sampler_2d grid_sampler_3d group_norm gru gru_cell
    gt hamming_window hann_window hardshrink hash_tensor heaviside hinge_embedding_loss histc histogram histogramdd
    hsmm hsplit hspmm hstack hypot i0 i0_ igamma igammac imag index_add index_copy index_fill index_put index_put_
    index_reduce index_select indices_copy inner instance_norm int_repr inverse is_complex is_conj is_distributed
    is_floating_point is_inference is_neg is_nonzero is_same_size is_signed is_vulkan_available isclose isfinite
    isin isinf isnan isneginf isposinf isreal istft kaiser_window kl_div kron kthvalue layer_norm lcm lcm_ ldexp
    ldexp_ le lerp less less_equal lgamma linspace log log10 log10_ log1p log1p_ log2 log2_ log_ log_softmax
    logaddexp logaddexp2 logcumsumexp logdet logical_and logical_not logical_or logical_xor logit logit_ logspace
    logsumexp lstm lstm_cell lt lu_solve lu_unpack margin_ranking_loss masked_fill masked_scatter masked_select
    matmul matrix_exp matrix_power max max_pool1d max_pool1d_with_indices max_pool2d max_pool3d maximum mean median
    meshgrid min minimum miopen_batch_norm miopen_convolution miopen_convolution_add_relu miopen_convolution_relu
    miopen_convolution_transpose miopen_ctc_loss miopen_depthwise_convolution miopen_rnn mkldnn_adaptive_avg_pool2d
    mkldnn_convolution mkldnn_linear_backward_weights mkldnn_max_pool2d mkldnn_max_pool3d mkldnn_rnn_layer mm mode
    moveaxis movedim msort mul multinomial multiply mv mvlgamma nan_to_num nan_to_num_ nanmean nanmedian nanquantile
    nansum narrow narrow_copy native_batch_norm native_channel_shuffle native_dropout native_group_norm
    native_layer_norm native_norm ne neg neg_ negative negative_ nextafter nonzero nonzero_static norm
    norm_except_dim normal not_equal nuclear_norm numel ones ones_like orgqr ormqr outer pairwise_distance pdist
    permute permute_copy pinverse pixel_shuffle pixel_unshuffle poisson poisson_nll_loss polar polygamma positive
    pow prelu prod promote_types put q_per_channel_axis q_per_channel_scales q_per_channel_zero_points q_scale
    q_zero_point qr quantile quantize_per_channel quantize_per_tensor quantize_per_tensor_dynamic
    quantized_batch_norm quantized_gru_cell quantized_lstm_cell quantized_max_pool1d quantized_max_pool2d
    quantized_max_pool3d quantized_rnn_relu_cell quantized_rnn_tanh_cell rad2deg rad2deg_ rand rand_like randint
    randint_like randn randn_like randperm range ravel real reciprocal reciprocal_ relu relu_ remainder renorm
    repeat_interleave reshape resize_as_ resize_as_sparse_ resolve_conj resolve_neg result_type rms_norm rnn_relu
    rnn_relu_cell rnn_tanh rnn_tanh_cell roll rot90 round round_ row_indices_copy row_stack rrelu rrelu_ rsqrt
    rsqrt_ rsub saddmm scalar_tensor scatter scatter_add scatter_reduce searchsorted segment_reduce select
    select_copy select_scatter selu selu_ sgn sigmoid sigmoid_ sign signbit sin sin_ sinc sinc_ sinh sinh_
    slice_copy slice_inverse slice_scatter slogdet smm softmax sort sparse_bsc_tensor sparse_bsr_tensor
    sparse_compressed_tensor sparse_coo_tensor sparse_csc_tensor sparse_csr_tensor split split_copy split_with_sizes
    split_with_sizes_copy spmm sqrt sqrt_ square square_ squeeze squeeze_copy sspaddmm stack std std_mean stft sub
    subtract sum svd swapaxes swapdims sym_constrain_range sym_constrain_range_for_size t t_copy take take_along_dim
    tan tan_ tanh tanh_ tensor tensor_split tensordot threshold threshold_ tile topk trace transpose transpose_copy
    trapezoid trapz triangular_solve tril tril_indices triplet_margin_loss triu triu_indices true_divide trunc
    trunc_ unbind unbind_copy unflatten unfold_copy unique_consecutive unique_dim unsafe_chunk unsafe_split
    unsafe_split_with_sizes unsqueeze unsqueeze_copy values_copy vander var var_mean vdot view_as_complex
    view_as_complex_copy view_as_real view_as_real_copy view_copy vsplit vstack where xlogy xlogy_ zero_ zeros
    zeros_like
""".split())

NN_FUNCTIONAL = frozenset("""
    adaptive_avg_pool1d adaptive_avg_pool2d adaptive_avg_pool3d adaptive_max_pool1d adaptive_max_pool1d_with_indices
    adaptive_max_pool2d adaptive_max_pool2d_with_indices adaptive_max_pool3d adaptive_max_pool3d_with_indices
    affine_grid alpha_dropout avg_pool1d avg_pool2d avg_pool3d batch_norm bilinear binary_cross_entropy
    binary_cross_entropy_with_logits celu celu_ channel_shuffle conv1d conv2d conv3d conv_tbc conv_transpose1d
    conv_transpose2d conv_transpose3d cosine_embedding_loss cosine_similarity cross_entropy ctc_loss dropout
    dropout1d dropout2d dropout3d elu elu_ embedding embedding_bag feature_alpha_dropout fold fractional_max_pool2d
    fractional_max_pool2d_with_indices fractional_max_pool3d fractional_max_pool3d_with_indices gaussian_nll_loss
    gelu glu grid_sample group_norm grouped_mm gumbel_softmax hardshrink hardsigmoid hardswish hardtanh hardtanh_
    hinge_embedding_loss huber_loss instance_norm interpolate kl_div l1_loss layer_norm leaky_relu leaky_relu_
    linear linear_cross_entropy local_response_norm log_softmax logsigmoid lp_pool1d lp_pool2d lp_pool3d
    margin_ranking_loss max_pool1d max_pool1d_with_indices max_pool2d max_pool2d_with_indices max_pool3d
    max_pool3d_with_indices max_unpool1d max_unpool2d max_unpool3d mish mse_loss multi_head_attention_forward
    multi_margin_loss multilabel_margin_loss multilabel_soft_margin_loss native_channel_shuffle nll_loss normalize
    one_hot pad pairwise_distance pdist pixel_shuffle pixel_unshuffle poisson_nll_loss prelu relu relu6 relu_
    rms_norm rrelu rrelu_ scaled_dot_product_attention scaled_grouped_mm scaled_mm selu selu_ sigmoid silu
    smooth_l1_loss soft_margin_loss softmax softmin softplus softshrink softsign tanh tanhshrink threshold
    threshold_ triplet_margin_loss triplet_margin_with_distance_loss unfold upsample upsample_bilinear
    upsample_nearest
""".split())

TENSOR_ATTRS = frozenset("""
    H T abs abs_ absolute absolute_ acos acos_ acosh acosh_ add add_ addbmm addbmm_ addcdiv addcdiv_ addcmul
    addcmul_ addmm addmm_ addmv addmv_ addr addr_ adjoint all allclose amax amin aminmax angle any arccos arccos_
    arccosh arccosh_ arcsin arcsin_ arcsinh arcsinh_ arctan arctan2 arctan2_ arctan_ arctanh arctanh_ argmax argmin
    argsort argwhere as_strided as_strided_ as_strided_scatter asin asin_ asinh asinh_ atan atan2 atan2_ atan_ atanh
    atanh_ baddbmm baddbmm_ bernoulli bernoulli_ bfloat16 bincount bitwise_and bitwise_and_ bitwise_left_shift
    bitwise_left_shift_ bitwise_not bitwise_not_ bitwise_or bitwise_or_ bitwise_right_shift bitwise_right_shift_
    bitwise_xor bitwise_xor_ bmm bool broadcast_to byte cauchy_ ccol_indices cdouble ceil ceil_ cfloat chalf char
    cholesky cholesky_inverse cholesky_solve chunk clamp clamp_ clamp_max clamp_max_ clamp_min clamp_min_ clip clip_
    clone coalesce col_indices conj conj_physical conj_physical_ const_data_ptr contiguous copy_ copysign copysign_
    corrcoef cos cos_ cosh cosh_ count_nonzero cov cpu cross crow_indices cuda cummax cummin cumprod cumprod_ cumsum
    cumsum_ data_ptr deg2rad deg2rad_ dense_dim dequantize det detach detach_ device diag diag_embed diagflat
    diagonal diagonal_scatter diff digamma digamma_ dim dim_order dist div div_ divide divide_ dot double dsplit
    dtype eig element_size eq eq_ equal erf erf_ erfc erfc_ erfinv erfinv_ exp exp2 exp2_ exp_ expand expand_as
    expm1 expm1_ exponential_ fill_ fill_diagonal_ fix fix_ flatten flip fliplr flipud float float_power
    float_power_ floor floor_ floor_divide floor_divide_ fmax fmin fmod fmod_ frac frac_ frexp gather gcd gcd_ ge
    ge_ geometric_ geqrf ger get_device grad greater greater_ greater_equal greater_equal_ gt gt_ half hardshrink
    hash_tensor heaviside heaviside_ histc histogram hsplit hypot hypot_ i0 i0_ igamma igamma_ igammac igammac_ imag
    index index_add index_add_ index_copy index_copy_ index_fill index_fill_ index_put index_put_ index_reduce
    index_reduce_ index_select indices inner int int_repr inverse ipu is_coalesced is_complex is_conj is_contiguous
    is_cpu is_cuda is_distributed is_floating_point is_inference is_ipu is_leaf is_maia is_meta is_mkldnn is_mps
    is_mtia is_neg is_nested is_nonzero is_pinned is_quantized is_same_size is_shared is_signed is_sparse
    is_sparse_csr is_vulkan is_xla is_xpu isclose isfinite isinf isnan isneginf isposinf isreal istft item itemsize
    kron kthvalue layout lcm lcm_ ldexp ldexp_ le le_ lerp lerp_ less less_ less_equal less_equal_ lgamma lgamma_
    log log10 log10_ log1p log1p_ log2 log2_ log_ log_normal_ log_softmax logaddexp logaddexp2 logcumsumexp logdet
    logical_and logical_and_ logical_not logical_not_ logical_or logical_or_ logical_xor logical_xor_ logit logit_
    logsumexp long lstsq lt lt_ lu lu_solve mH mT masked_fill masked_fill_ masked_scatter masked_scatter_
    masked_select matmul matrix_exp matrix_power max maximum mean median min minimum mm mode moveaxis movedim msort
    mtia mul mul_ multinomial multiply multiply_ mv mvlgamma mvlgamma_ name nan_to_num nan_to_num_ nanmean nanmedian
    nanquantile nansum narrow narrow_copy nbytes ndim ndimension ne ne_ neg neg_ negative negative_ nelement
    new_empty new_empty_strided new_full new_ones new_tensor new_zeros nextafter nextafter_ nonzero nonzero_static
    norm normal_ not_equal not_equal_ numel orgqr ormqr outer permute pin_memory pinverse polygamma polygamma_
    positive pow pow_ prelu prod put put_ q_per_channel_axis q_per_channel_scales q_per_channel_zero_points q_scale
    q_zero_point qr qscheme quantile rad2deg rad2deg_ random_ ravel real reciprocal reciprocal_ relu relu_ remainder
    remainder_ renorm renorm_ repeat repeat_interleave requires_grad reshape reshape_as resize resize_ resize_as
    resize_as_ resize_as_sparse_ resolve_conj resolve_neg roll rot90 round round_ row_indices rsqrt rsqrt_ scatter
    scatter_ scatter_add scatter_add_ scatter_reduce scatter_reduce_ select select_scatter sgn sgn_ shape short
    sigmoid sigmoid_ sign sign_ signbit sin sin_ sinc sinc_ sinh sinh_ size slice_inverse slice_scatter slogdet smm
    softmax solve sort sparse_dim sparse_mask sparse_resize_ sparse_resize_and_clear_ split split_with_sizes sqrt
    sqrt_ square square_ squeeze squeeze_ sspaddmm std stft storage_offset stride sub sub_ subtract subtract_ sum
    sum_to_size svd swapaxes swapaxes_ swapdims swapdims_ symeig t t_ take take_along_dim tan tan_ tanh tanh_
    tensor_split tile to to_dense to_mkldnn to_padded_tensor to_sparse to_sparse_bsc to_sparse_bsr to_sparse_coo
    to_sparse_csc to_sparse_csr tolist topk trace transpose transpose_ triangular_solve tril tril_ triu triu_
    true_divide true_divide_ trunc trunc_ type type_as unbind unflatten unfold uniform_ unique unique_consecutive
    unsafe_chunk unsafe_split unsafe_split_with_sizes unsqueeze unsqueeze_ values var vdot view view_as vsplit where
    xlogy xlogy_ xpu zero_
""".split())
