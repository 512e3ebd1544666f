// Registers the torch-facing functions of ops.h and the rows of the list of formats; nothing else lives here.
#include <torch/python.h>  // pybind11 plus the at::Tensor casters; lighter than torch/extension.h

#include "../format_list.h"
#include "ops.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "decodescope fused CUDA kernels (wrapped by engine/ops/cuda.py)";
  m.def("rmsnorm", &decodescope::rmsnorm, "out = rmsnorm(x) * weight", py::arg("out"), py::arg("x"),
        py::arg("weight"), py::arg("eps"));
  m.def("add_rmsnorm", &decodescope::add_rmsnorm, "residual += x; x = rmsnorm(residual) * weight, in place",
        py::arg("x"), py::arg("residual"), py::arg("weight"), py::arg("eps"));
  m.def("rope", &decodescope::rope, "rotary embedding in place on q and k at device-side positions", py::arg("q"),
        py::arg("k"), py::arg("cos"), py::arg("sin"), py::arg("positions"));
  m.def("silu_mul", &decodescope::silu_mul, "out = silu(gate) * up for gate_up = [gate | up]", py::arg("out"),
        py::arg("gate_up"));
  m.def("decode_attention", &decodescope::decode_attention,
        "split-KV attention of T queries per row over a [B, Hkv, S, D] cache with device-side seq_lens, window and sinks",
        py::arg("out"), py::arg("q"), py::arg("k_cache"), py::arg("v_cache"), py::arg("seq_lens"), py::arg("scale"),
        py::arg("window"), py::arg("sinks"), py::arg("partials"), py::arg("counters"));
  m.def("linear_int8", &decodescope::linear_int8, "out = x @ W^T for W in int8 (GGUF Q8_0) blocks",
        py::arg("out"), py::arg("x"), py::arg("qs"), py::arg("d"));
  m.def("linear_q4", &decodescope::linear_q4, "out = x @ W^T for W in q4 (GGUF Q4_1) blocks", py::arg("out"),
        py::arg("x"), py::arg("qs"), py::arg("d"), py::arg("m"));
  m.def("linear_dense", &decodescope::linear_dense, "out = x @ W^T for a dense fp16 or bf16 W [out, in]",
        py::arg("out"), py::arg("x"), py::arg("w"));
  m.def("dequantize_int8", &decodescope::dequantize_int8, "out = dequantize(W) for W in int8 (GGUF Q8_0) blocks",
        py::arg("out"), py::arg("qs"), py::arg("d"));
  m.def("dequantize_q4", &decodescope::dequantize_q4, "out = dequantize(W) for W in q4 (GGUF Q4_1) blocks",
        py::arg("out"), py::arg("qs"), py::arg("d"), py::arg("m"));
  m.def("format_facts", [] {
    py::dict facts;
    for (const auto& f : decodescope::kCudaFormatFacts)
      facts[f.name] = py::dict(py::arg("bits") = f.bits, py::arg("block") = f.block);
    return facts;
  }, "the formats a kernel here reads: their rows of csrc/format_list.h (engine/ops checks them at load)");
  m.def("decode_attention_plan", &decodescope::decode_attention_plan,
        "(splits, groups, blocks per SM) of decode_attention's grid: one full wave of q's GPU", py::arg("q"),
        py::arg("n_kv_heads"));
}
