// Argument checks shared by the YOSO bindings (CPU and CUDA): every kernel input is validated here
// before any kernel runs, so a wrong shape, type or device is a Python exception, not garbage.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <array>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>

#include "yoso_math.h"

namespace yoso {

// Messages are joined with std::to_string, never an iostream (TORCH_CHECK's own joining, c10::str, is a
// std::ostringstream): on the GPU machine of 2026-11-27 (torch 2.11.0+cu130, H100 and H200) the CUDA build
// of this extension died with SIGSEGV inside std::ostream's number formatting (cuda-gdb: validate_cumulation
// -> std::ostream::_M_insert<long>) the first time a check failed, instead of raising the check's message.
// YOSO_CHECK hands TORCH_CHECK one finished C string, which it passes on as it is (a std::string would still go
// through c10::str's stream); the temporary lives until the check's error has copied it.
inline std::string text(const char* part) { return part; }
inline std::string text(const std::string& part) { return part; }
inline std::string text(at::IntArrayRef sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) out += (i ? ", " : "") + std::to_string(sizes[i]);
  return out + "]";
}
inline std::string text(at::ScalarType type) { return c10::toString(type); }
inline std::string text(const c10::Device& device) { return device.str(); }
template <typename Number, typename = std::enable_if_t<std::is_arithmetic_v<Number>>>
std::string text(Number part) {
  return std::to_string(part);
}

template <typename... Parts>
std::string message(const Parts&... parts) {
  std::string out;
  ((out += text(parts)), ...);
  return out;
}

}  // namespace yoso

#define YOSO_CHECK(condition, ...) TORCH_CHECK(condition, ::yoso::message(__VA_ARGS__).c_str())

namespace yoso {

inline void check_float(const at::Tensor& t, const char* name, int64_t dims) {
  YOSO_CHECK(t.dim() == dims, "yoso: ", name, " must have ", dims, " dimensions, got ", t.sizes());
  YOSO_CHECK(t.scalar_type() == at::kFloat, "yoso: ", name, " must be float32 (the wrapper casts), got ",
              t.scalar_type());
  YOSO_CHECK(t.is_contiguous(), "yoso: ", name, " must be contiguous");
}

// Rows the CUDA kernels read (yoso::Rows): float32 or bfloat16; the CPU kernels take float32 (require_float32).
inline void check_rows(const at::Tensor& t, const char* name, int64_t dims) {
  YOSO_CHECK(t.dim() == dims, "yoso: ", name, " must have ", dims, " dimensions, got ", t.sizes());
  YOSO_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16, "yoso: ", name,
              " must be float32 or bfloat16 (the wrapper casts), got ", t.scalar_type());
  YOSO_CHECK(t.is_contiguous(), "yoso: ", name, " must be contiguous");
}

inline void require_float32(std::initializer_list<std::pair<const at::Tensor*, const char*>> rows, const char* why) {
  for (const auto& [t, name] : rows) {
    YOSO_CHECK(t->scalar_type() == at::kFloat, "yoso: ", name, " must be float32 (", why, "), got ", t->scalar_type());
  }
}

inline void check_codes(const at::Tensor& t, const char* name, int64_t batch, int64_t hashes) {
  YOSO_CHECK(t.dim() == 3 && t.size(0) == batch && t.size(1) == hashes, "yoso: ", name,
              " must be [", batch, ", ", hashes, ", n], got ", t.sizes());
  YOSO_CHECK(t.scalar_type() == at::kInt && t.is_contiguous(), "yoso: ", name, " must be contiguous int32");
}

inline void check_weight(const at::Tensor& t, const char* name, int64_t batch, int64_t hashes, int64_t channels,
                         int64_t n) {
  check_float(t, name, 4);
  YOSO_CHECK(t.size(0) == batch && (t.size(1) == 1 || t.size(1) == hashes) && t.size(2) == channels &&
                  t.size(3) == n,
              "yoso: ", name, " must be [", batch, ", 1 or ", hashes, ", ", channels, ", ", n, "], got ", t.sizes());
}

inline void check_tau(int64_t tau) {
  YOSO_CHECK(tau >= 1 && tau <= kMaxCodeLength, "yoso: hash_code_len must be in [1, ", kMaxCodeLength, "], got ",
              tau);
}

inline void check_same_device(std::initializer_list<const at::Tensor*> tensors, const at::Tensor& first,
                              const char* what) {
  for (const at::Tensor* t : tensors) {
    YOSO_CHECK(t->device() == first.device(), "yoso: ", what, " inputs on different devices");
  }
}

inline void validate_hash(const at::Tensor& x, const at::Tensor& diagonals, int64_t m, int64_t tau) {
  check_float(x, "x", 3);
  check_float(diagonals, "diagonals", 4);
  check_tau(tau);
  check_same_device({&diagonals}, x, "fast_hash");
  const int64_t d = x.size(2), R = diagonals.size(1), P = diagonals.size(3);
  YOSO_CHECK(diagonals.size(0) == x.size(0) && diagonals.size(2) == 3, "yoso: diagonals must be [B, R, 3, P]");
  YOSO_CHECK(P >= d && (P & (P - 1)) == 0 && P <= 4096, "yoso: the padded dimension P=", P,
              " must be a power of two >= head_dim, at most 4096");
  YOSO_CHECK(m >= 1 && R == tau * ((m + P - 1) / P), "yoso: ", m, " hashes of ", tau, " bits need ",
              tau * ((m + P - 1) / P), " Hadamard products, got ", R);
}

inline void validate_cumulation(const at::Tensor& codes_q, const at::Tensor& codes_k, const at::Tensor& weight_q,
                                const at::Tensor& weight_k, const at::Tensor& values, int64_t tau) {
  check_tau(tau);
  check_rows(values, "values", 3);
  const int64_t B = values.size(0), m = codes_q.size(1);
  check_codes(codes_q, "codes_q", B, m);
  check_codes(codes_k, "codes_k", B, m);
  YOSO_CHECK(codes_k.size(2) == values.size(1), "yoso: codes_k has ", codes_k.size(2), " keys, values ",
              values.size(1));
  YOSO_CHECK(weight_q.dim() == 4 && weight_q.size(2) >= 1, "yoso: weight_q must be [B, 1 or m, channels, n]");
  check_weight(weight_q, "weight_q", B, m, weight_q.size(2), codes_q.size(2));
  check_weight(weight_k, "weight_k", B, m, weight_q.size(2), values.size(1));
  check_same_device({&codes_q, &codes_k, &weight_q, &weight_k}, values, "cumulation");
}

// The inputs of a pass over colliding pairs, seen from one side s against the other side o: codes
// [B,m,ns] and [B,m,no], a [B,ns,d] and o [B,no,d], s [B,ns,dv] and w [B,no,dv], mask_o [B,no].
// `names` are the caller's names for these seven, in that order.
inline void validate_pair_inputs(const at::Tensor& codes_s, const at::Tensor& codes_o, const at::Tensor& a,
                                 const at::Tensor& o, const at::Tensor& s, const at::Tensor& w,
                                 const at::Tensor& mask_o, int64_t tau, const char* what,
                                 const std::array<const char*, 7>& names, bool bf16_rows) {
  check_tau(tau);
  for (auto [t, name] : {std::pair{&a, names[2]}, {&o, names[3]}, {&s, names[4]}, {&w, names[5]}}) {
    if (bf16_rows) check_rows(*t, name, 3); else check_float(*t, name, 3);
  }
  check_float(mask_o, names[6], 2);
  const int64_t B = a.size(0), m = codes_s.size(1);
  check_codes(codes_s, names[0], B, m);
  check_codes(codes_o, names[1], B, m);
  YOSO_CHECK(o.size(0) == B && s.size(0) == B && w.size(0) == B && mask_o.size(0) == B &&
                  o.size(2) == a.size(2) && w.size(2) == s.size(2) && w.size(1) == o.size(1) &&
                  s.size(1) == a.size(1) && mask_o.size(1) == o.size(1) && codes_s.size(2) == a.size(1) &&
                  codes_o.size(2) == o.size(1),
              "yoso: ", what, " shapes disagree");
  check_same_device({&codes_s, &codes_o, &o, &s, &w, &mask_o}, a, what);
}

// q [B,nq,d], k [B,nk,d], v and grad: the values [B,nk,dv] and the output's gradient [B,nq,dv],
// key_weight [B,nk] (0 = padding).
inline void validate_exact_weights(const at::Tensor& codes_q, const at::Tensor& codes_k, const at::Tensor& q,
                                   const at::Tensor& k, const at::Tensor& v, const at::Tensor& key_weight,
                                   const at::Tensor& grad, int64_t tau) {
  validate_pair_inputs(codes_q, codes_k, q, k, grad, v, key_weight, tau, "exact_weight_backward",
                       {"codes_q", "codes_k", "q", "k", "grad", "v", "key_weight"}, true);
}

// The output's normalization: rows x [B, n, width].
inline void validate_unit_rows(const at::Tensor& x) { check_float(x, "x", 3); }

// Its backward: the unit rows [B, n, width] it made, their norms [B, n] and the gradient of the unit rows.
inline void validate_through_unit_rows(const at::Tensor& grad, const at::Tensor& unit, const at::Tensor& norms) {
  check_float(unit, "unit", 3);
  check_float(norms, "norms", 2);
  check_float(grad, "grad", 3);
  YOSO_CHECK(norms.size(0) == unit.size(0) && norms.size(1) == unit.size(1), "yoso: norms must be [B, n] = [",
              unit.size(0), ", ", unit.size(1), "], got ", norms.sizes());
  YOSO_CHECK(grad.sizes() == unit.sizes(), "yoso: grad must be shaped as unit ", unit.sizes(), ", got ", grad.sizes());
  check_same_device({&norms, &grad}, unit, "through_unit_rows");
}

inline void validate_pair_gradient(const at::Tensor& codes_s, const at::Tensor& codes_o, const at::Tensor& a,
                                   const at::Tensor& o, const at::Tensor& s, const at::Tensor& w,
                                   const at::Tensor& mask_o, int64_t tau) {
  validate_pair_inputs(codes_s, codes_o, a, o, s, w, mask_o, tau, "pair_gradient",
                       {"codes_s", "codes_o", "a", "o", "s", "w", "mask_o"}, false);
}

}  // namespace yoso
