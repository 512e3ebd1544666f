"""engine/observe/breakdown.py: hand-built traces in torch.profiler's export format reduce to known cells."""
import pytest

from engine.observe.breakdown import kernel_class, reduce_trace, scope_class


def X(name, ts, dur, cat="cpu_op", pid=1, tid=1, **args):
    return dict(ph="X", cat=cat, name=name, pid=pid, tid=tid, ts=ts, dur=dur, args=args)


def cpu_step(t0, dur=1000):
    """One decode step on CPU (microseconds): a layer with each kind of op, the head and sampling."""
    return [
        X("decodescope/step", t0, dur),
        X("decodescope/model", t0 + 10, 800),
        X("aten::embedding", t0 + 20, 20),
        X("decodescope/layer.0", t0 + 50, 500),
        X("aten::matmul", t0 + 60, 100), X("aten::mm", t0 + 65, 90),
        X("decodescope/op:attention", t0 + 170, 200),
        X("aten::matmul", t0 + 180, 80), X("aten::bmm", t0 + 185, 70), X("aten::softmax", t0 + 270, 30),
        X("aten::index_put_", t0 + 380, 40), X("aten::_index_put_impl_", t0 + 385, 30),
        X("aten::view", t0 + 430, 5),
        X("decodescope/op:add_rmsnorm", t0 + 440, 60), X("aten::add_", t0 + 445, 10),
        X("aten::rms_norm", t0 + 460, 30),
        X("aten::linear", t0 + 600, 200), X("aten::matmul", t0 + 605, 190), X("aten::mm", t0 + 610, 180),
        X("decodescope/sample", t0 + 820, 80), X("aten::argmax", t0 + 830, 20),
        X("aten::_local_scalar_dense", t0 + 855, 5),
    ]


CPU_CELLS = {  # (layer, class) -> (ms, calls) of cpu_step
    ("engine", "host"): (0.120, 0), ("model", "host"): (0.080, 0), ("embed", "other"): (0.020, 1),
    ("0", "host"): (0.095, 0), ("0", "matmul"): (0.100, 1), ("0", "attention"): (0.200, 1),
    ("0", "kv_write"): (0.040, 1), ("0", "other"): (0.005, 1), ("0", "norm"): (0.060, 1),
    ("head", "matmul"): (0.200, 1), ("sample", "sampling"): (0.080, 1),
}


def cells(pb):
    return {k: (round(c.ms, 6), c.calls) for k, c in pb.cells.items()}


def test_cpu_step_cells_add_up_to_the_window():
    # two quiet steps and one that lost its core (5 ms, mostly a gap): the slow one is left out
    trace = dict(traceEvents=cpu_step(0) + cpu_step(2000) + cpu_step(4000, dur=5000))
    pb = reduce_trace(trace)["decode"]
    assert (pb.windows, pb.used, pb.on_device) == (3, 2, False)
    assert cells(pb) == {k: (pytest.approx(ms), calls) for k, (ms, calls) in CPU_CELLS.items()}
    assert sum(c.ms for c in pb.cells.values()) == pytest.approx(pb.step_ms) == pytest.approx(1.0)
    # python: our scopes' self time; dispatch: ops around ops and views; kernel: innermost ops that compute
    assert pb.split == pytest.approx(dict(python=0.460, dispatch=0.055, kernel=0.485))


def native_step(t0, dur=1000):
    """A step of the CPU kernels' block loop: each projection one call named after its weight format."""
    return [
        X("decodescope/step", t0, dur),
        X("decodescope/model", t0 + 10, 800),
        X("decodescope/layer.0", t0 + 50, 500),
        X("decodescope::linear_q4_k", t0 + 60, 100), X("decodescope::attention", t0 + 170, 50),
        X("decodescope::linear_q4_k", t0 + 230, 40), X("decodescope::linear_q6_k", t0 + 280, 150),
        X("decodescope::linear_q6_k", t0 + 600, 200),  # the head
    ]


def test_cpu_kernels_time_per_weight_format():
    trace = dict(traceEvents=native_step(0) + native_step(2000) + native_step(4000, dur=5000))
    pb = reduce_trace(trace)["decode"]
    got = {f: (round(c.ms, 6), c.calls) for f, c in pb.formats.items()}
    assert got == {"q4_k": (pytest.approx(0.140), 2), "q6_k": (pytest.approx(0.350), 2)}
    # the formats' time is the matmul cells' time, split another way
    assert sum(c.ms for c in pb.formats.values()) == pytest.approx(
        sum(c.ms for (_, cls), c in pb.cells.items() if cls == "matmul"))
    assert reduce_trace(dict(traceEvents=cpu_step(0)))["decode"].formats == {}  # the twins name no format


def test_events_outside_windows_other_threads_and_metadata_are_ignored():
    noise = [X("aten::mm", -500, 100), X("aten::mm", 100, 50, tid=2), dict(ph="M", name="process_name", pid=1),
             dict(ph="i", name="Iteration Start", ts=0, pid="Traces")]
    pb = reduce_trace(dict(traceEvents=noise + cpu_step(0)))["decode"]
    assert cells(pb) == {k: (pytest.approx(ms), calls) for k, (ms, calls) in CPU_CELLS.items()}


def test_verify_pass_is_its_own_kind():
    verify = [dict(e, name="decodescope/verify") if e["name"] == "decodescope/step" else e for e in cpu_step(5000)]
    out = reduce_trace(dict(traceEvents=cpu_step(0) + verify))
    assert set(out) == {"decode", "verify"} and out["verify"].windows == 1


def test_a_trace_without_pass_scopes_is_refused():
    with pytest.raises(ValueError, match="no pass scopes"):
        reduce_trace(dict(traceEvents=[X("aten::mm", 0, 10)]))


def launch(ts, corr, name="cudaLaunchKernel", dur=20):
    return X(name, ts, dur, cat="cuda_runtime", correlation=corr)


def kernel(name, ts, dur, corr, cat="kernel"):
    return X(name, ts, dur, cat=cat, pid=0, tid=7, correlation=corr)


def test_cuda_eager_step_is_device_time_by_launching_scope_and_idle_gaps():
    host = [
        X("decodescope/step", 0, 1000), X("decodescope/model", 10, 500), X("decodescope/layer.0", 20, 480),
        X("aten::mm", 30, 50), launch(40, 1),
        X("decodescope/op:attention", 100, 100), launch(110, 2),
        X("aten::index_put_", 210, 50), launch(220, 3),
        X("decodescope/sample", 520, 470), X("aten::argmax", 530, 30), launch(535, 4),
        launch(570, 5, "cudaMemcpyAsync"), launch(600, 6, "cudaStreamSynchronize", dur=380),
    ]
    device = [kernel("sm90_xmma_gemm_f32f32_tn", 100, 300, 1), kernel("flash_fwd_kernel", 400, 200, 2),
              kernel("index_put_kernel_impl", 650, 50, 3), kernel("reduce_kernel<ArgMaxOps>", 700, 20, 4),
              kernel("Memcpy DtoH (Device -> Pageable)", 720, 10, 5, cat="gpu_memcpy"),
              kernel("unrelated", 100, 900, 99)]
    pb = reduce_trace(dict(traceEvents=host + device))["decode"]
    assert pb.on_device
    assert cells(pb) == {("0", "matmul"): (0.3, 1), ("0", "attention"): (0.2, 1), ("0", "kv_write"): (0.05, 1),
                         ("sample", "sampling"): (0.03, 2), ("idle", "host"): (0.42, 0)}
    # the host issued its last kernel 0.555 ms in (the copy and the sync after it wait, they issue nothing);
    # the device was busy 0.58 ms of the 1 ms step
    assert pb.split == pytest.approx(dict(host_ms=0.555, device_ms=0.58, idle_ms=0.42))


def test_cuda_graph_replay_kernels_are_classed_by_name_under_one_layer():
    host = [X("decodescope/step", 0, 500), launch(10, 7, "cudaGraphLaunch"),
            launch(40, 8, "cudaStreamSynchronize", dur=450)]
    device = [kernel("void gemv_kernel<float>", 50, 100, 7), kernel("rmsnorm_kernel", 150, 10, 7),
              kernel("decode_attention_kernel<64>", 160, 40, 7),
              kernel("index_elementwise_kernel<index_put_kernel_impl>", 200, 5, 7),
              kernel("vectorized_elementwise_kernel<MulFunctor>", 205, 5, 7)]
    pb = reduce_trace(dict(traceEvents=host + device))["decode"]
    assert cells(pb) == {("graph", "matmul"): (0.1, 1), ("graph", "norm"): (0.01, 1),
                         ("graph", "attention"): (0.04, 1), ("graph", "kv_write"): (0.005, 1),
                         ("graph", "other"): (0.005, 1), ("idle", "host"): (0.34, 0)}


@pytest.mark.parametrize("name,cls", [
    ("decodescope::linear_q4", "matmul"), ("decodescope::linear_f32", "matmul"), ("decodescope::rope", "rope"),
    ("decodescope::add_rmsnorm", "norm"), ("decodescope/op:silu_mul", "activation"),
    ("decodescope/op:attention", "attention"), ("decodescope/sample", "sampling"), ("aten::addmm", "matmul"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"), ("aten::index_put_", "kv_write"),
    ("aten::mul", None), ("decodescope/layer.3", None),
])
def test_scope_classes(name, cls):
    assert scope_class(name) == cls


@pytest.mark.parametrize("name,cls", [
    ("fmha_cutlassF_f16_aligned_64x64_rf_sm80", "attention"), ("ampere_sgemm_128x64_tn", "matmul"),
    ("void cutlass::Kernel<cutlass_80_wmma_tensorop_bf16_s161616gemm>", "matmul"),
    ("rms_norm_kernel", "norm"), ("rope_kernel", "rope"), ("silu_mul_kernel", "activation"),
    ("void at::native::reduce_kernel<ArgMaxOps>", "sampling"), ("Memset (Device)", "other"),
])
def test_kernel_classes(name, cls):
    assert kernel_class(name) == cls
