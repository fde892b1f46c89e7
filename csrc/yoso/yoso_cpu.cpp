// CPU kernels of YOSO attention and the Python bindings of both the CPU and (when compiled with
// -DYOSO_WITH_CUDA) the CUDA kernels. Shapes: B = batch·heads, m hashes, n tokens, tau bits.
//
//   fast_hash(x [B,n,d], diagonals [B,R,3,P], m, tau)            -> codes [B,m,n] int32
//   cumulation(codes_q [B,m,nq], codes_k [B,m,nk], weight_q [B,1|m,p,nq], weight_k [B,1|m,p,nk],
//              values [B,nk,dv], tau)                             -> [B,nq,dv]
//     = (1/m) sum_h sum_t weight_q[h,t,i] T_h[code_q(i), t],  T_h[c, t] = sum_{code_k(j)=c} weight_k[h,t,j] v_j
//   pair_gradient(codes_s [B,m,ns], codes_o [B,m,no], a [B,ns,d], o [B,no,d], s [B,ns,dv],
//                 w [B,no,dv], mask_o [B,no], tau, clamp)          -> [B,ns,d]
//   collision_fraction(codes_q [B,m,nq], codes_k [B,m,nk])         -> [B,nq,nk] (CPU only)
//     = (1/m) #{h : code_q[h,i] = code_k[h,j]}, the sampled B of the paper's eq. 2 averaged over hashes
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "yoso_math.h"

namespace {

void check_float(const at::Tensor& t, const char* name, int64_t dims) {
  TORCH_CHECK(t.dim() == dims, "yoso: ", name, " must have ", dims, " dimensions, got ", t.sizes());
  TORCH_CHECK(t.scalar_type() == at::kFloat, "yoso: ", name, " must be float32 (the wrapper casts), got ",
              t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), "yoso: ", name, " must be contiguous");
}

void check_codes(const at::Tensor& t, const char* name, int64_t batch, int64_t hashes) {
  TORCH_CHECK(t.dim() == 3 && t.size(0) == batch && t.size(1) == hashes, "yoso: ", name,
              " must be [", batch, ", ", hashes, ", n], got ", t.sizes());
  TORCH_CHECK(t.scalar_type() == at::kInt && t.is_contiguous(), "yoso: ", name, " must be contiguous int32");
}

void check_weight(const at::Tensor& t, const char* name, int64_t batch, int64_t hashes, int64_t channels, int64_t n) {
  check_float(t, name, 4);
  TORCH_CHECK(t.size(0) == batch && (t.size(1) == 1 || t.size(1) == hashes) && t.size(2) == channels &&
                  t.size(3) == n,
              "yoso: ", name, " must be [", batch, ", 1 or ", hashes, ", ", channels, ", ", n, "], got ", t.sizes());
}

void check_tau(int64_t tau) {
  TORCH_CHECK(tau >= 1 && tau <= yoso::kMaxCodeLength, "yoso: hash_code_len must be in [1, ",
              yoso::kMaxCodeLength, "], got ", tau);
}

void validate_hash(const at::Tensor& x, const at::Tensor& diagonals, int64_t m, int64_t tau) {
  check_float(x, "x", 3);
  check_float(diagonals, "diagonals", 4);
  check_tau(tau);
  TORCH_CHECK(x.device() == diagonals.device(), "yoso: x and diagonals on different devices");
  const int64_t d = x.size(2), R = diagonals.size(1), P = diagonals.size(3);
  TORCH_CHECK(diagonals.size(0) == x.size(0) && diagonals.size(2) == 3, "yoso: diagonals must be [B, R, 3, P]");
  TORCH_CHECK(P >= d && (P & (P - 1)) == 0 && P <= 4096, "yoso: the padded dimension P=", P,
              " must be a power of two >= head_dim, at most 4096");
  TORCH_CHECK(m >= 1 && R == tau * ((m + P - 1) / P), "yoso: ", m, " hashes of ", tau, " bits need ",
              tau * ((m + P - 1) / P), " Hadamard products, got ", R);
}

void validate_cumulation(const at::Tensor& codes_q, const at::Tensor& codes_k, const at::Tensor& weight_q,
                         const at::Tensor& weight_k, const at::Tensor& values, int64_t tau) {
  check_tau(tau);
  check_float(values, "values", 3);
  const int64_t B = values.size(0), m = codes_q.size(1);
  check_codes(codes_q, "codes_q", B, m);
  check_codes(codes_k, "codes_k", B, m);
  TORCH_CHECK(codes_k.size(2) == values.size(1), "yoso: codes_k has ", codes_k.size(2), " keys, values ",
              values.size(1));
  TORCH_CHECK(weight_q.dim() == 4 && weight_q.size(2) >= 1, "yoso: weight_q must be [B, 1 or m, channels, n]");
  check_weight(weight_q, "weight_q", B, m, weight_q.size(2), codes_q.size(2));
  check_weight(weight_k, "weight_k", B, m, weight_q.size(2), values.size(1));
  for (const at::Tensor* t : {&codes_q, &codes_k, &weight_q, &weight_k}) {
    TORCH_CHECK(t->device() == values.device(), "yoso: cumulation inputs on different devices");
  }
}

void validate_pair_gradient(const at::Tensor& codes_s, const at::Tensor& codes_o, const at::Tensor& a,
                            const at::Tensor& o, const at::Tensor& s, const at::Tensor& w,
                            const at::Tensor& mask_o, int64_t tau) {
  check_tau(tau);
  check_float(a, "a", 3);
  check_float(o, "o", 3);
  check_float(s, "s", 3);
  check_float(w, "w", 3);
  check_float(mask_o, "mask_o", 2);
  const int64_t B = a.size(0), m = codes_s.size(1);
  check_codes(codes_s, "codes_s", B, m);
  check_codes(codes_o, "codes_o", B, m);
  TORCH_CHECK(o.size(0) == B && s.size(0) == B && w.size(0) == B && mask_o.size(0) == B &&
                  o.size(2) == a.size(2) && w.size(2) == s.size(2) && w.size(1) == o.size(1) &&
                  s.size(1) == a.size(1) && mask_o.size(1) == o.size(1) && codes_s.size(2) == a.size(1) &&
                  codes_o.size(2) == o.size(1),
              "yoso: pair_gradient shapes disagree");
  for (const at::Tensor* t : {&codes_s, &codes_o, &o, &s, &w, &mask_o}) {
    TORCH_CHECK(t->device() == a.device(), "yoso: pair_gradient inputs on different devices");
  }
}

constexpr int64_t kLanes = 16;  // tokens hashed together, one per SIMD lane (an AVX-512 register)

// Codes of up to kLanes tokens of one batch element: each padded vector through H D3 H D2 H D1 per
// product, with the tokens interleaved (buffer[t * kLanes + lane]) so every butterfly is a vector op.
// SIZE > 0 fixes the padded dimension at compile time; 0 reads it from `size`.
template <int SIZE>
void hash_tokens(const float* x, int64_t lanes, const float* diagonals, int32_t* codes, int64_t size, int64_t d,
                 int64_t R, int64_t m, int64_t n, int64_t tau, float* buffer, int32_t* bits) {
  const int64_t P = SIZE > 0 ? SIZE : size;
  std::fill(bits, bits + P * kLanes, 0);  // the codes of the current group of P hashes, lane-interleaved
  for (int64_t r = 0; r < R; ++r) {
    const float* diag = diagonals + r * 3 * P;
    for (int64_t t = 0; t < P; ++t) {
      for (int64_t l = 0; l < kLanes; ++l) buffer[t * kLanes + l] = (t < d && l < lanes ? x[l * d + t] : 0.0f) * diag[t];
    }
    for (int stage = 0; stage < 3; ++stage) {
      if (stage > 0) {
        for (int64_t t = 0; t < P; ++t) {
          for (int64_t l = 0; l < kLanes; ++l) buffer[t * kLanes + l] *= diag[stage * P + t];
        }
      }
      for (int64_t half = 1; half < P; half *= 2) {
        for (int64_t base = 0; base < P; base += 2 * half) {
          for (int64_t p = base; p < base + half; ++p) {
            float* a = buffer + p * kLanes;
            float* b = buffer + (p + half) * kLanes;
            for (int64_t l = 0; l < kLanes; ++l) {
              const float u = a[l], v = b[l];
              a[l] = u + v;
              b[l] = u - v;
            }
          }
        }
      }
    }
    // Product r = g·tau + t gives bit t of hashes g·P … g·P + P − 1 (one coordinate each); a group's
    // codes are gathered in `bits` and written once, after its last bit.
    const int64_t group = r / tau, bit = r % tau;
    for (int64_t c = 0; c < P * kLanes; ++c) bits[c] |= (buffer[c] > 0.0f ? 1 : 0) << bit;
    if (bit == tau - 1 || r == R - 1) {
      for (int64_t c = 0; c < P && group * P + c < m; ++c) {
        for (int64_t l = 0; l < lanes; ++l) codes[(group * P + c) * n + l] = bits[c * kLanes + l];
      }
      std::fill(bits, bits + P * kLanes, 0);
    }
  }
}

at::Tensor fast_hash_cpu(const at::Tensor& x, const at::Tensor& diagonals, int64_t m, int64_t tau) {
  const int64_t B = x.size(0), n = x.size(1), d = x.size(2);
  const int64_t R = diagonals.size(1), P = diagonals.size(3);
  auto codes = at::zeros({B, m, n}, x.options().dtype(at::kInt));
  const float* xs = x.data_ptr<float>();
  const float* ds = diagonals.data_ptr<float>();
  int32_t* out = codes.data_ptr<int32_t>();
  auto hash = P == 16 ? &hash_tokens<16> : P == 32 ? &hash_tokens<32> : P == 64 ? &hash_tokens<64>
            : P == 128 ? &hash_tokens<128> : &hash_tokens<0>;
  const int64_t groups = (n + kLanes - 1) / kLanes;
  at::parallel_for(0, B * groups, 8, [&](int64_t begin, int64_t end) {
    std::vector<float> buffer(P * kLanes);
    std::vector<int32_t> bits(P * kLanes);
    for (int64_t group = begin; group < end; ++group) {
      const int64_t b = group / groups, i = (group % groups) * kLanes;
      hash(xs + (b * n + i) * d, std::min(kLanes, n - i), ds + b * R * 3 * P, out + b * m * n + i, P, d, R, m, n,
           tau, buffer.data(), bits.data());
    }
  });
  return codes;
}

// Tables at most this large are indexed by code directly; larger ones through `slot` (below).
constexpr int64_t kDirectTableBytes = int64_t(1) << 20;

struct CumulationArgs {
  const int32_t *cq, *ck;
  const float *wq, *wk, *v;
  float* out;
  int64_t B, m, nq, nk, dv, p, mq, mk;
};

// One batch element, every hash. kCompact: `slot` maps a code to a compact table row, given out in
// key order as codes first appear, so the table has at most nk rows (about 0.63·nk at tau = log2 n),
// fills almost sequentially and stays cache-resident. Otherwise rows are codes. Either way only the
// rows the keys touched are cleared, so a hash costs O(n·p·dv), never O(2^tau·p·dv).
// DV > 0 fixes the value dimension at compile time (the common head dims), so a query's sum over
// channels stays in registers; 0 reads it from the arguments and sums in `scratch` (dv floats).
template <bool kCompact, int DV>
void cumulate_batch(const CumulationArgs& a, int64_t b, float* table, int32_t* slot, float* scratch) {
  const int64_t dv = DV > 0 ? DV : a.dv;
  const int64_t width = a.p * dv;  // a table row: one dv-vector per weight channel
  const float inv_m = 1.0f / static_cast<float>(a.m);
  float fixed[DV > 0 ? DV : 1];
  float* sum = DV > 0 ? fixed : scratch;
  float* out_b = a.out + b * a.nq * dv;
  for (int64_t h = 0; h < a.m; ++h) {
    const int32_t* cqh = a.cq + (b * a.m + h) * a.nq;
    const int32_t* ckh = a.ck + (b * a.m + h) * a.nk;
    const float* wqh = a.wq + (b * a.mq + (a.mq == 1 ? 0 : h)) * a.p * a.nq;
    const float* wkh = a.wk + (b * a.mk + (a.mk == 1 ? 0 : h)) * a.p * a.nk;
    int32_t used = 0;
    for (int64_t j = 0; j < a.nk; ++j) {
      int64_t row_index = ckh[j];
      if (kCompact) {
        int32_t& assigned = slot[row_index];
        if (assigned < 0) {
          assigned = used++;
          std::memset(table + assigned * width, 0, width * sizeof(float));
        }
        row_index = assigned;
      }
      float* row = table + row_index * width;
      const float* vj = a.v + (b * a.nk + j) * dv;
      for (int64_t t = 0; t < a.p; ++t) {
        const float weight = wkh[t * a.nk + j];
        if (weight == 0.0f) continue;
        float* cell = row + t * dv;
        for (int64_t l = 0; l < dv; ++l) cell[l] += weight * vj[l];
      }
    }
    for (int64_t i = 0; i < a.nq; ++i) {
      const int64_t row_index = kCompact ? slot[cqh[i]] : cqh[i];
      if (row_index < 0) continue;  // no key in this bucket
      const float* row = table + row_index * width;
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
    for (int64_t j = 0; j < a.nk; ++j) {
      if (kCompact) {
        slot[ckh[j]] = -1;
      } else {
        std::memset(table + static_cast<int64_t>(ckh[j]) * width, 0, width * sizeof(float));
      }
    }
  }
}

template <int DV>
void cumulate_all(const CumulationArgs& a, int64_t rows, bool compact) {
  at::parallel_for(0, a.B, 1, [&](int64_t begin, int64_t end) {
    std::vector<int32_t> slot(compact ? rows : 0, -1);
    std::vector<float> table((compact ? std::max<int64_t>(a.nk, 1) : rows) * a.p * a.dv, 0.0f);
    std::vector<float> scratch(a.dv);
    for (int64_t b = begin; b < end; ++b) {
      if (compact) {
        cumulate_batch<true, DV>(a, b, table.data(), slot.data(), scratch.data());
      } else {
        cumulate_batch<false, DV>(a, b, table.data(), nullptr, scratch.data());
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
                            B, m, nq, nk, dv, p, weight_q.size(1), weight_k.size(1)};
  const int64_t rows = int64_t(1) << tau, width = p * dv;
  const bool compact = rows * width * static_cast<int64_t>(sizeof(float)) > kDirectTableBytes && nk <= rows;
  if (dv == 32) {
    cumulate_all<32>(args, rows, compact);
  } else if (dv == 64) {
    cumulate_all<64>(args, rows, compact);
  } else {
    cumulate_all<0>(args, rows, compact);
  }
  return result;
}

// Keys sorted by code per (batch, hash), so a query finds its colliding keys by binary search.
std::pair<at::Tensor, at::Tensor> sort_codes(const at::Tensor& codes) {
  auto sorted = at::sort(codes, /*dim=*/-1);
  return {std::get<0>(sorted).contiguous(), std::get<1>(sorted).to(at::kInt).contiguous()};
}

at::Tensor pair_gradient_cpu(const at::Tensor& codes_s, const at::Tensor& codes_o, const at::Tensor& a,
                             const at::Tensor& o, const at::Tensor& s, const at::Tensor& w,
                             const at::Tensor& mask_o, int64_t tau, double clamp) {
  const int64_t B = a.size(0), ns = a.size(1), d = a.size(2), no = o.size(1), dv = s.size(2);
  const int64_t m = codes_s.size(1);
  auto [sorted, order] = sort_codes(codes_o);
  auto result = at::zeros({B, ns, d}, a.options());
  const int32_t* cs = codes_s.data_ptr<int32_t>();
  const int32_t* sc = sorted.data_ptr<int32_t>();
  const int32_t* perm = order.data_ptr<int32_t>();
  const float *as = a.data_ptr<float>(), *os = o.data_ptr<float>(), *ss = s.data_ptr<float>();
  const float *ws = w.data_ptr<float>(), *ms = mask_o.data_ptr<float>();
  float* out = result.data_ptr<float>();
  const float inv_m = 1.0f / static_cast<float>(m);
  const float limit = static_cast<float>(clamp);
  at::parallel_for(0, B, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      for (int64_t h = 0; h < m; ++h) {
        const int32_t* sorted_h = sc + (b * m + h) * no;
        const int32_t* perm_h = perm + (b * m + h) * no;
        for (int64_t i = 0; i < ns; ++i) {
          const int32_t code = cs[(b * m + h) * ns + i];
          const int32_t* first = std::lower_bound(sorted_h, sorted_h + no, code);
          const int32_t* last = std::upper_bound(first, sorted_h + no, code);
          const float* ai = as + (b * ns + i) * d;
          const float* si = ss + (b * ns + i) * dv;
          float* gi = out + (b * ns + i) * d;
          for (const int32_t* it = first; it != last; ++it) {
            const int64_t j = perm_h[it - sorted_h];
            const float mask = ms[b * no + j];
            if (mask == 0.0f) continue;
            const float* oj = os + (b * no + j) * d;
            const float coefficient = mask * inv_m * yoso::pair_weight(ai, oj, si, ws + (b * no + j) * dv,
                                                                       static_cast<int>(d), static_cast<int>(dv),
                                                                       static_cast<int>(tau), limit);
            for (int64_t l = 0; l < d; ++l) gi[l] += coefficient * oj[l];
          }
        }
      }
    }
  });
  return result;
}

// Each query row compares its code with every key's, hash by hash: the inner loop over keys is a
// compare-and-add the compiler vectorizes. Counts are exact integers until the final scaling.
at::Tensor collision_fraction_cpu(const at::Tensor& codes_q, const at::Tensor& codes_k) {
  TORCH_CHECK(codes_q.dim() == 3 && codes_k.dim() == 3 && codes_q.size(0) == codes_k.size(0) &&
                  codes_q.size(1) == codes_k.size(1),
              "yoso: collision_fraction expects codes [B,m,nq] and [B,m,nk] with the same B and m");
  TORCH_CHECK(codes_q.scalar_type() == at::kInt && codes_k.scalar_type() == at::kInt && codes_q.is_contiguous() &&
                  codes_k.is_contiguous() && codes_q.is_cpu() && codes_k.is_cpu(),
              "yoso: collision_fraction expects contiguous int32 CPU codes");
  const int64_t B = codes_q.size(0), m = codes_q.size(1), nq = codes_q.size(2), nk = codes_k.size(2);
  auto result = at::empty({B, nq, nk}, codes_q.options().dtype(at::kFloat));
  const int32_t *cq = codes_q.data_ptr<int32_t>(), *ck = codes_k.data_ptr<int32_t>();
  float* out = result.data_ptr<float>();
  const float inv_m = 1.0f / static_cast<float>(m);
  at::parallel_for(0, B * nq, 16, [&](int64_t begin, int64_t end) {
    std::vector<int32_t> counts(nk);
    for (int64_t row = begin; row < end; ++row) {
      const int64_t b = row / nq, i = row % nq;
      std::fill(counts.begin(), counts.end(), 0);
      for (int64_t h = 0; h < m; ++h) {
        const int32_t code = cq[(b * m + h) * nq + i];
        const int32_t* keys = ck + (b * m + h) * nk;
        int32_t* c = counts.data();
        for (int64_t j = 0; j < nk; ++j) c[j] += keys[j] == code;
      }
      float* o = out + row * nk;
      for (int64_t j = 0; j < nk; ++j) o[j] = static_cast<float>(counts[j]) * inv_m;
    }
  });
  return result;
}

}  // namespace

#ifdef YOSO_WITH_CUDA
at::Tensor fast_hash_cuda(const at::Tensor& x, const at::Tensor& diagonals, int64_t m, int64_t tau);
at::Tensor cumulation_cuda(const at::Tensor& codes_q, const at::Tensor& codes_k, const at::Tensor& weight_q,
                           const at::Tensor& weight_k, const at::Tensor& values, int64_t tau,
                           int64_t workspace_bytes);
at::Tensor pair_gradient_cuda(const at::Tensor& codes_s, const at::Tensor& sorted_o, const at::Tensor& order_o,
                              const at::Tensor& a, const at::Tensor& o, const at::Tensor& s, const at::Tensor& w,
                              const at::Tensor& mask_o, int64_t tau, double clamp);
#endif

namespace {

at::Tensor fast_hash(const at::Tensor& x, const at::Tensor& diagonals, int64_t m, int64_t tau) {
  validate_hash(x, diagonals, m, tau);
#ifdef YOSO_WITH_CUDA
  if (x.is_cuda()) return fast_hash_cuda(x, diagonals, m, tau);
#endif
  TORCH_CHECK(x.is_cpu(), "yoso: this build has no CUDA kernels; got a ", x.device(), " tensor");
  return fast_hash_cpu(x, diagonals, m, tau);
}

at::Tensor cumulation(const at::Tensor& codes_q, const at::Tensor& codes_k, const at::Tensor& weight_q,
                      const at::Tensor& weight_k, const at::Tensor& values, int64_t tau, int64_t workspace_bytes) {
  validate_cumulation(codes_q, codes_k, weight_q, weight_k, values, tau);
#ifdef YOSO_WITH_CUDA
  if (values.is_cuda()) return cumulation_cuda(codes_q, codes_k, weight_q, weight_k, values, tau, workspace_bytes);
#endif
  TORCH_CHECK(values.is_cpu(), "yoso: this build has no CUDA kernels; got a ", values.device(), " tensor");
  return cumulation_cpu(codes_q, codes_k, weight_q, weight_k, values, tau);
}

at::Tensor pair_gradient(const at::Tensor& codes_s, const at::Tensor& codes_o, const at::Tensor& a,
                         const at::Tensor& o, const at::Tensor& s, const at::Tensor& w, const at::Tensor& mask_o,
                         int64_t tau, double clamp) {
  validate_pair_gradient(codes_s, codes_o, a, o, s, w, mask_o, tau);
#ifdef YOSO_WITH_CUDA
  if (a.is_cuda()) {
    auto [sorted, order] = sort_codes(codes_o);
    return pair_gradient_cuda(codes_s, sorted, order, a, o, s, w, mask_o, tau, clamp);
  }
#endif
  TORCH_CHECK(a.is_cpu(), "yoso: this build has no CUDA kernels; got a ", a.device(), " tensor");
  return pair_gradient_cpu(codes_s, codes_o, a, o, s, w, mask_o, tau, clamp);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("fast_hash", &fast_hash, "tau-bit codes of m Hadamard-based hashes (H D3 H D2 H D1 x)");
  module.def("cumulation", &cumulation, "LSH cumulation: (1/m) sum_h weight_q * T_h[code_q], T_h[c] = sum weight_k v");
  module.def("pair_gradient", &pair_gradient, "exact-derivative (*YOSO) gradient over colliding pairs");
  module.def("collision_fraction", &collision_fraction_cpu, "(1/m) collision counts of every query-key pair (CPU)");
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
