// CPU kernels of YOSO's backward, bucket by bucket (yoso_buckets.h), one batch element per task:
//
//   exact_weight_backward(codes_q, codes_k, q [B,nq,d], k [B,nk,d], v [B,nk,dv], key_weight [B,nk],
//                         grad [B,nq,dv], tau)        -> (grad_q [B,nq,d], grad_k [B,nk,d], grad_v [B,nk,dv])
//     the lower-bound backward of the paper's eq. 4 with every colliding pair's exact weight:
//     grad_q_i = (tau / 2m) sum_h sum_{j in bucket_h(i)} w_j (g_i . v_j) k_j, grad_k_j symmetric in q_i,
//     and grad_v_j = (w_j / m) sum_h sum_{i in bucket_h(j)} g_i, from the same buckets.
//     A bucket with few pairs is enumerated pair by pair, O(|Q||K|(dv + 2d)); a heavy one goes through
//     its dv x d tables M = sum_j w_j v_j k_j^T and N = sum_i g_i q_i^T, O((|Q| + |K|) dv d), whichever
//     is cheaper, so no bucket costs more than linear work.
//   pair_gradient(codes_s, codes_o, a [B,ns,d], o [B,no,d], s [B,ns,dv], w [B,no,dv], mask_o [B,no], tau,
//                 clamp)                                              -> [B,ns,d]
//     the exact-derivative estimate ("*YOSO", eq. 3): (1/m) sum_h sum_{o colliding} mask_o (s_s . w_o)
//     rho(a_s . o_o) o_o. Its weight is not bilinear, so every colliding pair is enumerated.
// Each output row is written by one task in a fixed order: the results are bitwise repeatable.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <tuple>
#include <vector>

#include "yoso_buckets.h"
#include "yoso_math.h"

namespace {

struct ExactArgs {
  const int32_t *cq, *ck;
  const float *q, *k, *v, *w, *g;
  float *gq, *gk, *gv;
  int64_t nq, nk, d, dv, m, tau;
  float scale;
};

inline void prefetch_row(const float* row, int64_t floats) {
  for (int64_t f = 0; f < floats; f += 16) __builtin_prefetch(row + f);  // every 64-byte line
}

// One batch element, every hash. Each token's operands are packed into one row first, [g_i | q_i]
// for a query and [w_j v_j | k_j] for a real key (padded keys enter no bucket), so a colliding pair
// touches two rows of contiguous memory: the pairs come in bucket order, at random positions of
// the sequence, and their cost is the memory latency of those rows more than the arithmetic. D,
// DV > 0 fix the head and value dims at compile time (32 and 64), so the dot products vectorize.
template <int D, int DV>
void exact_batch(const ExactArgs& a, int64_t b, yoso::SortedCodes& queries, yoso::SortedCodes& keys,
                 std::vector<float>& table, std::vector<float>& packed_q, std::vector<float>& packed_k) {
  const int64_t d = D > 0 ? D : a.d, dv = DV > 0 ? DV : a.dv, nq = a.nq, nk = a.nk, width = d + dv;
  const float *qb = a.q + b * nq * d, *kb = a.k + b * nk * d, *vb = a.v + b * nk * dv, *gb = a.g + b * nq * dv;
  const float* wb = a.w + b * nk;
  float *gqb = a.gq + b * nq * d, *gkb = a.gk + b * nk * d, *gvb = a.gv + b * nk * dv;
  const float scale = a.scale, inv_m = 1.0f / static_cast<float>(a.m);
  packed_q.resize(nq * width);
  packed_k.resize(nk * width);
  for (int64_t i = 0; i < nq; ++i) {
    std::copy(gb + i * dv, gb + (i + 1) * dv, packed_q.data() + i * width);
    std::copy(qb + i * d, qb + (i + 1) * d, packed_q.data() + i * width + dv);
  }
  for (int64_t j = 0; j < nk; ++j) {
    for (int64_t l = 0; l < dv; ++l) packed_k[j * width + l] = wb[j] * vb[j * dv + l];
    std::copy(kb + j * d, kb + (j + 1) * d, packed_k.data() + j * width + dv);
  }
  const float *QG = packed_q.data(), *VK = packed_k.data();
  // One side of a heavy bucket through its dv x d table: T = sum over `own` members of row[:dv] row[dv:]^T
  // (the packed rows: [w_j v_j | k_j] or [g_i | q_i]), then each `other` member's gradient row (in
  // `out`, d floats a token) += scale other_row[:dv]^T T.
  auto through_table = [&](const float* own, const int32_t* own_members, int64_t own_count, const float* other,
                           const int32_t* other_members, int64_t other_count, float* out) {
    float* T = table.data();
    std::fill(T, T + dv * d, 0.0f);
    for (int64_t s = 0; s < own_count; ++s) {
      const float *left = own + own_members[s] * width, *right = left + dv;
      for (int64_t l = 0; l < dv; ++l) {
        for (int64_t e = 0; e < d; ++e) T[l * d + e] += left[l] * right[e];
      }
    }
    for (int64_t r = 0; r < other_count; ++r) {
      const int64_t t = other_members[r];
      const float* c = other + t * width;
      float* out_t = out + t * d;
      for (int64_t l = 0; l < dv; ++l) {
        const float x = scale * c[l];
        for (int64_t e = 0; e < d; ++e) out_t[e] += x * T[l * d + e];
      }
    }
  };
  constexpr int64_t kAhead = 4;  // buckets are prefetched this many sorted positions ahead
  for (int64_t h = 0; h < a.m; ++h) {
    queries.sort(a.cq + (b * a.m + h) * nq, nq, static_cast<int>(a.tau));
    keys.sort(a.ck + (b * a.m + h) * nk, nk, static_cast<int>(a.tau), wb);
    const int64_t sq = queries.size(), sk = keys.size();
    yoso::for_each_bucket(queries, keys, [&](int64_t qa, int64_t qn, int64_t ka, int64_t kn) {
      const int32_t *qi = queries.order() + qa, *kj = keys.order() + ka;
      if (qa + kAhead < sq) prefetch_row(QG + queries.order()[qa + kAhead] * width, width);
      if (ka + kAhead < sk) prefetch_row(VK + keys.order()[ka + kAhead] * width, width);
      // ∇V_j = (w_j / m) sum_{i in the bucket} g_i
      float* gsum = table.data();
      std::fill(gsum, gsum + dv, 0.0f);
      for (int64_t r = 0; r < qn; ++r) {
        const float* g_i = QG + qi[r] * width;
        for (int64_t l = 0; l < dv; ++l) gsum[l] += g_i[l];
      }
      for (int64_t s = 0; s < kn; ++s) {
        const float weight = inv_m * wb[kj[s]];
        float* gv_j = gvb + kj[s] * dv;
        for (int64_t l = 0; l < dv; ++l) gv_j[l] += weight * gsum[l];
      }
      if (!yoso::heavy_bucket(qn, kn, d, dv)) {  // few pairs: one by one
        for (int64_t r = 0; r < qn; ++r) {
          const int64_t i = qi[r];
          const float *g_i = QG + i * width, *q_i = g_i + dv;
          float* gq_i = gqb + i * d;
          for (int64_t s = 0; s < kn; ++s) {
            const int64_t j = kj[s];
            const float *v_j = VK + j * width, *k_j = v_j + dv;
            float dot = 0.0f;
            for (int64_t l = 0; l < dv; ++l) dot += g_i[l] * v_j[l];
            const float c = scale * dot;
            float* gk_j = gkb + j * d;
            for (int64_t e = 0; e < d; ++e) gq_i[e] += c * k_j[e];
            for (int64_t e = 0; e < d; ++e) gk_j[e] += c * q_i[e];
          }
        }
        return;
      }
      // A heavy bucket: M = sum_j w_j v_j k_j^T, then grad_q_i += scale g_i^T M; and N = sum_i g_i q_i^T,
      // then grad_k_j += scale w_j v_j^T N.
      through_table(VK, kj, kn, QG, qi, qn, gqb);
      through_table(QG, qi, qn, VK, kj, kn, gkb);
    });
  }
}

template <int D, int DV>
void exact_all(const ExactArgs& a, int64_t B) {
  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
    yoso::SortedCodes queries, keys;
    std::vector<float> table(std::max<int64_t>(a.dv * a.d, a.dv)), packed_q, packed_k;
    for (int64_t b = begin; b < end; ++b) exact_batch<D, DV>(a, b, queries, keys, table, packed_q, packed_k);
  });
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> exact_weight_backward_cpu(
    const at::Tensor& codes_q, const at::Tensor& codes_k, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& key_weight, const at::Tensor& grad, int64_t tau) {
  const int64_t B = q.size(0), d = q.size(2), dv = v.size(2), m = codes_q.size(1);
  auto grad_q = at::zeros_like(q), grad_k = at::zeros_like(k), grad_v = at::zeros_like(v);
  const ExactArgs args{codes_q.data_ptr<int32_t>(), codes_k.data_ptr<int32_t>(), q.data_ptr<float>(),
                       k.data_ptr<float>(), v.data_ptr<float>(), key_weight.data_ptr<float>(), grad.data_ptr<float>(),
                       grad_q.data_ptr<float>(), grad_k.data_ptr<float>(), grad_v.data_ptr<float>(), q.size(1),
                       k.size(1), d, dv, m, tau,
                       static_cast<float>(tau) / (2.0f * static_cast<float>(m))};
  if (d == 32 && dv == 32) {
    exact_all<32, 32>(args, B);
  } else if (d == 64 && dv == 64) {
    exact_all<64, 64>(args, B);
  } else {
    exact_all<0, 0>(args, B);
  }
  return {grad_q, grad_k, grad_v};
}

at::Tensor pair_gradient_cpu(const at::Tensor& codes_s, const at::Tensor& codes_o, const at::Tensor& a,
                             const at::Tensor& o, const at::Tensor& s, const at::Tensor& w, const at::Tensor& mask_o,
                             int64_t tau, double clamp) {
  const int64_t B = a.size(0), ns = a.size(1), d = a.size(2), no = o.size(1), dv = s.size(2), m = codes_s.size(1);
  auto result = at::zeros({B, ns, d}, a.options());
  const int32_t *cs = codes_s.data_ptr<int32_t>(), *co = codes_o.data_ptr<int32_t>();
  const float *as = a.data_ptr<float>(), *os = o.data_ptr<float>(), *ss = s.data_ptr<float>();
  const float *ws = w.data_ptr<float>(), *ms = mask_o.data_ptr<float>();
  float* out = result.data_ptr<float>();
  const float inv_m = 1.0f / static_cast<float>(m);
  const float limit = static_cast<float>(clamp);
  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
    yoso::SortedCodes side_s, side_o;
    for (int64_t b = begin; b < end; ++b) {
      for (int64_t h = 0; h < m; ++h) {
        side_s.sort(cs + (b * m + h) * ns, ns, static_cast<int>(tau));
        side_o.sort(co + (b * m + h) * no, no, static_cast<int>(tau));
        yoso::for_each_bucket(side_s, side_o, [&](int64_t sa, int64_t sn, int64_t oa, int64_t on) {
          for (int64_t r = 0; r < sn; ++r) {
            const int64_t i = side_s.order()[sa + r];
            const float *ai = as + (b * ns + i) * d, *si = ss + (b * ns + i) * dv;
            float* gi = out + (b * ns + i) * d;
            for (int64_t t = 0; t < on; ++t) {
              const int64_t j = side_o.order()[oa + t];
              const float mask = ms[b * no + j];
              if (mask == 0.0f) continue;
              const float* oj = os + (b * no + j) * d;
              const float coefficient = mask * inv_m * yoso::pair_weight(ai, oj, si, ws + (b * no + j) * dv,
                                                                         static_cast<int>(d), static_cast<int>(dv),
                                                                         static_cast<int>(tau), limit);
              for (int64_t l = 0; l < d; ++l) gi[l] += coefficient * oj[l];
            }
          }
        });
      }
    }
  });
  return result;
}
