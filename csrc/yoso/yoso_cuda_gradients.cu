// CUDA kernels of YOSO attention's backward (yoso_cuda_kernels.h): the default lower-bound backward
// with exact pair weights, and the *YOSO exact-derivative backward. One thread per token owns its
// gradient rows and visits its bucket under each hash in turn, so every output element has a single
// writer and one summation order: no atomics, bitwise repeatable. Through yoso_simt.h, as the forward.
#include <algorithm>

#include "yoso_cuda_common.h"
#include "yoso_cuda_kernels.h"
#include "yoso_math.h"

namespace yoso {
namespace {

constexpr int kTableThreads = 32;  // a warp per table slot: most slots hold no heavy run
constexpr int kTokenThreads = 128;

struct Geometry {
  int64_t m, nq, nk;
  int d, dv;
  int64_t slots_k, slots_q, minimum;  // table slots per pair on each side; heavy runs start this far apart
  YOSO_DEVICE int64_t key_table(int64_t local_pair, int64_t slot) const {
    return (local_pair * slots_k + slot) * int64_t(dv) * d;
  }
  YOSO_DEVICE int64_t query_table(int64_t local_pair, int64_t slot) const {
    return (local_pair * slots_q + slot) * int64_t(dv) * (d + 1);
  }
};

Geometry geometry(int64_t m, int64_t nq, int64_t nk, int d, int dv) {
  const int64_t minimum = heavy_side_minimum(d, dv);
  return {m, nq, nk, d, dv, (nk + minimum - 1) / minimum, (nq + minimum - 1) / minimum, minimum};
}

int64_t floats_per_pair(const Geometry& g) {
  return g.slots_k * int64_t(g.dv) * g.d + g.slots_q * int64_t(g.dv) * (g.d + 1);
}

// The heavy bucket (if any) whose run in `own` (sorted, length n_own) starts within the window of
// table slot `slot`: its run, or an empty one. `other` holds the other side's sorted codes.
YOSO_DEVICE Run heavy_run_in_slot(const int32_t* own, int64_t n_own, const int32_t* other, int64_t n_other,
                                  int64_t slot, const Geometry& g, bool own_is_keys) {
  const int64_t end = slot * g.minimum + g.minimum < n_own ? slot * g.minimum + g.minimum : n_own;
  for (int64_t t = slot * g.minimum; t < end; ++t) {
    const int32_t code = load(own + t);
    if (t > 0 && load(own + t - 1) == code) continue;
    const Run run = find_run(own, static_cast<int>(n_own), code);
    const Run partner = find_run(other, static_cast<int>(n_other), code);
    const int64_t queries = own_is_keys ? partner.size() : run.size(), keys = own_is_keys ? run.size() : partner.size();
    if (heavy_bucket(queries, keys, g.d, g.dv)) return run;
  }
  return {0, 0};
}

// M = sum_{j in the run} w_j v_j k_j^T [dv x d] for each heavy key run of the chunk's pairs.
YOSO_GLOBAL void key_tables_kernel(const int32_t* sorted_q, const int32_t* sorted_k, const int32_t* order_k,
                                   const float* k, const float* v, const float* key_weight, float* tables,
                                   int64_t first_pair, Geometry g) {
  const int64_t local = blockIdx.y, pair = first_pair + local, b = pair / g.m;
  YOSO_DYNAMIC_SHARED(int, bounds);  // the slot's heavy run, found by one thread for the block
  if (threadIdx.x == 0) {
    const Run found = heavy_run_in_slot(sorted_k + pair * g.nk, g.nk, sorted_q + pair * g.nq, g.nq, blockIdx.x, g, true);
    bounds[0] = found.first;
    bounds[1] = found.last;
  }
  __syncthreads();
  const Run run{bounds[0], bounds[1]};
  if (run.size() == 0) return;
  float* table = tables + g.key_table(local, blockIdx.x);
  for (int cell = threadIdx.x; cell < g.dv * g.d; cell += blockDim.x) {
    const int l = cell / g.d, e = cell % g.d;
    float sum = 0.0f;
    for (int r = run.first; r < run.last; ++r) {
      const int64_t j = load(order_k + pair * g.nk + r);
      const float w = load(key_weight + b * g.nk + j);
      if (w != 0.0f) sum += w * load(v + (b * g.nk + j) * g.dv + l) * load(k + (b * g.nk + j) * g.d + e);
    }
    store(table + cell, sum);
  }
}

// N = sum_{i in the run} g_i q_i^T [dv x d] and sum_i g_i [dv] for each heavy query run.
YOSO_GLOBAL void query_tables_kernel(const int32_t* sorted_q, const int32_t* order_q, const int32_t* sorted_k,
                                     const float* q, const float* grad, float* tables, int64_t first_pair, Geometry g) {
  const int64_t local = blockIdx.y, pair = first_pair + local, b = pair / g.m;
  YOSO_DYNAMIC_SHARED(int, bounds);
  if (threadIdx.x == 0) {
    const Run found = heavy_run_in_slot(sorted_q + pair * g.nq, g.nq, sorted_k + pair * g.nk, g.nk, blockIdx.x, g, false);
    bounds[0] = found.first;
    bounds[1] = found.last;
  }
  __syncthreads();
  const Run run{bounds[0], bounds[1]};
  if (run.size() == 0) return;
  float* table = tables + g.query_table(local, blockIdx.x);
  for (int cell = threadIdx.x; cell < g.dv * (g.d + 1); cell += blockDim.x) {
    const int l = cell / (g.d + 1), e = cell % (g.d + 1);  // column d: the sum of the g_i
    float sum = 0.0f;
    for (int r = run.first; r < run.last; ++r) {
      const int64_t i = load(order_q + pair * g.nq + r);
      const float gl = load(grad + (b * g.nq + i) * g.dv + l);
      sum += e < g.d ? gl * load(q + (b * g.nq + i) * g.d + e) : gl;
    }
    store(table + cell, sum);
  }
}

// ∇Q_i += (τ/2m) Σ_h Σ_{j in i's bucket} w_j (g_i·v_j) k_j over the chunk's hashes of one batch element.
YOSO_GLOBAL void query_gradients_kernel(const int32_t* codes_q, const int32_t* sorted_q, const int32_t* sorted_k,
                                        const int32_t* order_k, const float* k, const float* v,
                                        const float* key_weight, const float* grad, const float* tables,
                                        float* grad_q, int64_t first_pair, int64_t end_pair, Geometry g, int tau,
                                        float scale) {
  const int64_t b = first_pair / g.m + blockIdx.y, i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= g.nq) return;
  float g_i[kMaxHeadDim], sum[kMaxHeadDim];
  for (int l = 0; l < g.dv; ++l) g_i[l] = load(grad + (b * g.nq + i) * g.dv + l);
  for (int e = 0; e < g.d; ++e) sum[e] = 0.0f;
  const HashRange hashes = chunk_hashes(b, g.m, first_pair, end_pair);
  for (int64_t h = hashes.begin; h < hashes.end; ++h) {
    const int64_t pair = b * g.m + h;
    const int32_t code = checked_code(codes_q, pair * g.nq + i, tau);
    const Run keys = find_run(sorted_k + pair * g.nk, static_cast<int>(g.nk), code);
    if (keys.size() == 0) continue;
    const Run queries = find_run(sorted_q + pair * g.nq, static_cast<int>(g.nq), code);
    if (heavy_bucket(queries.size(), keys.size(), g.d, g.dv)) {
      const float* table = tables + g.key_table(pair - first_pair, keys.first / g.minimum);
      for (int l = 0; l < g.dv; ++l) {
        for (int e = 0; e < g.d; ++e) sum[e] += g_i[l] * load(table + l * g.d + e);
      }
      continue;
    }
    for (int r = keys.first; r < keys.last; ++r) {
      const int64_t j = load(order_k + pair * g.nk + r);
      const float w = load(key_weight + b * g.nk + j);
      if (w == 0.0f) continue;
      float dot = 0.0f;
      for (int l = 0; l < g.dv; ++l) dot += g_i[l] * load(v + (b * g.nk + j) * g.dv + l);
      for (int e = 0; e < g.d; ++e) sum[e] += w * dot * load(k + (b * g.nk + j) * g.d + e);
    }
  }
  for (int e = 0; e < g.d; ++e) {
    float* out = grad_q + (b * g.nq + i) * g.d + e;
    store(out, load(out) + scale * sum[e]);
  }
}

// ∇K_j += (τ/2m) w_j Σ_h Σ_{i in j's bucket} (g_i·v_j) q_i and ∇V_j += (w_j/m) Σ_h Σ_i g_i.
YOSO_GLOBAL void key_gradients_kernel(const int32_t* codes_k, const int32_t* sorted_q, const int32_t* order_q,
                                      const int32_t* sorted_k, const float* q, const float* v,
                                      const float* key_weight, const float* grad, const float* tables,
                                      float* grad_k, float* grad_v, int64_t first_pair, int64_t end_pair, Geometry g,
                                      int tau, float scale, float inv_m) {
  const int64_t b = first_pair / g.m + blockIdx.y, j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= g.nk) return;
  const float w = load(key_weight + b * g.nk + j);
  if (w == 0.0f) return;  // a padded key: no gradient
  float v_j[kMaxHeadDim], sum_k[kMaxHeadDim], sum_v[kMaxHeadDim];
  for (int l = 0; l < g.dv; ++l) {
    v_j[l] = load(v + (b * g.nk + j) * g.dv + l);
    sum_v[l] = 0.0f;
  }
  for (int e = 0; e < g.d; ++e) sum_k[e] = 0.0f;
  const HashRange hashes = chunk_hashes(b, g.m, first_pair, end_pair);
  for (int64_t h = hashes.begin; h < hashes.end; ++h) {
    const int64_t pair = b * g.m + h;
    const int32_t code = checked_code(codes_k, pair * g.nk + j, tau);
    const Run queries = find_run(sorted_q + pair * g.nq, static_cast<int>(g.nq), code);
    if (queries.size() == 0) continue;
    const Run keys = find_run(sorted_k + pair * g.nk, static_cast<int>(g.nk), code);
    if (heavy_bucket(queries.size(), keys.size(), g.d, g.dv)) {
      const float* table = tables + g.query_table(pair - first_pair, queries.first / g.minimum);
      for (int l = 0; l < g.dv; ++l) {
        for (int e = 0; e < g.d; ++e) sum_k[e] += v_j[l] * load(table + l * (g.d + 1) + e);
        sum_v[l] += load(table + l * (g.d + 1) + g.d);
      }
      continue;
    }
    for (int r = queries.first; r < queries.last; ++r) {
      const int64_t i = load(order_q + pair * g.nq + r);
      float dot = 0.0f;
      for (int l = 0; l < g.dv; ++l) {
        const float gl = load(grad + (b * g.nq + i) * g.dv + l);
        dot += gl * v_j[l];
        sum_v[l] += gl;
      }
      for (int e = 0; e < g.d; ++e) sum_k[e] += dot * load(q + (b * g.nq + i) * g.d + e);
    }
  }
  for (int e = 0; e < g.d; ++e) {
    float* out = grad_k + (b * g.nk + j) * g.d + e;
    store(out, load(out) + scale * w * sum_k[e]);
  }
  for (int l = 0; l < g.dv; ++l) {
    float* out = grad_v + (b * g.nk + j) * g.dv + l;
    store(out, load(out) + inv_m * w * sum_v[l]);
  }
}

// One thread per token s: (1/m) Σ_h Σ_{o colliding} mask_o (s_s·w_o) ρ(a_s·o_o) o_o, ρ as yoso_math.h.
YOSO_GLOBAL void pair_gradient_kernel(const int32_t* codes_s, const int32_t* sorted_o, const int32_t* order_o,
                                      const float* a, const float* o, const float* s, const float* w,
                                      const float* mask_o, float* out, int64_t first_b, int m, int ns, int no, int d,
                                      int dv, int tau, float clamp, float inv_m) {
  const int64_t b = first_b + blockIdx.y, i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= ns) return;
  float a_i[kMaxHeadDim], s_i[kMaxHeadDim], sum[kMaxHeadDim];
  for (int l = 0; l < d; ++l) {
    a_i[l] = load(a + (b * ns + i) * d + l);
    sum[l] = 0.0f;
  }
  for (int l = 0; l < dv; ++l) s_i[l] = load(s + (b * ns + i) * dv + l);
  for (int h = 0; h < m; ++h) {
    const int64_t pair = b * m + h;
    const int32_t code = checked_code(codes_s, pair * ns + i, tau);
    const Run run = find_run(sorted_o + pair * no, no, code);
    for (int r = run.first; r < run.last; ++r) {
      const int64_t j = load(order_o + pair * no + r);
      const float mask = load(mask_o + b * no + j);
      if (mask == 0.0f) continue;
      float x = 0.0f, sw = 0.0f;
      for (int l = 0; l < d; ++l) x += a_i[l] * load(o + (b * no + j) * d + l);
      for (int l = 0; l < dv; ++l) sw += s_i[l] * load(w + (b * no + j) * dv + l);
      const float coefficient = mask * inv_m * sw * exact_ratio(x, tau, clamp);
      for (int l = 0; l < d; ++l) sum[l] += coefficient * load(o + (b * no + j) * d + l);
    }
  }
  for (int l = 0; l < d; ++l) {
    float* y = out + (b * ns + i) * d + l;
    store(y, load(y) + sum[l]);
  }
}

unsigned blocks_for(int64_t count, int threads) { return static_cast<unsigned>((count + threads - 1) / threads); }

}  // namespace

int64_t exact_backward_workspace(int64_t B, int m, int nq, int nk, int d, int dv, int64_t workspace_bytes) {
  const Geometry g = geometry(m, nq, nk, d, dv);
  return pairs_per_chunk(B * m, floats_per_pair(g), workspace_bytes, l2_cache_bytes()) * floats_per_pair(g);
}

cudaError_t launch_exact_backward(const int32_t* codes_q, const int32_t* codes_k, const int32_t* sorted_q,
                                  const int32_t* order_q, const int32_t* sorted_k, const int32_t* order_k,
                                  const float* q, const float* k, const float* v, const float* key_weight,
                                  const float* grad, float* grad_q, float* grad_k, float* grad_v, float* workspace,
                                  int64_t workspace_floats, int64_t B, int m, int nq, int nk, int d, int dv, int tau,
                                  cudaStream_t stream) {
  if (d > kMaxHeadDim || dv > kMaxHeadDim) return cudaErrorInvalidValue;
  const int64_t total = B * m;
  if (total == 0 || nq == 0 || nk == 0) return cudaSuccess;
  const Geometry g = geometry(m, nq, nk, d, dv);
  const int64_t per_pair = floats_per_pair(g);
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(workspace_floats / per_pair, 65535));
  float* key_tables = workspace;
  const float scale = static_cast<float>(tau) / (2.0f * m);
  for (int64_t first = 0; first < total; first += chunk) {
    const int64_t end = std::min(total, first + chunk), pairs = end - first;
    float* query_tables = workspace + pairs * g.slots_k * int64_t(dv) * d;
    const unsigned batches = static_cast<unsigned>((end - 1) / m - first / m + 1);
    const dim3 key_slots(static_cast<unsigned>(g.slots_k), static_cast<unsigned>(pairs));
    const dim3 query_slots(static_cast<unsigned>(g.slots_q), static_cast<unsigned>(pairs));
    cudaError_t status = YOSO_LAUNCH(key_tables_kernel, key_slots, dim3(kTableThreads), 2 * sizeof(int), stream,
                                     sorted_q, sorted_k, order_k, k, v, key_weight, key_tables, first, g);
    if (status != cudaSuccess) return status;
    status = YOSO_LAUNCH(query_tables_kernel, query_slots, dim3(kTableThreads), 2 * sizeof(int), stream, sorted_q,
                         order_q, sorted_k, q, grad, query_tables, first, g);
    if (status != cudaSuccess) return status;
    status = YOSO_LAUNCH(query_gradients_kernel, dim3(blocks_for(nq, kTokenThreads), batches), dim3(kTokenThreads), 0,
                         stream, codes_q, sorted_q, sorted_k, order_k, k, v, key_weight, grad, key_tables, grad_q,
                         first, end, g, tau, scale);
    if (status != cudaSuccess) return status;
    status = YOSO_LAUNCH(key_gradients_kernel, dim3(blocks_for(nk, kTokenThreads), batches), dim3(kTokenThreads), 0,
                         stream, codes_k, sorted_q, order_q, sorted_k, q, v, key_weight, grad, query_tables, grad_k,
                         grad_v, first, end, g, tau, scale, 1.0f / m);
    if (status != cudaSuccess) return status;
  }
  return cudaSuccess;
}

cudaError_t launch_pair_gradient(const int32_t* codes_s, const int32_t* sorted_o, const int32_t* order_o,
                                 const float* a, const float* o, const float* s, const float* w,
                                 const float* mask_o, float* out, int64_t B, int m, int ns, int no, int d, int dv,
                                 int tau, float clamp, cudaStream_t stream) {
  if (d > kMaxHeadDim || dv > kMaxHeadDim) return cudaErrorInvalidValue;
  if (B * ns == 0 || m == 0) return cudaSuccess;
  for (int64_t first = 0; first < B; first += 65535) {
    const unsigned batches = static_cast<unsigned>(std::min<int64_t>(65535, B - first));
    const cudaError_t status = YOSO_LAUNCH(pair_gradient_kernel, dim3(blocks_for(ns, kTokenThreads), batches),
                                           dim3(kTokenThreads), 0, stream, codes_s, sorted_o, order_o, a, o, s, w,
                                           mask_o, out, first, m, ns, no, d, dv, tau, clamp, 1.0f / m);
    if (status != cudaSuccess) return status;
  }
  return cudaSuccess;
}

}  // namespace yoso
