// Arithmetic shared by the CPU and CUDA kernels of YOSO attention (Zeng et al., ICML 2021).
// Everything here is plain C++ usable from host and device code; no torch headers.
#pragma once

#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__) && !defined(YOSO_SIMT_EMULATION)
#define YOSO_HD __host__ __device__ __forceinline__
#else
#define YOSO_HD inline
#endif

namespace yoso {

constexpr float kPi = 3.14159265358979323846f;

// The largest hash code length the kernels accept: a hash table has 2^tau rows.
constexpr int kMaxCodeLength = 20;

// The unnormalized Walsh–Hadamard transform in place: stages half = 1, 2, 4, ..., each pairing
// position p with p + half inside blocks of 2·half and computing (u + v, u − v). The CPU kernel (per
// SIMD lane), the CUDA kernel (one butterfly per thread) and the PyTorch reference all pair and
// order the arithmetic this way, so the three give bit-identical transforms and identical codes.
// Butterfly `index` in [0, size/2) of the stage `half`.
YOSO_HD void hadamard_butterfly(float* x, int half, int index) {
  const int p = (index / half) * 2 * half + index % half;
  const float u = x[p];
  const float v = x[p + half];
  x[p] = u + v;
  x[p + half] = u - v;
}

// x ↦ x / max(‖x‖, eps) as F.normalize takes it (the CPU and CUDA kernels' unit rows): the divisor, a NaN norm kept
// NaN as torch's clamp_min keeps it (fmaxf would give eps), and the gradient's g·y, taken as 0 where ‖x‖ < eps.
YOSO_HD float unit_row_divisor(float norm, float eps) { return norm < eps ? eps : norm; }
YOSO_HD float unit_row_along(float along, float norm, float eps) { return norm < eps ? 0.0f : along; }

// Importance ratio of the exact-derivative estimate ("*YOSO"): with f(x) = (1 − arccos(x)/π)^τ,
// a collision (probability f) weighted by f'(x)/f(x) = τ / ((π − θ) sin θ) is unbiased for f'(x).
// x is clamped to [−clamp, clamp], where the derivative is finite.
YOSO_HD float exact_ratio(float x, int tau, float clamp) {
  x = fminf(fmaxf(x, -clamp), clamp);
  return static_cast<float>(tau) / ((kPi - acosf(x)) * sqrtf(1.0f - x * x));
}

// The weight of one colliding pair in the *YOSO gradient of token s: (s_s · w_o) · ρ(a_s · o_o).
YOSO_HD float pair_weight(const float* a_s, const float* o_o, const float* s_s, const float* w_o, int d, int dv,
                          int tau, float clamp) {
  float x = 0.0f, sw = 0.0f;
  for (int l = 0; l < d; ++l) x += a_s[l] * o_o[l];
  for (int l = 0; l < dv; ++l) sw += s_s[l] * w_o[l];
  return sw * exact_ratio(x, tau, clamp);
}

// The backward's choice per bucket of |Q| queries and |K| keys: enumerate its pairs, |Q||K| (dv + 2d)
// multiply-adds, or go through its dv x d tables, 2 (|Q| + |K|) dv d; so no bucket costs more than
// linear work. Every kernel (CPU, CUDA) decides with this one rule.
YOSO_HD bool heavy_bucket(int64_t queries, int64_t keys, int64_t d, int64_t dv) {
  return queries * keys * (dv + 2 * d) > 2 * (queries + keys) * dv * d;
}

// The fewest tokens one side of a heavy bucket can have (its other side unbounded): keys (dv + 2d) >
// 2 dv d. So heavy buckets start at least this many sorted positions apart, and a table slot per
// that many positions serves them all.
YOSO_HD int64_t heavy_side_minimum(int64_t d, int64_t dv) { return 2 * dv * d / (dv + 2 * d) + 1; }

}  // namespace yoso
