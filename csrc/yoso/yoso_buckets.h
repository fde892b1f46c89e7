// The buckets of one (batch element, hash) pair on the CPU: both sides' tokens sorted by code (an
// LSD radix sort, O(n), at most max(2^12, 4n) counters whatever tau), then walked together so that each
// code present on both sides is visited once with its query range and its key range. Every CPU
// kernel works bucket by bucket this way: no table is indexed by code, so memory is O(n) per thread
// at any tau (at most 20 bits), and every sum is taken in one fixed order (bitwise repeatable).
#pragma once

#include <stdint.h>

#include <algorithm>
#include <vector>

namespace yoso {

// Token indices [0, n) sorted by code, stable (equal codes keep their token order): an LSD radix
// sort of (code, index) pairs: one counting pass while 2^tau counters are few (tau <= 12, or at
// most 4 per token), else two; each pass reads its input in order.
class SortedCodes {
 public:
  // Sorts the tokens whose ``weight`` is not 0 (all of them when ``weight`` is null): padded keys
  // never enter a bucket.
  void sort(const int32_t* codes, int64_t n, int tau, const float* weight = nullptr) {
    const int32_t* in_codes = codes;
    const int32_t* in_order = nullptr;
    if (weight != nullptr) {
      kept_codes_.clear();
      kept_order_.clear();
      for (int64_t i = 0; i < n; ++i) {
        if (weight[i] != 0.0f) {
          kept_codes_.push_back(codes[i]);
          kept_order_.push_back(static_cast<int32_t>(i));
        }
      }
      n = static_cast<int64_t>(kept_codes_.size());
      in_codes = kept_codes_.data();
      in_order = kept_order_.data();
    }
    order_.resize(n);
    codes_.resize(n);
    if (tau <= 12 || (int64_t(1) << tau) <= 4 * n) {  // the counters stay small next to the tokens
      pass(in_codes, in_order, n, 0, tau, codes_.data(), order_.data());
      return;
    }
    scratch_codes_.resize(n);
    scratch_order_.resize(n);
    const int low = tau / 2;
    pass(in_codes, in_order, n, 0, low, scratch_codes_.data(), scratch_order_.data());
    pass(scratch_codes_.data(), scratch_order_.data(), n, low, tau - low, codes_.data(), order_.data());
  }
  const int32_t* order() const { return order_.data(); }
  const int32_t* codes() const { return codes_.data(); }
  int64_t size() const { return static_cast<int64_t>(order_.size()); }

 private:
  // One stable counting pass on bits [shift, shift + bits) of the codes (in_order null: the identity).
  void pass(const int32_t* in_codes, const int32_t* in_order, int64_t n, int shift, int bits, int32_t* out_codes,
            int32_t* out_order) {
    const int32_t mask = (int32_t(1) << bits) - 1;
    counts_.assign((size_t(1) << bits) + 1, 0);
    for (int64_t r = 0; r < n; ++r) ++counts_[((in_codes[r] >> shift) & mask) + 1];
    for (size_t c = 1; c < counts_.size(); ++c) counts_[c] += counts_[c - 1];
    for (int64_t r = 0; r < n; ++r) {
      const int32_t code = in_codes[r];
      const int32_t at = counts_[(code >> shift) & mask]++;
      out_codes[at] = code;
      out_order[at] = in_order ? in_order[r] : static_cast<int32_t>(r);
    }
  }

  std::vector<int32_t> order_, codes_, scratch_order_, scratch_codes_, kept_codes_, kept_order_, counts_;
};

// Calls visit(q_first, q_count, k_first, k_count) for every code present among both the queries and
// the keys: ranges into queries.order() and keys.order(), in increasing code order.
template <typename Visit>
void for_each_bucket(const SortedCodes& queries, const SortedCodes& keys, Visit&& visit) {
  const int32_t *qc = queries.codes(), *kc = keys.codes();
  const int64_t nq = queries.size(), nk = keys.size();
  int64_t a = 0, b = 0;
  while (a < nq && b < nk) {
    if (qc[a] < kc[b]) {
      ++a;
    } else if (kc[b] < qc[a]) {
      ++b;
    } else {
      const int32_t code = qc[a];
      int64_t a_end = a, b_end = b;
      while (a_end < nq && qc[a_end] == code) ++a_end;
      while (b_end < nk && kc[b_end] == code) ++b_end;
      visit(a, a_end - a, b, b_end - b);
      a = a_end;
      b = b_end;
    }
  }
}

}  // namespace yoso
