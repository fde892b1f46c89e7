// CPU kernels of YOSO attention's forward, and the Python bindings of every CPU kernel and (when
// compiled with -DYOSO_WITH_CUDA) the CUDA ones. Shapes: B = batch·heads, m hashes, n tokens, tau bits.
//
//   fast_hash(x [B,n,d], diagonals [B,R,3,P], m, tau)            -> codes [B,m,n] int32
//   cumulation(codes_q [B,m,nq], codes_k [B,m,nk], weight_q [B,1|m,p,nq], weight_k [B,1|m,p,nk],
//              values [B,nk,dv], tau, workspace_bytes)           -> [B,nq,dv]
//     = (1/m) sum_h sum_t weight_q[h,t,i] T_h[code_q(i), t],  T_h[c, t] = sum_{code_k(j)=c} weight_k[h,t,j] v_j
//   exact_weight_backward, pair_gradient: the backward (yoso_cpu_gradients.cpp)
// The cumulation walks each (batch, hash) pair's buckets (yoso_buckets.h): no table is indexed by
// code, so memory is O(n) per thread at any tau, and every sum has one fixed order.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/utils/pybind.h>  // pybind11 and its at::Tensor casters: not torch/extension.h, 3x the parse

#include <algorithm>
#include <cstring>
#include <tuple>
#include <vector>

#include "yoso_buckets.h"
#include "yoso_checks.h"
#include "yoso_math.h"

namespace {

constexpr int64_t kLanes = 16;  // tokens hashed together, one per SIMD lane (an AVX-512 register)
// One value per lane: GCC/Clang vector types, lowered to whatever vector unit -march names (one zmm,
// two ymm, four NEON registers), so the butterflies below are whole-vector operations.
typedef float LaneFloats __attribute__((vector_size(kLanes * sizeof(float))));
typedef int32_t LaneInts __attribute__((vector_size(kLanes * sizeof(int32_t))));

// Codes of up to kLanes tokens of one batch element: each padded vector through H D3 H D2 H D1 per
// product, token t of the group in lane t. The tokens are transposed once into `xt` (one vector per
// coordinate); each product works on `y`, SIZE vectors that stay in registers where SIZE > 0 fixes
// the padded dimension at compile time (0: read from `size`, `y` in memory). The butterflies pair
// positions p and p + h for h = 1, 2, 4, ... exactly as the PyTorch path does (identical codes).
template <int SIZE>
void hash_tokens(const float* x, int64_t lanes, const float* diagonals, int32_t* codes, int64_t size, int64_t d,
                 int64_t R, int64_t m, int64_t n, int64_t tau, LaneFloats* xt, LaneFloats* heap_y, LaneInts* bits) {
  const int64_t P = SIZE > 0 ? SIZE : size;
  for (int64_t t = 0; t < P; ++t) {
    LaneFloats column = {};
    if (t < d) {
      for (int64_t l = 0; l < lanes; ++l) column[l] = x[l * d + t];
    }
    xt[t] = column;
  }
  LaneFloats local_y[SIZE > 0 ? SIZE : 1];
  LaneFloats* y = SIZE > 0 ? local_y : heap_y;
  const LaneInts zero_bits = {};
  for (int64_t c = 0; c < P; ++c) bits[c] = zero_bits;  // the codes of the current group of P hashes
  for (int64_t r = 0; r < R; ++r) {
    const float* diag = diagonals + r * 3 * P;
    for (int64_t t = 0; t < P; ++t) y[t] = xt[t] * diag[t];
    for (int stage = 0; stage < 3; ++stage) {
      if (stage > 0) {
        for (int64_t t = 0; t < P; ++t) y[t] *= diag[stage * P + t];
      }
      for (int64_t half = 1; half < P; half *= 2) {
        for (int64_t base = 0; base < P; base += 2 * half) {
          for (int64_t p = base; p < base + half; ++p) {
            const LaneFloats u = y[p], v = y[p + half];
            y[p] = u + v;
            y[p + half] = u - v;
          }
        }
      }
    }
    // Product r = g·tau + t gives bit t of hashes g·P … g·P + P − 1 (one coordinate each); a group's
    // codes are gathered in `bits` and written once, after its last bit.
    const int64_t group = r / tau, bit = r % tau;
    const LaneInts bit_value = zero_bits + (int32_t(1) << bit);
    for (int64_t c = 0; c < P; ++c) bits[c] |= (y[c] > 0.0f) & bit_value;
    if (bit == tau - 1 || r == R - 1) {
      for (int64_t c = 0; c < P && group * P + c < m; ++c) {
        int32_t* out = codes + (group * P + c) * n;
        if (lanes == kLanes) {
          std::memcpy(out, &bits[c], sizeof(LaneInts));
        } else {
          for (int64_t l = 0; l < lanes; ++l) out[l] = bits[c][l];
        }
      }
      for (int64_t c = 0; c < P; ++c) bits[c] = zero_bits;
    }
  }
}

at::Tensor fast_hash_cpu(const at::Tensor& x, const at::Tensor& diagonals, int64_t m, int64_t tau) {
  const int64_t B = x.size(0), n = x.size(1), d = x.size(2);
  const int64_t R = diagonals.size(1), P = diagonals.size(3);
  auto codes = at::empty({B, m, n}, x.options().dtype(at::kInt));  // every code is written
  const float* xs = x.data_ptr<float>();
  const float* ds = diagonals.data_ptr<float>();
  int32_t* out = codes.data_ptr<int32_t>();
  auto hash = P == 16 ? &hash_tokens<16> : P == 32 ? &hash_tokens<32> : P == 64 ? &hash_tokens<64>
            : P == 128 ? &hash_tokens<128> : &hash_tokens<0>;
  const int64_t groups = (n + kLanes - 1) / kLanes;
  at::parallel_for(0, B * groups, 8, [&](int64_t begin, int64_t end) {
    std::vector<LaneFloats> xt(P), y(P);
    std::vector<LaneInts> bits(P);
    for (int64_t group = begin; group < end; ++group) {
      const int64_t b = group / groups, i = (group % groups) * kLanes;
      hash(xs + (b * n + i) * d, std::min(kLanes, n - i), ds + b * R * 3 * P, out + b * m * n + i, P, d, R, m, n,
           tau, xt.data(), y.data(), bits.data());
    }
  });
  return codes;
}

struct CumulationArgs {
  const int32_t *cq, *ck;
  const float *wq, *wk, *v;
  float* out;
  int64_t B, m, nq, nk, dv, p, mq, mk, tau;
};

// One batch element, every hash, bucket by bucket: the bucket's row T[t] = sum_j weight_k[t,j] v_j (p
// channels of dv), then each of its queries adds (1/m) sum_t weight_q[t,i] T[t]. DV > 0 fixes the
// value dimension at compile time (the common head dims), so a query's sum stays in registers.
template <int DV>
void cumulate_batch(const CumulationArgs& a, int64_t b, yoso::SortedCodes& queries, yoso::SortedCodes& keys,
                    float* row, float* scratch) {
  const int64_t dv = DV > 0 ? DV : a.dv;
  const float inv_m = 1.0f / static_cast<float>(a.m);
  float fixed[DV > 0 ? DV : 1];
  float* sum = DV > 0 ? fixed : scratch;
  float* out_b = a.out + b * a.nq * dv;
  for (int64_t h = 0; h < a.m; ++h) {
    const float* wqh = a.wq + (b * a.mq + (a.mq == 1 ? 0 : h)) * a.p * a.nq;
    const float* wkh = a.wk + (b * a.mk + (a.mk == 1 ? 0 : h)) * a.p * a.nk;
    queries.sort(a.cq + (b * a.m + h) * a.nq, a.nq, static_cast<int>(a.tau));
    keys.sort(a.ck + (b * a.m + h) * a.nk, a.nk, static_cast<int>(a.tau));
    yoso::for_each_bucket(queries, keys, [&](int64_t qa, int64_t qn, int64_t ka, int64_t kn) {
      std::fill(row, row + a.p * dv, 0.0f);
      for (int64_t s = 0; s < kn; ++s) {
        const int64_t j = keys.order()[ka + s];
        const float* vj = a.v + (b * a.nk + j) * dv;
        for (int64_t t = 0; t < a.p; ++t) {
          const float weight = wkh[t * a.nk + j];
          if (weight == 0.0f) continue;
          float* cell = row + t * dv;
          for (int64_t l = 0; l < dv; ++l) cell[l] += weight * vj[l];
        }
      }
      for (int64_t r = 0; r < qn; ++r) {
        const int64_t i = queries.order()[qa + r];
        std::fill(sum, sum + dv, 0.0f);
        for (int64_t t = 0; t < a.p; ++t) {
          const float weight = wqh[t * a.nq + i];
          if (weight == 0.0f) continue;
          const float* cell = row + t * dv;
          for (int64_t l = 0; l < dv; ++l) sum[l] += weight * cell[l];
        }
        float* yi = out_b + i * dv;
        for (int64_t l = 0; l < dv; ++l) yi[l] += inv_m * sum[l];
      }
    });
  }
}

// The same with one weight channel (the forward and ∇V): keys of weight 0 enter no bucket, and a
// bucket's row, sum_j w_j v_j, reaches each of its queries scaled by w_i / m.
template <int DV>
void cumulate_single(const CumulationArgs& a, int64_t b, yoso::SortedCodes& queries, yoso::SortedCodes& keys,
                     float* row) {
  const int64_t dv = DV > 0 ? DV : a.dv;
  const float inv_m = 1.0f / static_cast<float>(a.m);
  float* out_b = a.out + b * a.nq * dv;
  const float* vb = a.v + b * a.nk * dv;
  for (int64_t h = 0; h < a.m; ++h) {
    const float* wqh = a.wq + (b * a.mq + (a.mq == 1 ? 0 : h)) * a.nq;
    const float* wkh = a.wk + (b * a.mk + (a.mk == 1 ? 0 : h)) * a.nk;
    queries.sort(a.cq + (b * a.m + h) * a.nq, a.nq, static_cast<int>(a.tau), wqh);
    keys.sort(a.ck + (b * a.m + h) * a.nk, a.nk, static_cast<int>(a.tau), wkh);
    yoso::for_each_bucket(queries, keys, [&](int64_t qa, int64_t qn, int64_t ka, int64_t kn) {
      const int32_t *qi = queries.order() + qa, *kj = keys.order() + ka;
      std::fill(row, row + dv, 0.0f);
      for (int64_t s = 0; s < kn; ++s) {
        const float weight = wkh[kj[s]];
        const float* vj = vb + kj[s] * dv;
        for (int64_t l = 0; l < dv; ++l) row[l] += weight * vj[l];
      }
      for (int64_t r = 0; r < qn; ++r) {
        const float weight = inv_m * wqh[qi[r]];
        float* yi = out_b + qi[r] * dv;
        for (int64_t l = 0; l < dv; ++l) yi[l] += weight * row[l];
      }
    });
  }
}

template <int DV>
void cumulate_all(const CumulationArgs& a) {
  at::parallel_for(0, a.B, 1, [&](int64_t begin, int64_t end) {
    yoso::SortedCodes queries, keys;
    std::vector<float> row(a.p * a.dv), scratch(a.dv);
    for (int64_t b = begin; b < end; ++b) {
      if (a.p == 1) {
        cumulate_single<DV>(a, b, queries, keys, row.data());
      } else {
        cumulate_batch<DV>(a, b, queries, keys, row.data(), scratch.data());
      }
    }
  });
}

at::Tensor cumulation_cpu(const at::Tensor& codes_q, const at::Tensor& codes_k, const at::Tensor& weight_q,
                          const at::Tensor& weight_k, const at::Tensor& values, int64_t tau) {
  const int64_t B = values.size(0), nk = values.size(1), dv = values.size(2);
  const int64_t m = codes_q.size(1), nq = codes_q.size(2), p = weight_q.size(2);
  auto result = at::zeros({B, nq, dv}, values.options());
  const CumulationArgs args{codes_q.data_ptr<int32_t>(), codes_k.data_ptr<int32_t>(), weight_q.data_ptr<float>(),
                            weight_k.data_ptr<float>(), values.data_ptr<float>(), result.data_ptr<float>(),
                            B, m, nq, nk, dv, p, weight_q.size(1), weight_k.size(1), tau};
  if (dv == 32) {
    cumulate_all<32>(args);
  } else if (dv == 64) {
    cumulate_all<64>(args);
  } else {
    cumulate_all<0>(args);
  }
  return result;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> exact_weight_backward_cpu(
    const at::Tensor& codes_q, const at::Tensor& codes_k, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& key_weight, const at::Tensor& grad, int64_t tau, bool normalize, double eps);
at::Tensor pair_gradient_cpu(const at::Tensor& codes_s, const at::Tensor& codes_o, const at::Tensor& a,
                             const at::Tensor& o, const at::Tensor& s, const at::Tensor& w, const at::Tensor& mask_o,
                             int64_t tau, double clamp);

#ifdef YOSO_WITH_CUDA
at::Tensor fast_hash_cuda(const at::Tensor& x, const at::Tensor& diagonals, int64_t m, int64_t tau);
at::Tensor cumulation_cuda(const at::Tensor& codes_q, const at::Tensor& codes_k, const at::Tensor& weight_q,
                           const at::Tensor& weight_k, const at::Tensor& values, int64_t tau, int64_t workspace_bytes);
std::tuple<at::Tensor, at::Tensor, at::Tensor> exact_weight_backward_cuda(
    const at::Tensor& codes_q, const at::Tensor& codes_k, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& key_weight, const at::Tensor& grad, int64_t tau, int64_t workspace_bytes, bool normalize,
    double eps, bool bf16_units);
at::Tensor pair_gradient_cuda(const at::Tensor& codes_s, const at::Tensor& codes_o, const at::Tensor& a,
                              const at::Tensor& o, const at::Tensor& s, const at::Tensor& w, const at::Tensor& mask_o,
                              int64_t tau, double clamp);
std::tuple<at::Tensor, at::Tensor> unit_rows_cuda(const at::Tensor& x, double eps);
at::Tensor through_unit_rows_cuda(const at::Tensor& grad, const at::Tensor& unit, const at::Tensor& norms, double eps);
#endif

namespace {

// Why the CPU kernels refuse bfloat16 rows, and who widens them.
constexpr const char* kCpuRows = "the CPU kernels read float32 rows; attention_zoo widens bfloat16 ones";

void require_cpu(const at::Tensor& t) {
  YOSO_CHECK(t.is_cpu(), "yoso: this build has no CUDA kernels; got a ", t.device(), " tensor");
}

at::Tensor fast_hash(const at::Tensor& x, const at::Tensor& diagonals, int64_t m, int64_t tau) {
  yoso::validate_hash(x, diagonals, m, tau);
#ifdef YOSO_WITH_CUDA
  if (x.is_cuda()) return fast_hash_cuda(x, diagonals, m, tau);
#endif
  require_cpu(x);
  return fast_hash_cpu(x, diagonals, m, tau);
}

at::Tensor cumulation(const at::Tensor& codes_q, const at::Tensor& codes_k, const at::Tensor& weight_q,
                      const at::Tensor& weight_k, const at::Tensor& values, int64_t tau, int64_t workspace_bytes) {
  yoso::validate_cumulation(codes_q, codes_k, weight_q, weight_k, values, tau);
#ifdef YOSO_WITH_CUDA
  if (values.is_cuda()) return cumulation_cuda(codes_q, codes_k, weight_q, weight_k, values, tau, workspace_bytes);
#endif
  require_cpu(values);
  yoso::require_float32({{&values, "values"}}, kCpuRows);
  return cumulation_cpu(codes_q, codes_k, weight_q, weight_k, values, tau);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> exact_weight_backward(
    const at::Tensor& codes_q, const at::Tensor& codes_k, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
    const at::Tensor& key_weight, const at::Tensor& grad, int64_t tau, int64_t workspace_bytes, bool normalize,
    double eps, bool bf16_units) {
  yoso::validate_exact_weights(codes_q, codes_k, q, k, v, key_weight, grad, tau);
  YOSO_CHECK(!bf16_units || normalize, "yoso: bf16_units rounds the unit rows the backward makes (normalize=True)");
#ifdef YOSO_WITH_CUDA
  if (q.is_cuda()) {
    return exact_weight_backward_cuda(codes_q, codes_k, q, k, v, key_weight, grad, tau, workspace_bytes, normalize,
                                      eps, bf16_units);
  }
#endif
  require_cpu(q);
  YOSO_CHECK(!bf16_units, "yoso: the CPU kernels read float32 rows: bf16_units is for the CUDA kernels "
              "(attention_zoo rounds and widens the unit rows for the CPU)");
  yoso::require_float32({{&q, "q"}, {&k, "k"}, {&v, "v"}, {&grad, "grad"}}, kCpuRows);
  return exact_weight_backward_cpu(codes_q, codes_k, q, k, v, key_weight, grad, tau, normalize, eps);
}

at::Tensor pair_gradient(const at::Tensor& codes_s, const at::Tensor& codes_o, const at::Tensor& a,
                         const at::Tensor& o, const at::Tensor& s, const at::Tensor& w, const at::Tensor& mask_o,
                         int64_t tau, double clamp) {
  yoso::validate_pair_gradient(codes_s, codes_o, a, o, s, w, mask_o, tau);
#ifdef YOSO_WITH_CUDA
  if (a.is_cuda()) return pair_gradient_cuda(codes_s, codes_o, a, o, s, w, mask_o, tau, clamp);
#endif
  require_cpu(a);
  return pair_gradient_cpu(codes_s, codes_o, a, o, s, w, mask_o, tau, clamp);
}

// The output's normalization is a CUDA kernel pair; off CUDA attention_zoo normalizes with PyTorch.
constexpr const char* kUnitRowsOnCuda = "yoso: unit_rows and through_unit_rows take CUDA tensors (attention_zoo "
                                        "normalizes other rows with PyTorch)";

std::tuple<at::Tensor, at::Tensor> unit_rows(const at::Tensor& x, double eps) {
  yoso::validate_unit_rows(x);
#ifdef YOSO_WITH_CUDA
  if (x.is_cuda()) return unit_rows_cuda(x, eps);
#endif
  require_cpu(x);
  YOSO_CHECK(false, kUnitRowsOnCuda);
  return {};
}

at::Tensor through_unit_rows(const at::Tensor& grad, const at::Tensor& unit, const at::Tensor& norms, double eps) {
  yoso::validate_through_unit_rows(grad, unit, norms);
#ifdef YOSO_WITH_CUDA
  if (unit.is_cuda()) return through_unit_rows_cuda(grad, unit, norms, eps);
#endif
  require_cpu(unit);
  YOSO_CHECK(false, kUnitRowsOnCuda);
  return {};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  // The kernels hold no Python object: they release the GIL while they run (other threads go on).
  using release = py::call_guard<py::gil_scoped_release>;
  module.def("fast_hash", &fast_hash, "tau-bit codes of m Hadamard-based hashes (H D3 H D2 H D1 x)", release());
  module.def("cumulation", &cumulation, "LSH cumulation: (1/m) sum_h weight_q * T_h[code_q], T_h[c] = sum weight_k v",
             release());
  module.def("exact_weight_backward", &exact_weight_backward,
             "the lower-bound backward (eq. 4) with exact pair weights: (grad_q, grad_k, grad_v); normalize: q, k "
             "are rows of any length, the estimator is taken on their unit rows and differentiated through them; "
             "bf16_units (CUDA): those unit rows read as bfloat16",
             release());
  module.def("pair_gradient", &pair_gradient, "exact-derivative (*YOSO) gradient over colliding pairs", release());
  module.def("unit_rows", &unit_rows, "(x / max(|x|, eps), |x|) of rows x [B, n, width] (CUDA)", release());
  module.def("through_unit_rows", &through_unit_rows,
             "the gradient of rows x from grad, that of their unit rows (unit, as unit_rows made them, and norms) "
             "(CUDA)", release());
  module.def("max_code_length", []() { return yoso::kMaxCodeLength; });
  // at::parallel_for runs its loop serially unless this file was compiled with OpenMP (-fopenmp).
#ifdef INTRA_OP_PARALLEL
  module.attr("parallel") = true;
#else
  module.attr("parallel") = false;
#endif
#ifdef YOSO_WITH_CUDA
  module.attr("with_cuda") = true;
#else
  module.attr("with_cuda") = false;
#endif
}
