// The CPU attention kernel shared by paged_attention and dense_attention: one pass over K/V
// with online softmax (float32 scores and state), templated on an addressing policy so that
// only "where does key t live" differs between the two ops.
//
// Work unit: one (batch row b, kv head h) and a block of query rows r = l * G + g, where the G =
// Hq / Hkv query heads h*G .. h*G+G-1 share kv head h. Every key/value row is read once per
// block, in tiles of kKeyTile keys; a tile's physical pages are resolved once per page.
// Schedules: decode (L <= kDecodeMaxQueryLen) puts all G*L rows of (b, h) in one block;
// prefill splits them into blocks of kPrefillRows consecutive rows, so a block's causal limits
// are close together and blocks spread over threads.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "cpu/float_types.h"
#include "cpu/parallel.h"
#include "cpu/vector_math.h"
#include "kernels/online_softmax.h"
#include "kernels/paged_kv.h"

namespace pagekernels::cpu {

// The build sets no -march (wheels must run on any x86-64), so on x86-64 Linux the hot function
// is also compiled for x86-64-v3 (AVX2 + FMA) and picked at load time when the CPU has it
// (about 1.5x faster than SSE2 on decode; measured in README.md).
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define PK_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define PK_CPU_CLONES
#endif

constexpr int kKeyTile = 32;  // a multiple of 4 (dot4/axpy4)
constexpr int kDecodeMaxQueryLen = 8;
constexpr int kPrefillRows = 32;

struct AttentionShape {
  int batch;
  int num_q_heads;   // Hq
  int num_kv_heads;  // Hkv
  int query_len;     // L
  int head_dim;      // D
  float scale;
  bool causal;  // bottom-right aligned to each row's key count
};

// Keys of request b live in pages named by block_table row b; num_keys = context_lens[b].
template <typename T>
struct PagedKeys {
  const T* keys;
  const T* values;
  PagedKVLayout layout;
  const int32_t* context_lens;

  int num_keys(int b) const { return std::max(context_lens[b], 0); }

  // Row pointers of keys [t0, t0 + n) of (b, h); nullptr where the page is padding or invalid.
  void rows(int b, int h, int t0, int n, const T** k, const T** v) const {
    const int64_t d = layout.head_dim;
    for (int i = 0; i < n;) {
      int t = t0 + i;
      int slot = t % layout.page_size;
      int count = std::min(layout.page_size - slot, n - i);
      int32_t page = layout.page_id(b, t / layout.page_size);
      int64_t base = page < 0 ? -1 : layout.offset(page, h, slot);
      for (int j = 0; j < count; ++j, ++i) {
        k[i] = base < 0 ? nullptr : keys + base + j * d;
        v[i] = base < 0 ? nullptr : values + base + j * d;
      }
    }
  }
};

// Keys of row b are keys[b, h, :key_lens[b]] of a dense [B, Hkv, S, D] tensor.
template <typename T>
struct DenseKeys {
  const T* keys;
  const T* values;
  int num_kv_heads;
  int seq_len;  // S
  int head_dim;
  const int32_t* key_lens;

  int num_keys(int b) const { return std::clamp(key_lens[b], 0, seq_len); }

  void rows(int b, int h, int t0, int n, const T** k, const T** v) const {
    int64_t base = ((static_cast<int64_t>(b) * num_kv_heads + h) * seq_len + t0) * head_dim;
    for (int i = 0; i < n; ++i) {
      k[i] = keys + base + static_cast<int64_t>(i) * head_dim;
      v[i] = values + base + static_cast<int64_t>(i) * head_dim;
    }
  }
};

struct AttentionScratch {
  std::vector<float> q;             // [rows, D] queries, pre-scaled by scale * log2(e)
  std::vector<float> acc;           // [rows, D] unnormalised outputs
  std::vector<SoftmaxState> state;  // [rows]
  std::vector<int> limit;           // [rows] exclusive bound on the keys a row sees
  std::vector<float> k, v;  // [kKeyTile, D] tile rows converted to float (non-float T only)
  std::vector<float> zero;  // [D] stands in for unmapped and past-the-limit rows
  float scores[kKeyTile];
  float weights[kKeyTile];

  void reserve(int rows, int head_dim) {
    const size_t n = static_cast<size_t>(rows) * head_dim;
    if (q.size() < n) {
      q.resize(n);
      acc.resize(n);
      state.resize(rows);
      limit.resize(rows);
    }
    if (zero.size() < static_cast<size_t>(head_dim)) {
      k.resize(static_cast<size_t>(kKeyTile) * head_dim);
      v.resize(static_cast<size_t>(kKeyTile) * head_dim);
      zero.assign(head_dim, 0.0f);
    }
  }
};

// Float views of a tile's key/value rows: the rows themselves for float storage, converted
// copies in scratch otherwise. Unmapped rows (nullptr) read as zeros.
template <int kD, typename T>
inline void tile_as_float(const T* const* rows, int n, int runtime_dim, float* converted,
                          const float* zero, const float** out) {
  const int d = dim<kD>(runtime_dim);
  for (int j = 0; j < n; ++j) {
    if (rows[j] == nullptr) {
      out[j] = zero;
    } else if constexpr (std::is_same_v<T, float>) {
      out[j] = rows[j];
    } else {
      row_to_float(rows[j], converted + static_cast<size_t>(j) * d, d);
      out[j] = converted + static_cast<size_t>(j) * d;
    }
  }
}

// Rows [j, j + 4) of a tile, with rows at or past `end` replaced by the zero row.
inline const float* const* group_of_four(const float* const* rows, int j, int end,
                                         const float* zero, const float** padded) {
  if (j + 4 <= end) return rows + j;
  for (int c = 0; c < 4; ++c) padded[c] = j + c < end ? rows[j + c] : zero;
  return padded;
}

// Attention for query rows [row_begin, row_end) of (b, h); row r is query head h*G + r % G at
// position r / G. Writes the normalised rows to out (zeros for rows that see no key).
template <int kD, typename T, typename Keys>
PK_CPU_CLONES void attend_block(const AttentionShape& p, const Keys& keys, const T* q, T* out, int b, int h,
                  int row_begin, int row_end, AttentionScratch& s) {
  const int d = dim<kD>(p.head_dim);
  const int group = p.num_q_heads / p.num_kv_heads;
  const int rows = row_end - row_begin;
  const int num_keys = keys.num_keys(b);
  s.reserve(rows, d);

  auto row_offset = [&](int r) {  // element offset of (b, head h*G + r%G, position r/G, 0)
    int64_t head = static_cast<int64_t>(h) * group + r % group;
    return ((static_cast<int64_t>(b) * p.num_q_heads + head) * p.query_len + r / group) * d;
  };

  const float q_scale = p.scale * kLog2e;  // scores live in the exp2 domain
  int key_end = 0;
  for (int i = 0; i < rows; ++i) {
    int r = row_begin + i;
    int limit = p.causal ? causal_key_limit(r / group, p.query_len, num_keys) : num_keys;
    s.limit[i] = std::clamp(limit, 0, num_keys);
    key_end = std::max(key_end, s.limit[i]);
    const T* q_row = q + row_offset(r);
    float* q_f = s.q.data() + static_cast<size_t>(i) * d;
    for (int e = 0; e < d; ++e) q_f[e] = to_float(q_row[e]) * q_scale;
    std::fill_n(s.acc.data() + static_cast<size_t>(i) * d, d, 0.0f);
    s.state[i] = SoftmaxState::empty();
  }

  const T* k_rows[kKeyTile];
  const T* v_rows[kKeyTile];
  const float* k_f[kKeyTile];
  const float* v_f[kKeyTile];
  const float* padded[4];
  const float* zero = s.zero.data();
  for (int t0 = 0; t0 < key_end; t0 += kKeyTile) {
    const int n = std::min(kKeyTile, key_end - t0);
    keys.rows(b, h, t0, n, k_rows, v_rows);
    tile_as_float<kD>(k_rows, n, d, s.k.data(), zero, k_f);
    tile_as_float<kD>(v_rows, n, d, s.v.data(), zero, v_f);

    for (int i = 0; i < rows; ++i) {
      const int visible = std::min(n, s.limit[i] - t0);
      if (visible <= 0) continue;
      const float* q_f = s.q.data() + static_cast<size_t>(i) * d;
      float* acc = s.acc.data() + static_cast<size_t>(i) * d;
      for (int j = 0; j < visible; j += 4) {
        dot4<kD>(q_f, group_of_four(k_f, j, visible, zero, padded), d, s.scores + j);
      }
      float tile_max = -INFINITY;
      for (int j = 0; j < visible; ++j) {
        if (k_rows[j] == nullptr) s.scores[j] = -INFINITY;
        tile_max = std::max(tile_max, s.scores[j]);
      }
      if (tile_max == -INFINITY) continue;
      SoftmaxState& st = s.state[i];
      if (tile_max > st.m) {
        const float alpha = st.rescale_to(tile_max);
        if (alpha != 1.0f) {
          for (int e = 0; e < d; ++e) acc[e] *= alpha;
        }
      }
      const int visible4 = (visible + 3) & ~3;  // kKeyTile is a multiple of 4
      exp2_weights(s.scores, st.m, visible, visible4, s.weights);
      for (int j = 0; j < visible4; ++j) st.d += s.weights[j];
      for (int j = 0; j < visible; j += 4) {
        axpy4<kD>(acc, s.weights + j, group_of_four(v_f, j, visible, zero, padded), d);
      }
    }
  }

  for (int i = 0; i < rows; ++i) {
    const float inv = inverse_sum(s.state[i]);
    const float* acc = s.acc.data() + static_cast<size_t>(i) * d;
    T* out_row = out + row_offset(row_begin + i);
    for (int e = 0; e < d; ++e) out_row[e] = from_float<T>(acc[e] * inv);
  }
}

template <int kD, typename T, typename Keys>
void attention_schedule(const AttentionShape& p, const Keys& keys, const T* q, T* out) {
  const int group_rows = (p.num_q_heads / p.num_kv_heads) * p.query_len;  // G * L
  const int block_rows = p.query_len <= kDecodeMaxQueryLen ? group_rows : kPrefillRows;
  const int blocks = (group_rows + block_rows - 1) / block_rows;
  const int num_tasks = p.batch * p.num_kv_heads * blocks;
  int64_t keys_total = 0;
  for (int b = 0; b < p.batch; ++b) keys_total += keys.num_keys(b);
  const int64_t work = keys_total * p.num_q_heads * p.query_len * p.head_dim;

  parallel_tasks<AttentionScratch>(num_tasks, work, [&](int task, AttentionScratch& scratch) {
    const int block = task % blocks;
    const int bh = task / blocks;
    const int row_begin = block * block_rows;
    const int row_end = std::min(group_rows, row_begin + block_rows);
    attend_block<kD>(p, keys, q, out, bh / p.num_kv_heads, bh % p.num_kv_heads, row_begin,
                     row_end, scratch);
  });
}

// out[b, hq, l] = softmax(q[b, hq, l] . K^T * scale, masked) V for every row; q and out are
// [B, Hq, L, D] row-major in T; K/V come through `keys`.
template <typename T, typename Keys>
void attention(const AttentionShape& p, const Keys& keys, const T* q, T* out) {
  switch (p.head_dim) {
    case 64:
      return attention_schedule<64>(p, keys, q, out);
    case 128:
      return attention_schedule<128>(p, keys, q, out);
    default:
      return attention_schedule<0>(p, keys, q, out);
  }
}

}  // namespace pagekernels::cpu
