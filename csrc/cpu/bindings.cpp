// Registers the torch-facing functions of ops.h; nothing else lives here.
#include <torch/python.h>  // pybind11 plus the at::Tensor casters

#include <utility>
#include <vector>

#include "ops.h"
#include "pool.h"

// Every function that does real work runs without the GIL (nogil), so the app's other Python threads (the
// page's server, a second session) run during a step's native calls; the arguments are converted before and
// the result after, with the GIL held.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace c = decodescope::cpu;
  using nogil = py::call_guard<py::gil_scoped_release>;
  m.doc() = "decodescope fused CPU kernels (x86-64 SIMD, chosen at load)";
  m.def("isa", &c::isa, "the instruction set the kernels run, chosen at load");
  m.def("unsupported", &c::unsupported, "'' when this CPU can run the kernels, else what it lacks");
  m.def("set_isa", &c::set_isa, "switch the kernels to 'avx2', 'avx512' or 'amx' (tests run every path)",
        py::arg("name"));
  m.def("amx_rows", &c::amx_rows, "the amx kernels run q4 and q8 on tiles from this many rows up");
  m.def("set_amx_rows", &c::set_amx_rows, "the AMX crossover in rows (tests and benchmarks move it)",
        py::arg("rows"));
  m.def("set_spin_us", &c::set_spin_us, "how long idle worker threads spin before sleeping", py::arg("us"));
  m.def("rmsnorm", &c::rmsnorm, "out = rmsnorm(x) * weight", nogil(), py::arg("out"), py::arg("x"),
        py::arg("weight"), py::arg("eps"));
  m.def("add_rmsnorm", &c::add_rmsnorm, "residual += x; x = rmsnorm(residual) * weight, in place", nogil(),
        py::arg("x"), py::arg("residual"), py::arg("weight"), py::arg("eps"));
  m.def("rope", &c::rope, "rotary embedding in place on q and k", nogil(), py::arg("q"), py::arg("k"),
        py::arg("cos"), py::arg("sin"), py::arg("positions"));
  m.def("silu_mul", &c::silu_mul, "out = silu(gate) * up for gate_up = [gate | up]", nogil(), py::arg("out"),
        py::arg("gate_up"));
  m.def("gelu_tanh_mul", &c::gelu_tanh_mul, "out = gelu_tanh(gate) * up for gate_up = [gate | up]", nogil(),
        py::arg("out"), py::arg("gate_up"));
  m.def("rmsnorm_heads", &c::rmsnorm_heads, "rmsnorm of each head of x [N, H, D] in place", nogil(),
        py::arg("x"), py::arg("weight"), py::arg("eps"));
  m.def("attention", &c::attention, "T new queries per row against a [B, Hkv, S, D] cache, split across threads",
        nogil(), py::arg("out"), py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("seq_lens"),
        py::arg("scale"), py::arg("window") = 0, py::arg("sinks") = 0);
  m.def("formats", &c::format_names, "the weight formats' names in code order (engine/weights' records)");
  m.def("linear", &c::linear_packed, "out = x @ W^T, W in weight format `format` (a code), packed in panels",
        nogil(), py::arg("out"), py::arg("x"), py::arg("format"), py::arg("w"));
  py::class_<c::Projection>(m, "Projection", "one projection of a block: its format code and packed tensors")
      .def(py::init([](int64_t format, std::vector<at::Tensor> tensors) {
             return c::Projection{format, std::move(tensors)};
           }),
           py::arg("format"), py::arg("tensors"));
  py::class_<c::BlockWeights>(m, "BlockWeights", "one block's weights and KV cache, as the block loop reads them")
      .def(py::init([](at::Tensor mlp_norm, at::Tensor next_norm, at::Tensor k_cache, at::Tensor v_cache,
                       at::Tensor qkv_bias, c::Projection qkv, c::Projection o, c::Projection gate_up,
                       c::Projection down, at::Tensor q_norm, at::Tensor k_norm, at::Tensor post_attn_norm,
                       at::Tensor post_mlp_norm, at::Tensor cos, at::Tensor sin, int64_t window) {
             return c::BlockWeights{.mlp_norm = mlp_norm, .next_norm = next_norm, .k_cache = k_cache,
                                    .v_cache = v_cache, .qkv_bias = qkv_bias, .qkv = qkv, .o = o, .gate_up = gate_up,
                                    .down = down, .q_norm = q_norm, .k_norm = k_norm,
                                    .post_attn_norm = post_attn_norm, .post_mlp_norm = post_mlp_norm, .cos = cos,
                                    .sin = sin, .window = window};
           }),
           py::arg("mlp_norm"), py::arg("next_norm"), py::arg("k_cache"), py::arg("v_cache"), py::arg("qkv_bias"),
           py::arg("qkv"), py::arg("o"), py::arg("gate_up"), py::arg("down"), py::arg("q_norm"), py::arg("k_norm"),
           py::arg("post_attn_norm"), py::arg("post_mlp_norm"), py::arg("cos"), py::arg("sin"), py::arg("window"));
  py::class_<c::BlockPlan>(m, "BlockPlan", "the transformer blocks of a cached forward, planned for one call")
      .def(py::init<std::vector<c::BlockWeights>, int64_t, int64_t, int64_t, double, double, const std::string&>(),
           py::arg("layers"), py::arg("n_heads"), py::arg("n_kv_heads"), py::arg("intermediate"), py::arg("eps"),
           py::arg("scale"), py::arg("activation"))
      .def("run", &c::BlockPlan::run, "every block in one call; h updated in place, the final norm returned",
           nogil(), py::arg("x"), py::arg("h"), py::arg("positions"), py::arg("seq_lens"), py::arg("start"),
           py::arg("kv_limit"), py::arg("window"), py::arg("sinks"));
}
