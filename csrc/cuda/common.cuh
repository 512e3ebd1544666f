// Helpers every kernel header shares: fp32 conversions, 16-byte vectors, reductions.
// Torch-free; builds under torch's -D__CUDA_NO_HALF_CONVERSIONS__ flags, so every conversion is explicit.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#ifdef DECODESCOPE_CUDA_ON_CPU
#include "testing/cuda_on_cpu.h"  // the tests' CPU-thread runtime; it provides launch()
namespace decodescope {
using cuda_on_cpu::check_vector_alignment;
using cuda_on_cpu::launch;
template <typename... Params>
cudaError_t max_blocks_per_sm(int* blocks, void (*)(Params...), int) {
  *blocks = cuda_on_cpu::blocks_per_sm;
  return cudaSuccess;
}
__device__ __forceinline__ float fast_exp2(float x) { return exp2f(x); }
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool zero) {
  __pipeline_memcpy_async(smem, gmem, 16, zero ? 16 : 0);
}
}  // namespace decodescope
#else
#include <cuda_pipeline_primitives.h>
namespace decodescope {
// Every kernel launch goes through here, so the same launchers also run on CPU threads in the tests.
template <typename... Params, typename... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream, Args... args) {
  kernel<<<grid, block, 0, stream>>>(args...);
  return cudaGetLastError();
}
// The CPU test runtime reports vector accesses that a GPU would fault on; here it costs nothing.
__device__ __forceinline__ void check_vector_alignment(const void*, int) {}
// How many blocks of `threads` threads fit on one SM (registers, shared memory, thread slots).
template <typename... Params>
cudaError_t max_blocks_per_sm(int* blocks, void (*kernel)(Params...), int threads) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, kernel, threads, 0);
}
// 16 bytes from global to shared memory without passing through registers (cp.async.cg, L2 only); with
// `zero`, 16 zero bytes land instead and gmem is not read. The source size is a register operand: the
// zfill argument of __pipeline_memcpy_async must be a constant, else every copy becomes a branch.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool zero) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(zero ? 0 : 16)
               : "memory");
}
// One MUFU instruction (exp2f adds range handling around it); 2^-inf = 0, denormal results flush to 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
}  // namespace decodescope
#endif

namespace decodescope {

__host__ __device__ constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// N elements loaded or stored as one instruction: 16 bytes when N = 16 / sizeof(T), the widest load.
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

template <typename T, int N>
__device__ __forceinline__ Vec<T, N> load_vec(const T* p) {
  check_vector_alignment(p, sizeof(Vec<T, N>));
  return *reinterpret_cast<const Vec<T, N>*>(p);
}

template <typename T, int N>
__device__ __forceinline__ void store_vec(T* p, const Vec<T, N>& x) {
  check_vector_alignment(p, sizeof(Vec<T, N>));
  *reinterpret_cast<Vec<T, N>*>(p) = x;
}

// 4 floats written by other blocks of this grid, read through L2 only (ld.global.cg: no stale L1 line).
__device__ __forceinline__ Vec<float, 4> load_float4_cg(const float* p) {
  check_vector_alignment(p, 16);
  const float4 v = __ldcg(reinterpret_cast<const float4*>(p));
  return {{v.x, v.y, v.z, v.w}};
}

// 16 bytes read once per call (streamed weights): ld.global.cs, evict-first, so they do not push the
// activations and the KV cache out of L2.
__device__ __forceinline__ Vec<uint32_t, 4> load_stream16(const void* p) {
  check_vector_alignment(p, 16);
  const uint4 v = __ldcs(reinterpret_cast<const uint4*>(p));
  return {{v.x, v.y, v.z, v.w}};
}

template <typename T>
constexpr int kVec16 = 16 / static_cast<int>(sizeof(T));  // elements in one 16-byte load

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Needs all 32 lanes of the warp: kernels that call it launch whole warps.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the block, returned to every thread. blockDim.x must be a multiple of 32; call once per kernel
// (the shared slots are not fenced for reuse).
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float warp_sums[32];
  __shared__ float total;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = warp_sum(v);
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < static_cast<int>(blockDim.x / 32) ? warp_sums[lane] : 0.f;
    v = warp_sum(v);
    if (lane == 0) total = v;
  }
  __syncthreads();
  return total;
}

// Threads for a row of n work items: whole warps, at most 1024.
inline int row_threads(int n) {
  const int warps = ceil_div(n, 32);
  return 32 * (warps < 1 ? 1 : (warps > 32 ? 32 : warps));
}

}  // namespace decodescope
