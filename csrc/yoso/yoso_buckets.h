// The buckets of one (batch element, hash) pair on the CPU: both sides' tokens sorted by code (an
// LSD radix sort, O(n), at most max(2^12, 4n) counters whatever tau), then matched so that each code
// present on both sides is visited once with its query range and its key range. Every CPU kernel
// works bucket by bucket this way: no table is indexed by code beyond those counters, so memory is
// O(n) per thread at any tau (at most 20 bits), and every sum is taken in one fixed order (bitwise
// repeatable).
#pragma once

#include <stdint.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace yoso {

// Token indices [0, n) sorted by code, stable (equal codes keep their token order). While 2^tau
// counters are few (tau <= 12, or at most 4 per token) one counting pass sorts them, and its counters
// are kept: ends()[c] is where code c's range ends in order() ("direct": a code's range is found
// without searching). Otherwise two passes of about tau/2 bits each, and codes() holds the sorted codes.
class SortedCodes {
 public:
  // Sorts the tokens whose ``weight`` is not 0 (all of them when ``weight`` is null): padded keys
  // never enter a bucket.
  void sort(const int32_t* codes, int64_t n, int tau, const float* weight = nullptr) {
    tau_ = tau;
    direct_ = tau <= 12 || (int64_t(1) << tau) <= 4 * n;
    has_codes_ = !direct_;
    if (direct_) {
      ends_.assign((size_t(1) << tau) + 1, 0);
      int32_t* counts = ends_.data() + 1;
      const uint32_t mask = (uint32_t(1) << tau) - 1;
      uint32_t outside = 0;
      for (int64_t i = 0; i < n; ++i) {
        const uint32_t code = static_cast<uint32_t>(codes[i]);
        outside |= code & ~mask;
        if (weight == nullptr || weight[i] != 0.0f) ++counts[code & mask];
      }
      if (outside != 0) out_of_range(tau);
      for (size_t c = 1; c < ends_.size(); ++c) ends_[c] += ends_[c - 1];
      order_.resize(ends_.back());  // the tokens counted: those kept
      for (int64_t i = 0; i < n; ++i) {  // ends_[c] moves from the start of code c's range to its end
        if (weight == nullptr || weight[i] != 0.0f) order_[ends_[codes[i]]++] = static_cast<int32_t>(i);
      }
      return;
    }
    uint32_t outside = 0;
    for (int64_t i = 0; i < n; ++i) outside |= static_cast<uint32_t>(codes[i]) >> tau;
    if (outside != 0) out_of_range(tau);
    const int32_t* in_codes = codes;
    const int32_t* in_order = nullptr;
    int64_t kept = n;
    if (weight != nullptr) {
      kept_codes_.clear();
      kept_order_.clear();
      for (int64_t i = 0; i < n; ++i) {
        if (weight[i] != 0.0f) {
          kept_codes_.push_back(codes[i]);
          kept_order_.push_back(static_cast<int32_t>(i));
        }
      }
      in_codes = kept_codes_.data();
      in_order = kept_order_.data();
      kept = static_cast<int64_t>(kept_codes_.size());
    }
    order_.resize(kept);
    codes_.resize(kept);
    scratch_codes_.resize(kept);
    scratch_order_.resize(kept);
    const int low = tau / 2;
    pass(in_codes, in_order, kept, 0, low, scratch_codes_.data(), scratch_order_.data());
    pass(scratch_codes_.data(), scratch_order_.data(), kept, low, tau - low, codes_.data(), order_.data());
  }
  const int32_t* order() const { return order_.data(); }
  int64_t size() const { return static_cast<int64_t>(order_.size()); }
  int tau() const { return tau_; }
  bool direct() const { return direct_; }
  const int32_t* ends() const { return ends_.data(); }  // direct only: code c is [ends[c-1] (0 for c = 0), ends[c])
  // The sorted codes (rebuilt from the counters when direct, for matching against a side that is not).
  const int32_t* codes() {
    if (!has_codes_) {
      codes_.resize(order_.size());
      for (size_t c = 0, at = 0; c + 1 < ends_.size(); ++c) {
        for (; at < static_cast<size_t>(ends_[c]); ++at) codes_[at] = static_cast<int32_t>(c);
      }
      has_codes_ = true;
    }
    return codes_.data();
  }

 private:
  [[noreturn]] static void out_of_range(int tau) {
    const std::string bits = std::to_string(tau);
    throw std::invalid_argument("yoso: every hash code must lie in [0, 2^" + bits + "), the range of tau = " + bits +
                                " bits; pass the tau the codes were made with");
  }

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

  int tau_ = 0;
  bool direct_ = false, has_codes_ = false;
  std::vector<int32_t> order_, codes_, ends_, scratch_order_, scratch_codes_, kept_codes_, kept_order_, counts_;
};

// Calls visit(q_first, q_count, k_first, k_count) for every code present among both the queries and
// the keys: ranges into queries.order() and keys.order(), in increasing code order. Two direct sides
// are matched code by code through their counters: the codes present on both are listed first
// without a branch per code, so the walk costs no mispredicted branches; otherwise the sorted codes
// are merged.
template <typename Visit>
void for_each_bucket(SortedCodes& queries, SortedCodes& keys, Visit&& visit) {
  if (queries.direct() && keys.direct() && queries.tau() == keys.tau()) {
    static thread_local std::vector<int32_t> matched;
    const int32_t *qe = queries.ends(), *ke = keys.ends();
    const int32_t codes = int32_t(1) << queries.tau();
    matched.resize(codes);
    int32_t count = 0, q_start = 0, k_start = 0;
    for (int32_t c = 0; c < codes; ++c) {
      matched[count] = c;
      count += (qe[c] != q_start) & (ke[c] != k_start);
      q_start = qe[c];
      k_start = ke[c];
    }
    for (int32_t r = 0; r < count; ++r) {
      const int32_t c = matched[r];
      const int64_t qa = c ? qe[c - 1] : 0, ka = c ? ke[c - 1] : 0;
      visit(qa, qe[c] - qa, ka, ke[c] - ka);
    }
    return;
  }
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
