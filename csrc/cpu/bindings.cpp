// Registers the torch-facing functions of ops.h and the rows of the list of formats; nothing else lives here.
#include <torch/python.h>  // pybind11 plus the at::Tensor casters

#include <utility>
#include <vector>

#include "../format_list.h"
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
  m.def("logsumexp", &c::logsumexp, "out[r] = log(sum(exp(x[r]))) for x [R, V]", nogil(), py::arg("out"),
        py::arg("x"));
  m.def("greedy", &c::greedy, "[(first argmax, max, logsumexp) of x[r] for each row r of x [R, V]]", nogil(),
        py::arg("x"));
  m.def("softmax", &c::softmax, "out[r] = softmax(x[r] / temperature) for x [R, V]", nogil(), py::arg("out"),
        py::arg("x"), py::arg("temperature"));
  m.def("nucleus", &c::nucleus, "out[r] = softmax(x[r] / temperature) over the top-k / top-p tokens, 0 elsewhere; "
        "False when a row holds inf or NaN", nogil(), py::arg("out"), py::arg("x"), py::arg("temperature"),
        py::arg("top_k"), py::arg("top_p"));
  m.def("race", &c::race, "out[r] = argmax(weights[r] / the noise of keys[r]), the exponential race of each row",
        nogil(), py::arg("out"), py::arg("weights"), py::arg("keys"));
  m.def("exp_noise", &c::exp_noise, "out[i] = -log(u_i), the sampling noise of one position's key", nogil(),
        py::arg("out"), py::arg("key"));
  m.def("rmsnorm_heads", &c::rmsnorm_heads, "rmsnorm of each head of x [N, H, D] in place", nogil(),
        py::arg("x"), py::arg("weight"), py::arg("eps"));
  m.def("attention", &c::attention, "T new queries per row against a [B, Hkv, S, D] cache, split across threads",
        nogil(), py::arg("out"), py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("seq_lens"),
        py::arg("scale"), py::arg("window") = 0, py::arg("sinks") = 0);
  m.def("interleave_panels", &c::interleave_panels, "a GGUF tensor's blocks into panels of 16 rows, field by field",
        nogil(), py::arg("into"), py::arg("raw"), py::arg("fields"));
  m.def("place_q6_k", &c::place_q6_k, "Q6_K panels' quant bits regrouped in place as the kernel reads them",
        nogil(), py::arg("w"));
  m.def("place_q3_k", &c::place_q3_k, "Q3_K panels' quant bits regrouped in place as the kernel reads them",
        nogil(), py::arg("w"));
  m.def("q6_k_rows", &c::q6_k_rows, "rows of placed Q6_K panels dequantized (an embedding's lookup in a tied head)",
        nogil(), py::arg("out"), py::arg("w"), py::arg("ids"));
  m.def("q8_rows", &c::q8_rows, "rows of int8 / q8 panels dequantized (an embedding's lookup in a tied head)",
        nogil(), py::arg("out"), py::arg("qs"), py::arg("d"), py::arg("ids"));
  m.def("formats", &c::format_names, "the weight formats' names in code order (engine/weights' records)");
  m.def("format_facts", [] {
    py::dict facts;
    for (const auto& f : decodescope::kCpuFormatFacts)
      facts[f.name] = py::dict(py::arg("bits") = f.bits, py::arg("block") = f.block,
                               py::arg("cpu_activations") = f.cpu_activations);
    return facts;
  }, "each format's row of csrc/format_list.h, by WeightFormat field (engine/ops checks them at load)");
  m.def("linear", &c::linear_packed, "out = x @ W^T, W in weight format `format` (a code), packed in panels",
        nogil(), py::arg("out"), py::arg("x"), py::arg("format"), py::arg("w"));
  m.def("linear_greedy", &c::linear_greedy, "linear for a model's head -> greedy's numbers of each row of out",
        nogil(), py::arg("out"), py::arg("x"), py::arg("format"), py::arg("w"));
  py::class_<c::Projection>(m, "Projection",
                            "one segment of a block's projection: its format code, packed tensors and output rows")
      .def(py::init([](int64_t format, std::vector<at::Tensor> tensors, int64_t rows) {
             return c::Projection{format, std::move(tensors), rows};
           }),
           py::arg("format"), py::arg("tensors"), py::arg("rows"));
  m.def("block_fields", &c::block_fields, "the fields of engine/model.py's LayerRecord the block loop reads");
  py::class_<c::BlockPlan>(m, "BlockPlan", "the transformer blocks of a cached forward, planned for one call")
      .def(py::init<const std::vector<c::LayerRecord>&>(), py::arg("layers"))
      .def("run", &c::BlockPlan::run, "every block in one call; h updated in place, the final norm returned",
           nogil(), py::arg("x"), py::arg("h"), py::arg("positions"), py::arg("seq_lens"), py::arg("start"),
           py::arg("kv_limit"), py::arg("window"), py::arg("sinks"));
}
