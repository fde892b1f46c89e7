// Device helpers shared by the YOSO CUDA kernels (yoso_cuda_kernels.cu, yoso_cuda_gradients.cu).
#pragma once

#include <stdint.h>

#include <algorithm>

#include "yoso_simt.h"

namespace yoso {

constexpr int kWarp = 32;

// The first position of a sorted run [0, count) whose value is not below `value`.
YOSO_DEVICE int lower_bound(const int32_t* sorted, int count, int32_t value) {
  int low = 0, high = count;
  while (low < high) {
    const int mid = (low + high) / 2;
    if (load(sorted + mid) < value) low = mid + 1; else high = mid;
  }
  return low;
}

// [first, last) of the run of `value` in a sorted array (first == last when absent).
struct Run {
  int first, last;
  YOSO_DEVICE int size() const { return last - first; }
};

YOSO_DEVICE Run find_run(const int32_t* sorted, int count, int32_t value) {
  return {lower_bound(sorted, count, value), lower_bound(sorted, count, value + 1)};
}

// The hashes [begin, end) of sequence b that a chunk of (sequence, hash) pairs [first_pair, end_pair) holds.
struct HashRange {
  int64_t begin, end;
};

YOSO_DEVICE HashRange chunk_hashes(int64_t b, int64_t m, int64_t first_pair, int64_t end_pair) {
  return {first_pair > b * m ? first_pair - b * m : 0, end_pair < (b + 1) * m ? end_pair - b * m : m};
}

// The code at codes[index], trapped unless it is a tau-bit code.
YOSO_DEVICE int32_t checked_code(const int32_t* codes, int64_t index, int tau) {
  const int32_t code = load(codes + index);
  YOSO_TRAP(code >= 0 && code < (int32_t(1) << tau));
  return code;
}

// Pairs per chunk: as many as `floats_per_pair` of tables allow within the budget (the workspace and
// the L2 cache), at least one, at most what grid.y holds.
inline int64_t pairs_per_chunk(int64_t total_pairs, int64_t floats_per_pair, int64_t workspace_bytes,
                               int64_t l2_bytes) {
  const int64_t budget = std::min(workspace_bytes, l2_bytes) / 4;
  const int64_t fit = floats_per_pair > 0 ? budget / floats_per_pair : total_pairs;
  return std::max<int64_t>(1, std::min<int64_t>({fit, total_pairs, 65535}));
}

}  // namespace yoso
