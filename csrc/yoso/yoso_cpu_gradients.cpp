// CPU kernels of YOSO's backward, bucket by bucket (yoso_buckets.h), one batch element per task:
//
//   exact_weight_backward(codes_q, codes_k, q [B,nq,d], k [B,nk,d], v [B,nk,dv], key_weight [B,nk],
//                         grad [B,nq,dv], tau)        -> (grad_q [B,nq,d], grad_k [B,nk,d], grad_v [B,nk,dv])
//     the lower-bound backward of the paper's eq. 4 with every colliding pair's exact weight:
//     grad_q_i = (tau / 2m) sum_h sum_{j in bucket_h(i)} w_j (g_i . v_j) k_j, grad_k_j symmetric in q_i,
//     and grad_v_j = (w_j / m) sum_h sum_{i in bucket_h(j)} g_i, from the same buckets.
//     With `normalize`, q and k are rows of any length: the estimator is taken on their unit rows
//     x / max(|x|, eps) (normalized while they are packed) and grad_q, grad_k are the gradients of the rows
//     given, (g - y (g . y)) / max(|x|, eps) with g . y taken as 0 where |x| < eps (as F.normalize's), applied
//     while the results are unpacked: no pass over memory of its own.
//     A bucket with few pairs is enumerated pair by pair, O(|Q||K|(dv + 2d)); a heavy one goes through
//     its dv x d tables M = sum_j w_j v_j k_j^T and N = sum_i g_i q_i^T, O((|Q| + |K|) dv d), whichever
//     is cheaper, so no bucket costs more than linear work.
//   pair_gradient(codes_s, codes_o, a [B,ns,d], o [B,no,d], s [B,ns,dv], w [B,no,dv], mask_o [B,no], tau,
//                 clamp)                                              -> [B,ns,d]
//     the exact-derivative estimate ("*YOSO", eq. 3): (1/m) sum_h sum_{o colliding} mask_o (s_s . w_o)
//     rho(a_s . o_o) o_o. Its weight is not bilinear, so every colliding pair is enumerated.
// Each output row is written by one task in a fixed order: the results are bitwise repeatable.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>

#include <cmath>
#include <cstring>
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
  bool normalize;
  float eps;
};

// x . y in a fixed order that vectorizes: 16 partial sums, then a tree over them (a plain loop is
// one chain of dependent scalar additions, which a compiler may not reorder without -ffast-math).
typedef float Lanes16 __attribute__((vector_size(16 * sizeof(float))));
typedef float Lanes8 __attribute__((vector_size(8 * sizeof(float))));
typedef float Lanes4 __attribute__((vector_size(4 * sizeof(float))));

template <typename Half, typename Whole>
inline Half fold(const Whole& x) {  // lanes [0, L/2) + lanes [L/2, L)
  Half low, high;
  std::memcpy(&low, &x, sizeof(Half));
  std::memcpy(&high, reinterpret_cast<const char*>(&x) + sizeof(Half), sizeof(Half));
  return low + high;
}

template <int N>
inline float dot(const float* x, const float* y, int64_t n_runtime) {
  const int64_t n = N > 0 ? N : n_runtime, whole = n - n % 16;
  Lanes16 partial = {};
  for (int64_t l = 0; l < whole; l += 16) {
    Lanes16 a, b;
    std::memcpy(&a, x + l, sizeof(a));
    std::memcpy(&b, y + l, sizeof(b));
    partial += a * b;
  }
  const Lanes4 four = fold<Lanes4>(fold<Lanes8>(partial));
  float sum = (four[0] + four[2]) + (four[1] + four[3]);
  for (int64_t l = whole; l < n; ++l) sum += x[l] * y[l];
  return sum;
}

// Rows of floats, each starting on a 64-byte line; not cleared between batch elements (every float a
// batch element reads is written first).
struct PackedRows {
  std::vector<float> storage;
  float* rows = nullptr;
  void reset(int64_t count, int64_t width) {
    storage.resize(count * width + 16);
    rows = storage.data() + (16 - (reinterpret_cast<uintptr_t>(storage.data()) / sizeof(float)) % 16) % 16;
  }
};

// Packs a token's operand x (n floats) into `out`: as given, or with `normalize` as its unit row
// x / max(|x|, eps). Returns |x| (summed in double), which unpack_gradient needs, or 0.
inline float pack_operand(const float* x, int64_t n, bool normalize, float eps, float* out) {
  if (!normalize) {
    std::copy(x, x + n, out);
    return 0.0f;
  }
  double squares = 0.0;
  for (int64_t e = 0; e < n; ++e) squares += static_cast<double>(x[e]) * x[e];
  const float norm = static_cast<float>(std::sqrt(squares)), divisor = yoso::unit_row_divisor(norm, eps);
  for (int64_t e = 0; e < n; ++e) out[e] = x[e] / divisor;
  return norm;
}

// Writes a token's gradient from its accumulator g (n floats): as it is, or with `normalize` the
// gradient of the row x whose unit row y was packed (|x| = norm): (g - y (g . y)) / max(|x|, eps), g . y
// taken as 0 where |x| < eps, as F.normalize's.
template <int N>
inline void unpack_gradient(const float* g, const float* y, float norm, bool normalize, float eps, int64_t n_runtime,
                            float* out) {
  const int64_t n = N > 0 ? N : n_runtime;
  if (!normalize) {
    std::copy(g, g + n, out);
    return;
  }
  const float along = yoso::unit_row_along(dot<N>(g, y, n), norm, eps);
  const float divisor = yoso::unit_row_divisor(norm, eps);
  for (int64_t e = 0; e < n; ++e) out[e] = (g[e] - y[e] * along) / divisor;
}

// One batch element, every hash. Each token's operands and its gradient accumulators share one row,
// [g_i | q_i | ∇q_i] for a query and [w_j v_j | k_j | ∇k_j | ∇v_j] for a real key (padded keys enter no
// bucket): the pairs come in bucket order, at random positions of the sequence, so a token touches one
// stretch of memory instead of three. D, DV > 0 fix the head and value dims at compile time (32 and
// 64), so the dot products vectorize.
template <int D, int DV>
void exact_batch(const ExactArgs& a, int64_t b, yoso::SortedCodes& queries, yoso::SortedCodes& keys,
                 std::vector<float>& table, PackedRows& packed_q, PackedRows& packed_k, std::vector<float>& norms) {
  const int64_t d = D > 0 ? D : a.d, dv = DV > 0 ? DV : a.dv, nq = a.nq, nk = a.nk;
  const int64_t width_q = dv + 2 * d, width_k = 2 * dv + 2 * d;
  const int64_t grad_q_at = dv + d, grad_k_at = dv + d, grad_v_at = dv + 2 * d;
  const float *qb = a.q + b * nq * d, *kb = a.k + b * nk * d, *vb = a.v + b * nk * dv, *gb = a.g + b * nq * dv;
  const float* wb = a.w + b * nk;
  float *gqb = a.gq + b * nq * d, *gkb = a.gk + b * nk * d, *gvb = a.gv + b * nk * dv;
  const float scale = a.scale, inv_m = 1.0f / static_cast<float>(a.m);
  packed_q.reset(nq, width_q);
  packed_k.reset(nk, width_k);
  float *QG = packed_q.rows, *VK = packed_k.rows;
  norms.resize(nq + nk);
  float *norm_q = norms.data(), *norm_k = norms.data() + nq;
  for (int64_t i = 0; i < nq; ++i) {
    float* row = QG + i * width_q;
    std::copy(gb + i * dv, gb + (i + 1) * dv, row);
    norm_q[i] = pack_operand(qb + i * d, d, a.normalize, a.eps, row + dv);
    std::fill(row + grad_q_at, row + width_q, 0.0f);
  }
  for (int64_t j = 0; j < nk; ++j) {
    float* row = VK + j * width_k;
    for (int64_t l = 0; l < dv; ++l) row[l] = wb[j] * vb[j * dv + l];
    norm_k[j] = pack_operand(kb + j * d, d, a.normalize, a.eps, row + dv);
    std::fill(row + grad_k_at, row + width_k, 0.0f);
  }
  // One side of a heavy bucket through its dv x d table: T = sum over `own` members of row[:dv] row[dv:dv+d]^T,
  // then each `other` member's accumulator (at `out_at` in its row) += scale other_row[:dv]^T T.
  auto through_table = [&](const float* own, int64_t own_width, const int32_t* own_members, int64_t own_count,
                           float* other, int64_t other_width, const int32_t* other_members, int64_t other_count,
                           int64_t out_at) {
    float* T = table.data();
    std::fill(T, T + dv * d, 0.0f);
    for (int64_t s = 0; s < own_count; ++s) {
      const float *left = own + own_members[s] * own_width, *right = left + dv;
      for (int64_t l = 0; l < dv; ++l) {
        for (int64_t e = 0; e < d; ++e) T[l * d + e] += left[l] * right[e];
      }
    }
    for (int64_t r = 0; r < other_count; ++r) {
      float* c = other + other_members[r] * other_width;
      float* out_t = c + out_at;
      for (int64_t l = 0; l < dv; ++l) {
        const float x = scale * c[l];
        for (int64_t e = 0; e < d; ++e) out_t[e] += x * T[l * d + e];
      }
    }
  };
  for (int64_t h = 0; h < a.m; ++h) {
    queries.sort(a.cq + (b * a.m + h) * nq, nq, static_cast<int>(a.tau));
    keys.sort(a.ck + (b * a.m + h) * nk, nk, static_cast<int>(a.tau), wb);
    yoso::for_each_bucket(queries, keys, [&](int64_t qa, int64_t qn, int64_t ka, int64_t kn) {
      const int32_t *qi = queries.order() + qa, *kj = keys.order() + ka;
      // ∇V_j = (w_j / m) sum_{i in the bucket} g_i
      float* gsum = table.data();
      std::fill(gsum, gsum + dv, 0.0f);
      for (int64_t r = 0; r < qn; ++r) {
        const float* g_i = QG + qi[r] * width_q;
        for (int64_t l = 0; l < dv; ++l) gsum[l] += g_i[l];
      }
      for (int64_t s = 0; s < kn; ++s) {
        const float weight = inv_m * wb[kj[s]];
        float* gv_j = VK + kj[s] * width_k + grad_v_at;
        for (int64_t l = 0; l < dv; ++l) gv_j[l] += weight * gsum[l];
      }
      if (!yoso::heavy_bucket(qn, kn, d, dv)) {  // few pairs: one by one
        for (int64_t r = 0; r < qn; ++r) {
          float* row_i = QG + qi[r] * width_q;
          const float *g_i = row_i, *q_i = row_i + dv;
          float* gq_i = row_i + grad_q_at;
          for (int64_t s = 0; s < kn; ++s) {
            float* row_j = VK + kj[s] * width_k;
            const float *v_j = row_j, *k_j = row_j + dv;
            const float c = scale * dot<DV>(g_i, v_j, dv);
            float* gk_j = row_j + grad_k_at;
            for (int64_t e = 0; e < d; ++e) gq_i[e] += c * k_j[e];
            for (int64_t e = 0; e < d; ++e) gk_j[e] += c * q_i[e];
          }
        }
        return;
      }
      // A heavy bucket: M = sum_j w_j v_j k_j^T, then grad_q_i += scale g_i^T M; and N = sum_i g_i q_i^T,
      // then grad_k_j += scale w_j v_j^T N.
      through_table(VK, width_k, kj, kn, QG, width_q, qi, qn, grad_q_at);
      through_table(QG, width_q, qi, qn, VK, width_k, kj, kn, grad_k_at);
    });
  }
  for (int64_t i = 0; i < nq; ++i) {
    const float* row = QG + i * width_q;
    unpack_gradient<D>(row + grad_q_at, row + dv, norm_q[i], a.normalize, a.eps, d, gqb + i * d);
  }
  for (int64_t j = 0; j < nk; ++j) {
    const float* row = VK + j * width_k;
    unpack_gradient<D>(row + grad_k_at, row + dv, norm_k[j], a.normalize, a.eps, d, gkb + j * d);
    std::copy(row + grad_v_at, row + grad_v_at + dv, gvb + j * dv);
  }
}

template <int D, int DV>
void exact_all(const ExactArgs& a, int64_t B) {
  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
    yoso::SortedCodes queries, keys;
    std::vector<float> table(std::max<int64_t>(a.dv * a.d, a.dv)), norms;
    PackedRows packed_q, packed_k;
    for (int64_t b = begin; b < end; ++b) exact_batch<D, DV>(a, b, queries, keys, table, packed_q, packed_k, norms);
  });
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> exact_weight_backward_cpu(
    const at::Tensor& codes_q, const at::Tensor& codes_k, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& key_weight, const at::Tensor& grad, int64_t tau, bool normalize, double eps) {
  const int64_t B = q.size(0), d = q.size(2), dv = v.size(2), m = codes_q.size(1);
  auto grad_q = at::empty_like(q), grad_k = at::empty_like(k), grad_v = at::empty_like(v);  // every row written
  const ExactArgs args{codes_q.data_ptr<int32_t>(), codes_k.data_ptr<int32_t>(), q.data_ptr<float>(),
                       k.data_ptr<float>(), v.data_ptr<float>(), key_weight.data_ptr<float>(), grad.data_ptr<float>(),
                       grad_q.data_ptr<float>(), grad_k.data_ptr<float>(), grad_v.data_ptr<float>(), q.size(1),
                       k.size(1), d, dv, m, tau,
                       static_cast<float>(tau) / (2.0f * static_cast<float>(m)), normalize, static_cast<float>(eps)};
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
