// Torch-facing host code that packs a GGUF tensor's bytes into the kernels' panels at load: the same moves as
// engine/weights/panels.py's interleave and k_placed.py's place_q6_k and place_q3_k (their torch forms stay the twins and the
// path without this module), done a block at a time in cache instead of as strided torch copies of 1-4 byte
// elements, which made packing most of a warm load (a 1.5B Q4_K_M's: 2.2-2.8 s with them, 1.2-1.6 s with these).
#include <ATen/record_function.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "checks.h"
#include "kernels.h"
#include "ops.h"
#include "parallel.h"

namespace decodescope::cpu {
namespace {

// Unit u of a field's 16 rows side by side: dst[u][r] = row r's unit u, for n / unit units.
template <int kUnit>
void move_units(uint8_t* dst, const uint8_t* const* rows, int64_t at, int64_t units) {
  for (int r = 0; r < kPanel; ++r) {
    uint8_t* o = dst + r * kUnit;
    if (rows[r] == nullptr) {  // a padded output: zeros
      for (int64_t u = 0; u < units; ++u) std::memset(o + u * kPanel * kUnit, 0, kUnit);
      continue;
    }
    const uint8_t* s = rows[r] + at;
    for (int64_t u = 0; u < units; ++u) std::memcpy(o + u * kPanel * kUnit, s + u * kUnit, kUnit);
  }
}

}  // namespace

void interleave_panels(at::Tensor& into, const at::Tensor& raw,
                       const std::vector<std::pair<int64_t, int64_t>>& fields) {
  RECORD_FUNCTION("decodescope::interleave_panels", std::vector<c10::IValue>());
  int64_t size = 0;
  for (const auto& [n, unit] : fields) {
    TORCH_CHECK((unit == 1 || unit == 2 || unit == 4) && n > 0 && n % unit == 0, "a field is (bytes, unit) with ",
                "unit 1, 2 or 4 dividing bytes, got (", n, ", ", unit, ")");
    size += n;
  }
  TORCH_CHECK(size > 0, "fields must describe a block of at least one byte");
  check_cpu(raw, "raw");
  check_dtype(raw, "raw", at::kByte);
  check_dense(raw, "raw");
  TORCH_CHECK(raw.dim() == 2 && raw.size(1) % size == 0, "raw must be [rows, nb * ", size, "] (whole ", size,
              "-byte blocks), got ", raw.sizes());
  const int64_t rows = raw.size(0), nb = raw.size(1) / size;
  const int64_t panels = (rows + kPanel - 1) / kPanel;
  check_tensor(into, "into", at::kByte, "[P, nb, 16 * block bytes]", {panels, nb, kPanel * size});
  TORCH_CHECK(!overlaps(into, raw), "into must not overlap raw");
  const uint8_t* src = raw.data_ptr<uint8_t>();
  uint8_t* dst = into.data_ptr<uint8_t>();
  const int64_t row_bytes = raw.size(1);
  // one task a panel's block: 16 rows x size bytes read, the same written, all in L1
  parallel_chunks(panels * nb, 256, [&](int64_t begin, int64_t end) {
    for (int64_t pb = begin; pb < end; ++pb) {
      const int64_t p = pb / nb, b = pb % nb;
      const uint8_t* row_at[kPanel];
      for (int r = 0; r < kPanel; ++r) {
        const int64_t row = p * kPanel + r;
        row_at[r] = row < rows ? src + row * row_bytes + b * size : nullptr;
      }
      uint8_t* out = dst + pb * kPanel * size;
      int64_t at = 0;
      for (const auto& [n, unit] : fields) {
        uint8_t* o = out + kPanel * at;
        if (unit == 4) move_units<4>(o, row_at, at, n / 4);
        else if (unit == 2) move_units<2>(o, row_at, at, n / 2);
        else move_units<1>(o, row_at, at, n);
        at += n;
      }
    }
  });
}

namespace {
// K-quant panels [..., nb, Bytes] whose super-blocks a kernel reads rearranged (place_q6_k, place_q3_k): in each,
// the file's last Head bytes (the scales and d) move to the front and place(super-block, into) writes the quant
// lines after them, into a buffer then copied back; the super-blocks split across threads.
template <int64_t Bytes, int64_t Head, class Place>
void place_super_blocks(at::Tensor& w, const char* what, Place place) {
  check_cpu(w, "w");
  check_dtype(w, "w", at::kByte);
  check_dense(w, "w");
  TORCH_CHECK(w.dim() >= 2 && w.size(-1) == Bytes, "w must be ", what, " panels [..., nb, ", Bytes, "], got ",
              w.sizes());
  uint8_t* base = w.data_ptr<uint8_t>();
  parallel_chunks(w.numel() / Bytes, 256, [&](int64_t begin, int64_t end) {
    alignas(64) uint8_t placed[Bytes];
    for (int64_t blk = begin; blk < end; ++blk) {
      uint8_t* sb = base + blk * Bytes;
      std::memcpy(placed, sb + Bytes - Head, Head);
      place(sb, placed);
      std::memcpy(sb, placed, Bytes);
    }
  });
}

// Three 64-byte lines (4 bytes of each of 16 rows) rewritten word by word into three others: move(a, b, c, x, y, z)
// makes a row's words x, y, z from its words a, b, c.
template <class Move>
void move_lines(const uint8_t* la, const uint8_t* lb, const uint8_t* lc, uint8_t* lx, uint8_t* ly, uint8_t* lz,
                Move move) {
  for (int i = 0; i < 64; i += 4) {
    uint32_t a, b, c, x, y, z;
    std::memcpy(&a, la + i, 4);
    std::memcpy(&b, lb + i, 4);
    std::memcpy(&c, lc + i, 4);
    move(a, b, c, x, y, z);
    std::memcpy(lx + i, &x, 4);
    std::memcpy(ly + i, &y, 4);
    std::memcpy(lz + i, &z, 4);
  }
}
}  // namespace

void place_q6_k(at::Tensor& w) {
  RECORD_FUNCTION("decodescope::place_q6_k", std::vector<c10::IValue>({w}));
  // k_placed.py place_q6_k's moves on each 4-byte word (4 bytes of a row): for the half h and group g of a
  // super-block, the file's A line 16h + g, B line 16h + 8 + g and qh line 32 + 8h + g (64-byte lines) become
  // the X, Y and Z lines at kernels.h's q6k_x_at, q6k_y_at and q6k_z_at, after the scales and d, moved to the front
  // (interleave_panels leaves ql 2048, qh 1024, scales 256, d 32: the file's last 288 bytes)
  static_assert(kQ6Scales == 0 && kQ6D == kQ6Scales + 256 && kQ6Quants == kQ6D + 32 &&
                48 * 64 + kQ6Quants == kQ6KBytes);
  place_super_blocks<kQ6KBytes, kQ6Quants>(w, "Q6_K", [](const uint8_t* sb, uint8_t* placed) {
    for (int h = 0; h < 2; ++h)
      for (int g = 0; g < 8; ++g)
        move_lines(sb + 64 * (16 * h + g), sb + 64 * (16 * h + 8 + g), sb + 64 * (32 + 8 * h + g),
                   placed + q6k_x_at(h, g), placed + q6k_y_at(h, g), placed + q6k_z_at(h, g),
                   [](uint32_t a, uint32_t b, uint32_t q, uint32_t& x, uint32_t& y, uint32_t& z) {
                     constexpr uint32_t f0 = 0x0F0F0F0Fu, f3 = 0x30303030u, c0 = 0xC0C0C0C0u, t0 = 0xF0F0F0F0u;
                     x = (a & f0) | ((q << 4) & f3) | ((b << 2) & c0);
                     y = (b & f0) | ((q << 2) & f3) | (b & c0);
                     z = ((a >> 4) & f0) | (q & t0);
                   });
  });
}

void place_q3_k(at::Tensor& w) {
  RECORD_FUNCTION("decodescope::place_q3_k", std::vector<c10::IValue>({w}));
  // k_placed.py place_q3_k's moves on each 4-byte word (4 bytes of a row): group g's hmask line g and qs lines g
  // (half 0) and 8 + g (half 1) become its X, Y and Z lines (kernels.h q3k_x_at, ...), after the scales and d,
  // moved to the front (interleave_panels leaves hmask 512, qs 1024, scales 192, d 32: the file's last 224 bytes)
  static_assert(kQ3Scales == 0 && kQ3D == kQ3Scales + 192 && kQ3Quants == kQ3D + 32 &&
                24 * 64 + kQ3Quants == kQ3KBytes);
  place_super_blocks<kQ3KBytes, kQ3Quants>(w, "Q3_K", [](const uint8_t* sb, uint8_t* placed) {
    for (int g = 0; g < 8; ++g)
      move_lines(sb + 64 * g, sb + 512 + 64 * g, sb + 512 + 64 * (8 + g), placed + q3k_x_at(g), placed + q3k_y_at(g),
                 placed + q3k_z_at(g), [](uint32_t h, uint32_t a, uint32_t b, uint32_t& x, uint32_t& y, uint32_t& z) {
                   constexpr uint32_t m3 = 0x03030303u, m1 = 0x01010101u;
                   // q(n, j) of each byte, 0..7: bits 2j, 2j + 1 of qs line n, bit 4n + j of the hmask line as bit 2
                   const auto q = [h](uint32_t qs, int n, int j) {
                     return ((qs >> 2 * j) & m3) | (((h >> (4 * n + j)) & m1) << 2);
                   };
                   x = q(a, 0, 0) | q(a, 0, 1) << 3 | (q(a, 0, 2) & m3) << 6;
                   y = q(b, 1, 0) | q(b, 1, 1) << 3 | (q(b, 1, 2) & m3) << 6;
                   z = q(a, 0, 3) | q(b, 1, 3) << 3 | ((q(a, 0, 2) >> 2) & m1) << 6 | ((q(b, 1, 2) >> 2) & m1) << 7;
                 });
  });
}

namespace {
// A row lookup's out [len(ids), in] (in within the last of nb blocks of `block` inputs) and ids (rows of P panels).
void check_row_lookup(const at::Tensor& out, const at::Tensor& ids, int64_t P, int64_t nb, int64_t block) {
  const int64_t n = ids.numel(), in = out.size(-1);
  TORCH_CHECK(out.dim() == 2 && out.size(0) == n && in <= nb * block && in > (nb - 1) * block, "out must be [", n,
              ", in] with in in (", (nb - 1) * block, ", ", nb * block, "], got ", out.sizes());
  const int64_t* id = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i)
    TORCH_CHECK(id[i] >= 0 && id[i] < P * kPanel, "ids[", i, "] = ", id[i], " is not a row of ", P * kPanel);
}
}  // namespace

void q6_k_rows(at::Tensor& out, const at::Tensor& w, const at::Tensor& ids) {
  RECORD_FUNCTION("decodescope::q6_k_rows", std::vector<c10::IValue>({w, ids}));
  constexpr int64_t kSuperBlock = kQ6KBytes;
  check_cpu(w, "w"), check_cpu(ids, "ids"), check_cpu(out, "out");
  check_dtype(w, "w", at::kByte), check_dtype(ids, "ids", at::kLong), check_dtype(out, "out", at::kFloat);
  check_dense(w, "w"), check_dense(ids, "ids"), check_dense(out, "out");
  TORCH_CHECK(w.dim() == 3 && w.size(2) == kSuperBlock, "w must be Q6_K panels [P, ns, ", kSuperBlock, "], got ",
              w.sizes());
  const int64_t n = ids.numel(), ns = w.size(1), in = out.size(-1);
  check_row_lookup(out, ids, w.size(0), ns, kSuper);
  const int64_t* id = ids.data_ptr<int64_t>();
  const uint8_t* base = w.data_ptr<uint8_t>();
  float* y = out.data_ptr<float>();
  // the quants as kquants16.h q6k_group reads them: for half h and group g, byte b of row j's 4 in the X, Y and Z
  // lines holds q0, q1, q2 (inputs 128h + 32k + 4g + b, k = 0, 1, 2) in its low 6 bits and a pair of q3's on top
  float row[kSuper];
  for (int64_t i = 0; i < n; ++i) {
    const int64_t panel = id[i] / kPanel, j = id[i] % kPanel;
    for (int64_t sb = 0; sb < ns; ++sb) {
      const uint8_t* wb = base + (panel * ns + sb) * kSuperBlock;
      uint16_t d16;
      std::memcpy(&d16, wb + kQ6D + 2 * j, 2);
      const float d = static_cast<float>(c10::Half(d16, c10::Half::from_bits()));
      float scale[16];
      for (int s = 0; s < 16; ++s)
        scale[s] = d * static_cast<float>(static_cast<int8_t>(wb[kQ6Scales + 16 * s + j]));
      for (int h = 0; h < 2; ++h)
        for (int g = 0; g < 8; ++g)
          for (int b = 0; b < 4; ++b) {
            const int x = wb[q6k_x_at(h, g) + 4 * j + b], yy = wb[q6k_y_at(h, g) + 4 * j + b];
            const int z = wb[q6k_z_at(h, g) + 4 * j + b];
            const int q[4] = {x & 63, yy & 63, z & 63, (x >> 6) | ((yy >> 6) << 2) | ((z >> 6) << 4)};
            for (int k = 0; k < 4; ++k) {
              const int at = 128 * h + 32 * k + 4 * g + b;
              row[at] = scale[at / 16] * static_cast<float>(q[k] - 32);  // (d sc) q, as the torch form's order
            }
          }
      const int64_t left = in - sb * kSuper;
      std::memcpy(y + i * in + sb * kSuper, row, sizeof(float) * (left < kSuper ? left : kSuper));
    }
  }
}

void q8_rows(at::Tensor& out, const at::Tensor& qs, const at::Tensor& d, const at::Tensor& ids) {
  RECORD_FUNCTION("decodescope::q8_rows", std::vector<c10::IValue>({qs, ids}));
  check_cpu(qs, "qs"), check_cpu(d, "d"), check_cpu(ids, "ids"), check_cpu(out, "out");
  check_dtype(qs, "qs", at::kByte), check_dtype(d, "d", at::kHalf), check_dtype(ids, "ids", at::kLong);
  check_dtype(out, "out", at::kFloat);
  check_dense(qs, "qs"), check_dense(d, "d"), check_dense(ids, "ids"), check_dense(out, "out");
  constexpr int kGroups = kBlock / 4;
  TORCH_CHECK(qs.dim() == 5 && qs.size(2) == kGroups && qs.size(3) == kPanel && qs.size(4) == 4,
              "qs must be int8 panels [P, nb, ", kGroups, ", ", kPanel, ", 4], got ", qs.sizes());
  const int64_t P = qs.size(0), nb = qs.size(1), n = ids.numel(), in = out.size(-1);
  TORCH_CHECK(d.dim() == 3 && d.size(0) == P && d.size(1) == nb && d.size(2) == kPanel, "d must be [", P, ", ", nb,
              ", ", kPanel, "], got ", d.sizes());
  check_row_lookup(out, ids, P, nb, kBlock);
  const int64_t* id = ids.data_ptr<int64_t>();
  const uint8_t* q = qs.data_ptr<uint8_t>();
  const uint16_t* scale = reinterpret_cast<const uint16_t*>(d.data_ptr<at::Half>());
  float* y = out.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t panel = id[i] / kPanel, j = id[i] % kPanel;
    float* row = y + i * in;
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t at = panel * nb + b;
      const float dv = static_cast<float>(c10::Half(scale[at * kPanel + j], c10::Half::from_bits()));
      const uint8_t* qb = q + at * kBlock * kPanel + j * 4;  // [8 groups][16 rows][4 inputs]: row j's 4 a group
      for (int g = 0; g < kGroups; ++g)
        for (int r = 0; r < 4; ++r) {
          const int64_t x = b * kBlock + 4 * g + r;
          if (x < in) row[x] = static_cast<float>(static_cast<int>(qb[g * kPanel * 4 + r]) - 128) * dv;  // q * d
        }
    }
  }
}

}  // namespace decodescope::cpu
