"""The baseline profile on CPU (real wrapper, real worker): bytes and FLOPs per kernel from its real
arguments, the wrapper line of each launch, measured ceilings and a roofline class per kernel and per
graph. The CUDA crediting of library kernels and the device gaps are checked on real torch profiler
events built here (the GPU path itself runs in tests/gpu)."""

from __future__ import annotations

import json
import shutil

import torch
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

from tests import gate_helpers as h
from tilesmith.profile import roofline
from tilesmith.gate.correctness import compare_set
from tilesmith.errors import TilesmithError
from tilesmith.profile.baseline import Profile, profile_graph, profile_graphs
from tilesmith.profile.worker import _credit_library_kernels, _gap_ns
from tilesmith.search.agent.tools import profile_table


def test_cpu_profile_has_bytes_flops_wrapper_lines_ceilings_and_classes(inference_ws):
    gdir = h.graph_of(inference_ws)
    p = profile_graph(gdir, calls=5)
    text = (gdir / "wrapper.py").read_text().splitlines()
    mm = next(k for k in p.kernels if k.name == "extern_kernels.addmm")
    # examples/inference.py: [64,128] @ [128,512] then [64,512] @ [512,128], fp32
    assert mm.calls == 2 and mm.flops == 2 * (2 * 64 * 128 * 512) and mm.dtype == "fp32"
    # bias + input + weight + the out= buffer, fp32: (512 + 64*128 + 512*128 + 64*512) + (128 + 64*512 + 128*512 + 64*128)
    assert mm.bytes == 4 * (512 + 64 * 128 + 512 * 128 + 64 * 512 + 128 + 64 * 512 + 128 * 512 + 64 * 128)
    assert len(mm.sites) == 2 and all("extern_kernels.addmm(" in text[int(n) - 1] for n in mm.sites)
    for k in p.kernels:
        assert k.bytes > 0 and k.sites and k.klass in ("latency", "memory", "compute")
        assert k.gbps == k.bytes / (k.time_ms / 1e3) / 1e9
    assert p.ceilings["bandwidth_gbps"] > 0 and p.ceilings["tflops"]["fp32"] > 0
    assert p.ceilings["source"].startswith("measured")
    assert p.klass in ("launch", "latency", "memory", "compute") and p.gap_ms is None
    assert "no hardware counters" in p.counters
    assert list(p.phases_s) == ["load", "warm_up", "wall", "record_arguments", "kernel_times", "ceilings",
                                "before_spawn", "process_start", "process_imports", "process_exit"]
    assert all(v >= 0 for v in p.phases_s.values())
    again = Profile.from_dict(json.loads(json.dumps(p.to_dict())))
    assert again.kernels[0].sites == p.kernels[0].sites and again.phases_s == p.phases_s
    old = p.to_dict()
    del old["phases_s"]  # a baseline.json written before the phases were recorded still reads
    assert Profile.from_dict(old).phases_s == {}
    assert "wrapper line" in profile_table(p) and "GB/s" in profile_table(p)


def test_graphs_profiled_together_in_one_worker_each_get_their_own_answer(inference_ws, slow_matmul_graph, tmp_path):
    good = h.graph_of(inference_ws)
    bad = tmp_path / "broken"  # the same graph, but its call raises
    shutil.copytree(good, bad)
    with open(bad / "wrapper.py", "a") as f:
        f.write("\n\ndef call(args):\n    raise RuntimeError('boom from the test')\n")
    first, broken, last = profile_graphs([good, bad, slow_matmul_graph], calls=3)
    assert isinstance(broken, TilesmithError) and broken.code == "profile-failed"
    assert "broken" in broken.message and "RuntimeError: boom from the test" in broken.message
    assert isinstance(first, Profile) and any(k.name == "extern_kernels.addmm" for k in first.kernels)
    assert isinstance(last, Profile) and last.wall_ms > 0 and last.kernels  # the graph after the failure ran
    # One process: the device's ceilings were measured once for both (two measurements never agree exactly).
    assert first.ceilings == last.ceilings and first.ceilings["source"].startswith("measured")
    assert profile_graphs([]) == []


def test_roofline_classes_a_kernel_by_intensity_and_duration():
    ceil = roofline.Ceilings("cuda", "H200", 4800.0, {"bf16": 989.5, "fp32": 67.0}, "datasheet").to_dict()
    mem = roofline.classify(0.1, 240_000_000, 0, "bf16", ceil, "cuda:0")  # 2.4 TB/s: half the bandwidth
    assert mem.klass == "memory" and abs(mem.bw_frac - 0.5) < 1e-9 and abs(mem.headroom_ms - 0.05) < 1e-9
    gemm = roofline.classify(1.0, 100_000_000, 500_000_000_000, "bf16", ceil, "cuda:0")
    assert gemm.klass == "compute" and abs(gemm.tflops - 500.0) < 1e-6
    tiny = roofline.classify(0.003, 4096, 0, "fp32", ceil, "cuda:0")
    assert tiny.klass == "latency"
    assert roofline.classify(0.1, 0, 0, "fp32", ceil, "cuda:0").klass == "unknown"


def _ev(i, name, start, end, device=DeviceType.CPU):
    return FunctionEvent(id=i, name=name, thread=0, start_us=start, end_us=end, device_type=device)


def test_library_kernels_are_credited_to_the_extern_call_that_launched_them_and_gaps_are_per_call():
    site = _ev(1, "tilesmith::extern_kernels.mm@120", 0, 10)
    op = _ev(2, "aten::mm", 1, 9)
    site.append_cpu_child(op)
    op.append_kernel("sm90_xmma_gemm_bf16", 0, 6.0)
    gemm = _ev(3, "sm90_xmma_gemm_bf16", 20, 26, DeviceType.CUDA)
    tri = _ev(4, "triton_poi_fused_add_0", 30, 32, DeviceType.CUDA)
    out = {"sm90_xmma_gemm_bf16": {"kind": "device", "calls": 1, "total_ns": 6000.0},
           "triton_poi_fused_add_0": {"kind": "triton", "calls": 1, "total_ns": 2000.0}}
    _credit_library_kernels([site, op, gemm, tri], out, calls=1)
    assert out["extern_kernels.mm"] == {"kind": "extern", "calls": 1, "total_ns": 6000.0,
                                        "library_kernels": ["sm90_xmma_gemm_bf16"]}
    assert "sm90_xmma_gemm_bf16" not in out and out["triton_poi_fused_add_0"]["total_ns"] == 2000.0
    assert _gap_ns([site, op, gemm, tri], calls=2) == 4 * 1000.0 / 2  # 26 -> 30 us, over two calls


def test_a_value_rejection_names_the_set_the_output_the_test_and_the_allowed_error():
    torch.manual_seed(0)
    ref = torch.randn(4096, dtype=torch.float64)
    orig = ref.bfloat16()
    up, dn = torch.nextafter(orig, torch.full_like(orig, 1e9)), torch.nextafter(orig, torch.full_like(orig, -1e9))
    cand = torch.where(torch.rand(4096) < 0.7, torch.where(orig.double() >= ref, up, dn), orig)  # 1 ulp further
    lay = {"type": "tensor", "dtype": "bf16", "shape": [4096], "stride": [1], "offset": 0}
    res = compare_set("random-normal", {"outputs": [cand], "layouts": [lay], "inputs_after": []},
                      {"outputs": [orig], "layouts": [lay], "inputs_after": []}, [ref])
    (r,) = res.reasons
    assert r.code == "precision" and r.message.startswith("set random-normal: output 0 (bfloat16) has RMS error")
    assert "allowed" in r.message and "worst element" in r.message
