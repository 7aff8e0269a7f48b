"""What a candidate wrapper may import and reach, as data (stdlib only; read by gate/allowlist_base.py, allowlist.py
and allowlist_kernel.py).

Every entry is here because an honest wrapper needs it: Inductor's own header, call() and trailer (the CPU suite's
captures and the H100 corpus, tests/fixtures/gpu_wrappers), tilesmith's vetted helpers, and plain tensor code a
rewrite uses (torch's ATen functions, torch.nn.functional, math). A dotted path is what a name resolves to: `aten.mm`
is `torch.ops.aten.mm`, however it was imported or aliased. Nothing under a module is reachable unless listed:
`torch.os`, `torch._C._get_tracing_state`, `torch._dynamo.utils.sys`, `torch.library` and `torch.utils` are not.
"""

from __future__ import annotations

from tilesmith.gate.allowlist_torch import ATEN_FUNCTIONS, NN_FUNCTIONAL, TENSOR_ATTRS

# -- modules ----------------------------------------------------------------------------------------------------
# `import X` / `import X as Y`: X must be one of these (importing runs X's own code, so only modules whose import
# does nothing but define names; all are loaded by torch already).
IMPORTABLE = frozenset({"torch", "math", "cmath", "triton", "triton.language", "torch.nn.functional", "typing"})
# Modules `from M import N` may name (N itself must then be a listed path below).
FROM_MODULES = frozenset({
    "torch", "math", "cmath", "ctypes", "typing", "torch._C", "torch.nn.attention",
    "torch._inductor.hooks", "torch._inductor.utils", "torch._inductor.codegen.memory_planning",
    "torch._inductor.async_compile", "torch._inductor.select_algorithm", "torch._inductor.runtime.triton_heuristics",
    "torch._dynamo.testing", "torch._inductor.wrapper_benchmark", "tilesmith.cudagraph", "tilesmith.streams",
})
# Inductor's header imports these and never uses them (os, tempfile, random; ctypes' types, from the time wrappers
# called C++ kernels through ctypes; the distributed allocator; bandwidth profiling's file writer). They may be bound
# by that import and never read anywhere: an unread binding does nothing, and importing them loads nothing torch has
# not loaded already.
INERT = frozenset({"os", "random", "tempfile", "ctypes.c_void_p", "ctypes.c_long", "ctypes.c_int",
                   "torch._C._distributed_c10d._SymmetricMemory.empty_strided_p2p",
                   "torch._inductor.runtime.triton_heuristics.start_graph",
                   "torch._inductor.runtime.triton_heuristics.end_graph"})
# Inductor's trailer (benchmarking as a script): usable only inside `get_args`, `benchmark_compiled_module` and the
# `if __name__ == "__main__":` block, which nothing else may call (compiled_module_main parses the process's argv).
TRAILER = frozenset({"torch._dynamo.testing.rand_strided", "torch._inductor.utils.print_performance",
                     "torch._inductor.wrapper_benchmark.compiled_module_main"})
TRAILER_FUNCTIONS = frozenset({"get_args", "benchmark_compiled_module"})

# -- paths a wrapper may reach -------------------------------------------------------------------------------------
_GUARDS = "torch._C._dynamo.guards."
# Values and callables (anything reached on them afterwards is a value's attribute: TENSOR_ATTRS and the like).
LEAVES = frozenset({
    # Inductor's header: allocation, layout asserts, streams of the launch, hooks, the kernels' namespace
    "torch.device", "torch.empty_strided", _GUARDS + "assert_size_stride", _GUARDS + "assert_alignment",
    _GUARDS + "_empty_strided_cpu", _GUARDS + "_empty_strided_cpu_pinned", _GUARDS + "_empty_strided_cuda",
    _GUARDS + "_empty_strided_xpu", _GUARDS + "_empty_strided_mtia", _GUARDS + "_reinterpret_tensor",
    "torch._C._cuda_getCurrentRawStream", "torch._C._xpu_getCurrentRawStream",
    "torch._inductor.hooks.run_intermediate_hooks", "torch._inductor.utils.maybe_profile",
    "torch._inductor.codegen.memory_planning._align",
    "torch._inductor.runtime.triton_heuristics.grid", "torch._inductor.runtime.triton_heuristics.split_scan_grid",
    "torch._inductor.runtime.triton_heuristics.grid_combo_kernels",
    "torch._inductor.runtime.triton_heuristics.cooperative_reduction_grid",
    "torch.cuda.set_device", "torch.cuda._DeviceGuard", "torch.cuda.current_device", "torch.cuda.is_available",
    "torch.cuda.device", "triton.cdiv", "triton.next_power_of_2",
    # a Triton kernel of the wrapper's own (tilesmith/skills/cuda-extensions): its body is checked like the rest
    "triton.jit", "triton.autotune", "triton.Config", "triton.heuristics",
    # plain tensor code: types, grad modes, dtype info (ATen functions and dtypes: see classify)
    "torch.Tensor", "torch.Size", "torch.no_grad", "torch.enable_grad", "torch.inference_mode", "torch.finfo",
    "torch.iinfo", "torch.is_tensor", "torch.get_default_dtype", "torch.strided", "torch.contiguous_format",
    "torch.channels_last", "torch.preserve_format",
    # tilesmith's vetted helpers: trusted code that does what a candidate may not (streams, state across calls)
    "tilesmith.cudagraph.graphed", "tilesmith.streams.side_by_side",
    # what honest rewrites were seen to use (tests/corpus.py)
    "typing.NamedTuple", "typing.Optional", "typing.List", "typing.Tuple", "typing.Any",
    "torch.nn.attention.flex_attention.flex_attention", "torch.nn.attention.flex_attention.create_block_mask",
    "torch.nn.attention.flex_attention.BlockMask",
})
DTYPES = frozenset("""
    bfloat16 bool cdouble cfloat chalf complex128 complex32 complex64 double float float16 float32 float64
    float8_e4m3fn float8_e4m3fnuz float8_e5m2 float8_e5m2fnuz float8_e8m0fnu float4_e2m1fn_x2 half int int16 int32
    int64 int8 long short uint16 uint32 uint64 uint8 qint32 qint8 quint8 quint4x2 quint2x4 bits8 bits16
""".split())
# Operator namespaces under torch.ops: ATen, its primitives, Inductor's own ops, quantized kernels. Not
# higher_order: its operators are Python objects whose methods change dispatch (fallthrough, py_impl, dispatch).
# (`torch.ops.load_library` and `torch.ops.import_module` are torch.ops' own functions, not namespaces.)
OP_NAMESPACES = frozenset({"aten", "prims", "inductor", "_quantized", "quantized"})
# Ops with an effect beyond tensors: from_file reads a file into a tensor, _from_blob makes one over any address.
OPS_DENIED = frozenset({"from_file", "_from_blob", "_print"})
# Names an overload cannot have: OpOverloadPacket's and OpOverload's own attributes (py_impl registers a Python
# kernel for the op: a patch of the dispatcher; py_kernels and the rest reach its tables).
OVERLOAD_DENIED = frozenset({"op", "op_overloads", "overloads", "py_impl", "py_functionalize_impl", "py_kernels",
                             "redispatch", "decompose", "has_kernel_for_any_dispatch_key", "has_kernel_for_dispatch_key",
                             "name", "namespace", "overloadpacket", "tags"})
TYPING_AND_MATH = frozenset({"math", "cmath"})

# triton.language as the wrapper and kernels see it: triton 3.6's `__all__`, less the modules in it (extra,
# target_info; math is reached as tl.math.<function>).
TL_NAMES = frozenset("""
    PropagateNan TRITON_MAX_TENSOR_NUMEL abs add advance arange argmax argmin associative_scan assume atomic_add
    atomic_and atomic_cas atomic_max atomic_min atomic_or atomic_xchg atomic_xor bfloat16 bitonic_merge block_type
    broadcast broadcast_to cast cat cdiv ceil clamp condition const constexpr constexpr_type cos cumprod cumsum
    debug_barrier device_assert device_print div_rn dot dot_scaled dtype erf exp exp2 expand_dims fdiv flip float16
    float32 float64 float8e4b15 float8e4b8 float8e4nv float8e5 float8e5b16 floor fma full gather histogram
    inline_asm_elementwise int1 int16 int32 int64 int8 interleave join load load_tensor_descriptor log log2
    make_block_ptr make_tensor_descriptor map_elementwise max max_constancy max_contiguous maximum min minimum mul
    multiple_of num_programs pair_uniform_to_normal permute philox philox_impl pi32_t pointer_type program_id rand
    rand4x randint randint4x randn randn4x range ravel reduce reduce_or reshape rsqrt sigmoid sin slice softmax sort
    split sqrt sqrt_rn static_assert static_print static_range store store_tensor_descriptor sub sum swizzle2d tensor
    tensor_descriptor topk trans tuple uint16 uint32 uint64 uint8 uint_to_uniform_float umulhi view void where
    xor_sum zeros zeros_like
""".split())
TL_MATH = frozenset("abs ceil cos div_rn erf exp exp2 fdiv floor fma log log2 rsqrt sin sqrt sqrt_rn umulhi".split())

# -- attributes of values ------------------------------------------------------------------------------------------
# On anything that is not a module path (a tensor, a size, a dtype, a device, a list, a dict): tensor methods and
# properties (TENSOR_ATTRS says what is left out and why), the containers' methods a wrapper uses, dtype and device
# information.
VALUE_ATTRS = TENSOR_ATTRS | frozenset({
    "append", "extend", "clear", "pop", "insert", "count", "copy", "reverse", "sort", "get", "items", "keys",
    "values", "update", "setdefault", "add", "discard", "remove", "numel", "index", "type", "eps", "tiny", "max", "min",
    "bits", "resolution", "smallest_normal", "itemsize", "is_signed", "to_real", "to_complex", "mask_mod",
    "run",  # an Inductor kernel's launch, also where a kernel object was passed along
})
# Builtins a wrapper may name. Left out: code from strings (exec, eval, compile, __import__), namespaces and frames
# (globals, locals, vars, dir), attribute writes (setattr, delattr), files and the console (open, input, print,
# breakpoint, help), the process (exit, quit, SystemExit), object identities and classes made on the fly (id, hash,
# type), and the rest nothing needs.
BUILTINS = frozenset({
    "abs", "all", "any", "bool", "bytes", "callable", "chr", "dict", "divmod", "enumerate", "filter", "float",
    "frozenset", "int", "isinstance", "issubclass", "iter", "len", "list", "map", "max", "min", "next",
    "object", "ord", "pow", "property", "range", "repr", "reversed", "round", "set", "slice", "sorted",
    "staticmethod", "classmethod", "str", "sum", "super", "tuple", "zip", "True", "False", "None", "Ellipsis",
    "NotImplemented", "Exception", "ArithmeticError", "AssertionError", "AttributeError", "ImportError",
    "IndexError", "KeyError", "LookupError", "NotImplementedError", "OverflowError", "RuntimeError",
    "StopIteration", "TypeError", "ValueError", "ZeroDivisionError",
    # getattr and hasattr with a literal name (the name is then checked as an attribute)
    "getattr", "hasattr",
})
# Dunder methods a class of the wrapper's own may define (Runner has __init__); the rest change how Python itself
# treats its objects (iteration, attribute lookup, torch's dispatch hooks, finalizers).
OWN_DUNDERS = frozenset({"__init__", "__call__", "__len__", "__repr__"})

# -- Triton kernel sources -----------------------------------------------------------------------------------------
# (module, name, alias): the imports of Inductor's Triton kernel modules; `import triton` and `triton.language as tl`.
KERNEL_FROM = frozenset({
    ("torch._inductor.runtime", "triton_helpers"), ("torch._inductor.runtime", "triton_heuristics"),
    ("torch._inductor.runtime.triton_helpers", "libdevice"), ("torch._inductor.runtime.triton_helpers", "math"),
    ("torch._inductor.runtime.hints", "AutotuneHint"), ("torch._inductor.runtime.hints", "ReductionHint"),
    ("torch._inductor.runtime.hints", "TileHint"), ("torch._inductor.runtime.hints", "DeviceProperties"),
    ("torch._inductor.runtime.triton_compat", "libdevice"), ("torch._inductor.runtime.triton_helpers", "math"),
})
KERNEL_IMPORT = frozenset({"triton", "triton.language", "math"})
# Programmatic dependent launch, as Inductor writes it when a re-lowering turns it on (triton.enable_pdl): the PTX
# griddepcontrol instructions, which order this kernel after the one before it on the stream, and nothing else of
# triton.language.extra (which holds the CUDA and HIP libdevice and the raw intrinsics).
PDL_CALLS = frozenset({"triton.language.extra.cuda.gdc_wait", "triton.language.extra.cuda.gdc_launch_dependents"})
PDL = PDL_CALLS | {"triton.language.extra", "triton.language.extra.cuda"}
# Decorators Inductor writes (and the tuner's fixed_config); their arguments are data (see allowlist._decorator).
HEURISTICS = frozenset({"pointwise", "reduction", "persistent_reduction", "split_scan", "template", "foreach",
                        "cooperative_reduction", "fixed_config", "user_autotune"})
# inductor_meta keys Inductor writes. The autotuner pastes some of their strings into launcher code it exec()s:
# fixed_grid and extra_launcher_args (templates: `_grid_0`...) must then be lists of names, precomputed_grids (user
# Triton kernels) arithmetic on names (allowlist_kernel._grids); config_args is left out, as are keys that name files
# or remote caches (profile_bandwidth_output); autotune_remote_cache, store_cubin and force_disable_caches must keep
# Inductor's defaults (None, False, False).
INDUCTOR_META = frozenset("""
    are_deterministic_algorithms_enabled assert_indirect_indexing atomic_add_found autotune_hints autotune_local_cache
    autotune_pointwise autotune_remote_cache backend_hash deterministic dynamic_scale_rblock force_disable_caches
    force_filter_reduction_configs grid_type kernel_name max_autotune max_autotune_pointwise min_split_scan_rblock
    mix_order_reduction_allow_multi_stages mutated_arg_names no_x_dim num_load num_reduction num_store optimize_mem
    spill_threshold store_cubin tiling_scores kernel_num_gb kernel_flop is_hip is_fbcode coordinate_descent_tuning
    coordinate_descent_search_radius persistent_reduction RSPLIT_SIZE min_rblock min_xblock max_persistent_rblock
    native_matmul_persistent_rblock batch_invariant add_persistent_rblock dynamic_disable_pipelining
    incremental_autotune warp_size max_threads_per_block combo_grid_meta combo_tuning_groups
    combo_warp_stage_candidates combo_coordesc_field_limits combo_coordesc_field_order tma_min_block_sizes
    profile_bandwidth profile_bandwidth_regex profile_bandwidth_with_do_bench_using_profiling benchmark_kernel
    fixed_grid extra_launcher_args precomputed_grids declared_constexpr_names
""".split())
META_NAMES = frozenset({"fixed_grid", "extra_launcher_args", "declared_constexpr_names", "mutated_arg_names"})
META_FIXED = {"autotune_remote_cache": (None, False), "store_cubin": (False,), "force_disable_caches": (False,),
              "profile_bandwidth": (False, None), "benchmark_kernel": (False, None)}
TRITON_META = frozenset({"signature", "device", "constants", "configs", "disable_ftz", "enable_fp_fusion",
                         "launch_pdl", "native_matmul", "device_type", "mutated_arg_names", "debug"})
# A value of a jit function (a block of values, a pointer, a dtype) may have these attributes: triton 3.6's tensor
# and dtype methods, less those that reach its compiler's IR (to_ir, handle, mangle, codegen_name).
TL_VALUE_ATTRS = frozenset("""
    T abs advance argmax argmin associative_scan atomic_add atomic_and atomic_cas atomic_max atomic_min atomic_or
    atomic_xchg atomic_xor broadcast_to cast cdiv cos cumprod cumsum exp expand_dims flip gather histogram log
    logical_and logical_or max min permute ravel reduce reduce_or reshape rsqrt sigmoid sin softmax sort split sqrt
    store sum to trans view xor_sum dtype shape numel type element_ty primitive_bitwidth value scalar is_block
    is_bool is_floating is_fp16 is_fp32 is_fp64 is_bf16 is_int is_int_signed is_int_unsigned is_ptr
    is_standard_floating with_element_ty get_int_max_value get_int_min_value
""".split())
# Builtins a jit body may name (Triton's own builtin namespace, less getattr and hasattr, and set() for meta data).
KERNEL_BUILTINS = frozenset({"range", "min", "max", "len", "float", "int", "bool", "set", "tuple", "list", "dict",
                             "True", "False", "None", "isinstance"})


def classify(path: str, kernel: bool = False) -> str | None:
    """'leaf' (a value or callable), 'both' (callable, with named children: an op), 'namespace' (only a prefix of
    others), or None: not allowed. kernel: the rules of a Triton kernel module instead of a wrapper's."""
    if kernel:
        return _classify_kernel(path)
    if path in LEAVES or path in INERT or path in TRAILER:
        return "leaf"
    parts = path.split(".")
    head, last = ".".join(parts[:-1]), parts[-1]
    if path.startswith("torch.ops."):
        return _classify_op(parts[2:])
    if head == "torch" and (last in ATEN_FUNCTIONS or last in DTYPES):
        return "leaf"
    if head == "torch.nn.functional" and last in NN_FUNCTIONAL:
        return "leaf"
    if head in TYPING_AND_MATH and not last.startswith("_"):
        return "leaf"
    if head == "torch._inductor.select_algorithm.extern_kernels" and not last.startswith("__"):
        return "leaf"
    if head == "triton.language" and last in TL_NAMES or head == "triton.language.math" and last in TL_MATH:
        return "leaf"
    if path == "torch._inductor.async_compile.AsyncCompile":
        return "leaf"
    return "namespace" if _is_prefix(path) else None


def _classify_op(rest: list[str]) -> str | None:
    if not rest or rest[0] not in OP_NAMESPACES:
        return "namespace" if not rest else None
    if len(rest) == 1:
        return "namespace"
    op = rest[1]
    if op.startswith("__") or op in OPS_DENIED:
        return None
    if len(rest) == 2:
        return "both"  # the packet: callable, and its overloads are named under it
    ov = rest[2]
    if len(rest) == 3 and not ov.startswith("_") and ov not in OVERLOAD_DENIED:
        return "leaf"
    return None


_NAMESPACES = frozenset({"torch", "torch.ops", "torch.nn", "torch.nn.functional", "torch.nn.attention",
                         "torch.nn.attention.flex_attention", "triton", "triton.language", "triton.language.math",
                         "torch._inductor.select_algorithm.extern_kernels", "math", "cmath", "typing", "torch.cuda"})


def _is_prefix(path: str) -> bool:
    if path in _NAMESPACES:
        return True
    dotted = path + "."
    return any(p.startswith(dotted) for p in LEAVES | INERT | TRAILER)


def _classify_kernel(path: str) -> str | None:
    parts = path.split(".")
    head, last = ".".join(parts[:-1]), parts[-1]
    if path in ("triton", "triton.language", "triton.language.math", "math", "torch._inductor.runtime.hints",
                "torch._inductor.runtime.triton_helpers", "torch._inductor.runtime.triton_helpers.libdevice",
                "torch._inductor.runtime.triton_compat.libdevice", "torch._inductor.runtime.triton_heuristics"):
        return "namespace"
    if path in ("triton.jit", "triton.cdiv", "triton.next_power_of_2", "torch._inductor.runtime.hints.DeviceProperties"):
        return "leaf"
    if path in PDL:  # programmatic dependent launch: a GPU-only call
        return "leaf" if path in PDL_CALLS else "namespace"
    if last.startswith("_"):
        return None
    if head == "triton.language":
        return "leaf" if last in TL_NAMES else None
    if head in ("triton.language.math", "torch._inductor.runtime.triton_helpers.math"):
        return "leaf" if last in TL_MATH else None
    if head in ("torch._inductor.runtime.triton_helpers", "torch._inductor.runtime.triton_helpers.libdevice",
                "torch._inductor.runtime.triton_compat.libdevice", "math"):
        return "leaf" if last not in ("math", "libdevice") else "namespace"
    if head == "torch._inductor.runtime.triton_heuristics":
        return "leaf" if last in HEURISTICS else None
    if head.startswith("torch._inductor.runtime.hints.") and head.count(".") == 4 and last.isupper():
        return "leaf"  # ReductionHint.INNER, TileHint.SQUARE, AutotuneHint.X
    if head == "torch._inductor.runtime.hints" and last in ("AutotuneHint", "ReductionHint", "TileHint"):
        return "namespace"
    return None
