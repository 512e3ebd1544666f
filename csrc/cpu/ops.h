// The torch-facing functions of the CPU module (bindings.cpp registers them). fp32 activations
// throughout (the CPU model runs in fp32); same names and argument order as the CUDA module's csrc/ops.h
// where one exists. Each checks its inputs (messages name the values), records itself for
// torch.profiler as "decodescope::<name>", and splits its work across threads; outputs are allocated
// by the caller and passed in.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

namespace decodescope::cpu {

// x, out: [..., hidden]; weight: [hidden]. out may be x.
void rmsnorm(at::Tensor& out, const at::Tensor& x, const at::Tensor& weight, double eps);

// residual += x, then x = rmsnorm(residual) * weight, both in place.
void add_rmsnorm(at::Tensor& x, at::Tensor& residual, const at::Tensor& weight, double eps);

// q: [N, H, D], k: [N, Hkv, D] rotated in place (dense heads, free token strides); cos, sin:
// [max_pos, D/2]; positions: [N] int32 or int64, each in [0, max_pos).
void rope(at::Tensor& q, at::Tensor& k, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& positions);

// gate_up: [..., 2I] -> out: [..., I].
void silu_mul(at::Tensor& out, const at::Tensor& gate_up);
void gelu_tanh_mul(at::Tensor& out, const at::Tensor& gate_up);  // gelu's tanh form as the gate (Gemma's GeGLU)

// x: [R, V] dense -> out: [R], log(sum(exp(x[r]))) (torch.logsumexp over the last dim).
void logsumexp(at::Tensor& out, const at::Tensor& x);
// x: [R, V] dense -> each row's (first argmax, max, logsumexp in doubles), a greedy pick's numbers (greedy.h);
// linear_greedy makes the same bits while the head writes its logits.
using GreedyPick = std::tuple<int64_t, double, double>;
std::vector<GreedyPick> greedy(const at::Tensor& x);
// x: [R, V] dense -> out (x's shape): softmax(x / temperature) of each row (torch's, NaN rows where it gives NaN).
void softmax(at::Tensor& out, const at::Tensor& x, double temperature);
// x: [R, V] dense -> out (x's shape): each row's sampling distribution under top-k / top-p, softmax(x / temperature)
// over the tokens engine/ops/ref.py mask_logits keeps, 0 elsewhere (nucleus.h); false when a row holds an inf or a
// NaN (out is then unspecified: the caller takes the twin).
bool nucleus(at::Tensor& out, const at::Tensor& x, double temperature, int64_t top_k, double top_p);
// weights: [R, V] dense, >= 0; keys: R position keys -> out [R] int64, the exponential race of each row against its
// key's noise (exp_noise's values, made on the fly): argmax(weights[r] / noise) as torch's argmax (the first index
// of the largest; a NaN wins).
void race(at::Tensor& out, const at::Tensor& weights, const std::vector<int64_t>& keys);

// out: [V] -> the Exp(1) sampling noise of one position's key (noise.h; twin: engine/ops/ref.py exp_noise).
void exp_noise(at::Tensor& out, int64_t key);

// x: [N, H, D] (dense heads, free token stride) -> rmsnorm of each head in place, weight [D] (q/k norms).
void rmsnorm_heads(at::Tensor& x, const at::Tensor& weight, double eps);

// q: [B, T, H, D] (dense heads, free token and batch strides); k_cache, v_cache: [B, Hkv, S, D] with D
// dense; seq_lens: [B] int32, the live length with the T new tokens included; out like q. Query t attends
// keys j <= seq_lens[b] - T + t; with window > 0 only j < sinks or j > p - window.
void attention(at::Tensor& out, const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
               const at::Tensor& seq_lens, double scale, int64_t window, int64_t sinks);

// out[T, n_out] = x[T, in] @ W^T for W in weight format `format` (kernels.h Format; names in format_names()),
// packed in panels of 16 outputs by engine/weights: w holds the format's packed tensors (formats.h says which,
// and checks them). out's rows may lie further apart than n_out (a slice of a wider output: a segment's). x stays fp32; what each format's kernel does with it is its record's `activations`
// (int8 or 16-bit integers per block of 32 for the quantized formats).
void linear_packed(at::Tensor& out, const at::Tensor& x, int64_t format, const std::vector<at::Tensor>& w);
// linear_packed for a model's head, out dense [T, n_out] -> greedy's numbers of each row of out, each stretch of
// logits reduced right after the kernel wrote it, while it is in cache.
std::vector<GreedyPick> linear_greedy(at::Tensor& out, const at::Tensor& x, int64_t format,
                                      const std::vector<at::Tensor>& w);
std::vector<std::string> format_names();  // the formats' names in code order

// One segment of a block's projection: its format, packed tensors and output rows.
struct Projection {
  int64_t format = 0;
  std::vector<at::Tensor> tensors;
  int64_t rows = 0;
};
// A projection: one segment, or row segments in formats of their own (a GGUF file's q and k in Q4_K, its v in
// Q6_K), each writing its slice of the outputs, in order.
using Projections = std::vector<Projection>;

// One field of a layer record: a tensor (an empty one for a part the family lacks), a projection, an int, a
// float or a name.
using Field = std::variant<at::Tensor, Projections, int64_t, double, std::string>;
// engine/model.py's LayerRecord, field by field by name: the one hand-off from the model to the block loop.
using LayerRecord = std::map<std::string, Field>;

// The layer record's field names as the block loop reads them, in engine/model.py's order; the model checks
// them against its record when it takes the CPU ops.
std::vector<std::string> block_fields();

// The blocks of a cached forward in one call (ops_blocks.cpp), planned once per model and KV cache from one
// LayerRecord per block: the same kernels in the same order as engine/model.py's Block.forward.
class BlockPlan {
 public:
  explicit BlockPlan(const std::vector<LayerRecord>& layers);
  // x = attn_norm_0(h) [N = B*T, C] in; the last block's output (the final norm of h) out; h, the residual
  // stream, updated in place. The new K/V go to positions start..start+T-1 of every row (positions: [N]);
  // attention reads keys below kv_limit, windowed as attention() says (a layer with its own window: that
  // window, no sinks).
  at::Tensor run(const at::Tensor& x, at::Tensor& h, const at::Tensor& positions, const at::Tensor& seq_lens,
                 int64_t start, int64_t kv_limit, int64_t window, int64_t sinks) const;

  struct Layer;  // a LayerRecord read into typed fields, declared beside the loop that reads it

 private:
  std::shared_ptr<const std::vector<Layer>> layers_;
  int64_t batch_ = 0, max_len_ = 0, head_dim_ = 0;
};

// Packing a GGUF tensor at load (ops_pack.cpp; engine/weights/panels.py and k_placed.py hold the torch forms):
// raw uint8 [rows, nb * B] -> into uint8 [ceil(rows / 16), nb, 16 * B], each block's fields (bytes, unit) cut
// into units and unit u of a panel's 16 rows stored side by side (padded rows zero); and Q6_K panels' quant
// bits regrouped and their lines reordered in place as the kernel reads them (kquants16.h q6k_group).
void interleave_panels(at::Tensor& into, const at::Tensor& raw, const std::vector<std::pair<int64_t, int64_t>>& fields);
void place_q6_k(at::Tensor& w);
void place_q3_k(at::Tensor& w);  // likewise Q3_K's (kquants16.h q3k_operands)
// Rows `ids` of placed Q6_K panels [P, ns, 3360] dequantized into out float [len(ids), in] (in <= 256 ns): an
// embedding's lookup in a tied head's blocks, as k_placed.py's unplace, deinterleave and dequantize give them.
void q6_k_rows(at::Tensor& out, const at::Tensor& w, const at::Tensor& ids);
// Rows `ids` of int8 / q8 panels (qs uint8 [P, nb, 8, 16, 4] offset by 128, d fp16 [P, nb, 16]) dequantized into
// out float [len(ids), in]: a tied Q8_0 head's embedding lookup, as q8_0.py's panel_rows gives them.
void q8_rows(at::Tensor& out, const at::Tensor& qs, const at::Tensor& d, const at::Tensor& ids);

std::string isa();          // the kernel table in use, e.g. "avx512 (vnni)"
std::string unsupported();  // "" when this CPU can run the kernels, else what it lacks
void set_isa(const std::string& name);  // "avx2" | "avx512" | "amx"; raises if this CPU lacks it
int64_t amx_rows();                     // the amx table's q4 / q8 passes run on tiles from this many rows up
void set_amx_rows(int64_t rows);

}  // namespace decodescope::cpu
