// Argument checks shared by the YOSO bindings (CPU and CUDA): every kernel input is validated here
// before any kernel runs, so a wrong shape, type or device is a Python exception, not garbage.
#pragma once

#include <torch/extension.h>

#include "yoso_math.h"

namespace yoso {

inline void check_float(const at::Tensor& t, const char* name, int64_t dims) {
  TORCH_CHECK(t.dim() == dims, "yoso: ", name, " must have ", dims, " dimensions, got ", t.sizes());
  TORCH_CHECK(t.scalar_type() == at::kFloat, "yoso: ", name, " must be float32 (the wrapper casts), got ",
              t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), "yoso: ", name, " must be contiguous");
}

inline void check_codes(const at::Tensor& t, const char* name, int64_t batch, int64_t hashes) {
  TORCH_CHECK(t.dim() == 3 && t.size(0) == batch && t.size(1) == hashes, "yoso: ", name,
              " must be [", batch, ", ", hashes, ", n], got ", t.sizes());
  TORCH_CHECK(t.scalar_type() == at::kInt && t.is_contiguous(), "yoso: ", name, " must be contiguous int32");
}

inline void check_weight(const at::Tensor& t, const char* name, int64_t batch, int64_t hashes, int64_t channels,
                         int64_t n) {
  check_float(t, name, 4);
  TORCH_CHECK(t.size(0) == batch && (t.size(1) == 1 || t.size(1) == hashes) && t.size(2) == channels &&
                  t.size(3) == n,
              "yoso: ", name, " must be [", batch, ", 1 or ", hashes, ", ", channels, ", ", n, "], got ", t.sizes());
}

inline void check_tau(int64_t tau) {
  TORCH_CHECK(tau >= 1 && tau <= kMaxCodeLength, "yoso: hash_code_len must be in [1, ", kMaxCodeLength, "], got ",
              tau);
}

inline void check_same_device(std::initializer_list<const at::Tensor*> tensors, const at::Tensor& first,
                              const char* what) {
  for (const at::Tensor* t : tensors) {
    TORCH_CHECK(t->device() == first.device(), "yoso: ", what, " inputs on different devices");
  }
}

inline void validate_hash(const at::Tensor& x, const at::Tensor& diagonals, int64_t m, int64_t tau) {
  check_float(x, "x", 3);
  check_float(diagonals, "diagonals", 4);
  check_tau(tau);
  check_same_device({&diagonals}, x, "fast_hash");
  const int64_t d = x.size(2), R = diagonals.size(1), P = diagonals.size(3);
  TORCH_CHECK(diagonals.size(0) == x.size(0) && diagonals.size(2) == 3, "yoso: diagonals must be [B, R, 3, P]");
  TORCH_CHECK(P >= d && (P & (P - 1)) == 0 && P <= 4096, "yoso: the padded dimension P=", P,
              " must be a power of two >= head_dim, at most 4096");
  TORCH_CHECK(m >= 1 && R == tau * ((m + P - 1) / P), "yoso: ", m, " hashes of ", tau, " bits need ",
              tau * ((m + P - 1) / P), " Hadamard products, got ", R);
}

inline void validate_cumulation(const at::Tensor& codes_q, const at::Tensor& codes_k, const at::Tensor& weight_q,
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
  check_same_device({&codes_q, &codes_k, &weight_q, &weight_k}, values, "cumulation");
}

// q [B,nq,d], k [B,nk,d], v and grad: the values [B,nk,dv] and the output's gradient [B,nq,dv],
// key_weight [B,nk] (0 = padding).
inline void validate_exact_weights(const at::Tensor& codes_q, const at::Tensor& codes_k, const at::Tensor& q,
                                   const at::Tensor& k, const at::Tensor& v, const at::Tensor& key_weight,
                                   const at::Tensor& grad, int64_t tau) {
  check_tau(tau);
  for (auto [t, name] : {std::pair{&q, "q"}, {&k, "k"}, {&v, "v"}, {&grad, "grad"}}) check_float(*t, name, 3);
  check_float(key_weight, "key_weight", 2);
  const int64_t B = q.size(0), m = codes_q.size(1);
  check_codes(codes_q, "codes_q", B, m);
  check_codes(codes_k, "codes_k", B, m);
  TORCH_CHECK(k.size(0) == B && v.size(0) == B && grad.size(0) == B && key_weight.size(0) == B &&
                  k.size(2) == q.size(2) && v.size(1) == k.size(1) && grad.size(1) == q.size(1) &&
                  grad.size(2) == v.size(2) && key_weight.size(1) == k.size(1) && codes_q.size(2) == q.size(1) &&
                  codes_k.size(2) == k.size(1),
              "yoso: exact_weight_backward shapes disagree");
  check_same_device({&codes_q, &codes_k, &k, &v, &key_weight, &grad}, q, "exact_weight_backward");
}

inline void validate_pair_gradient(const at::Tensor& codes_s, const at::Tensor& codes_o, const at::Tensor& a,
                                   const at::Tensor& o, const at::Tensor& s, const at::Tensor& w,
                                   const at::Tensor& mask_o, int64_t tau) {
  check_tau(tau);
  for (auto [t, name] : {std::pair{&a, "a"}, {&o, "o"}, {&s, "s"}, {&w, "w"}}) check_float(*t, name, 3);
  check_float(mask_o, "mask_o", 2);
  const int64_t B = a.size(0), m = codes_s.size(1);
  check_codes(codes_s, "codes_s", B, m);
  check_codes(codes_o, "codes_o", B, m);
  TORCH_CHECK(o.size(0) == B && s.size(0) == B && w.size(0) == B && mask_o.size(0) == B &&
                  o.size(2) == a.size(2) && w.size(2) == s.size(2) && w.size(1) == o.size(1) &&
                  s.size(1) == a.size(1) && mask_o.size(1) == o.size(1) && codes_s.size(2) == a.size(1) &&
                  codes_o.size(2) == o.size(1),
              "yoso: pair_gradient shapes disagree");
  check_same_device({&codes_s, &codes_o, &o, &s, &w, &mask_o}, a, "pair_gradient");
}

}  // namespace yoso
