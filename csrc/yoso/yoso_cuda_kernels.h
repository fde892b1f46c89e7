// Launchers of the YOSO CUDA kernels (yoso_cuda_kernels.cu, yoso_cuda_gradients.cu), called from
// yoso_cuda.cpp with torch's tensors and stream, and from the CPU emulation's test driver. No torch
// headers: the callers own the memory. B = batch·heads, m hashes, pair p = b·m + h.
//
// Buckets: the callers sort each pair's codes (stable; sorted codes and the token order, [B·m, n]
// int32 each). A bucket is a run of equal codes: a query finds its keys by binary search, and a
// bucket's table row is stored at the run's first sorted position, so tables hold at most n rows per
// pair whatever tau is. Every output element is written by one thread, in one order, with no
// atomics: results are bitwise repeatable.
//
// Workspace: each launcher that needs tables has a *_workspace function giving the floats it will
// use, at most max(workspace_bytes, one pair's tables) / 4 and at most the L2 cache per chunk of
// pairs (so a chunk's tables stay in L2 between their writing and their reading); the caller
// allocates that many and passes them in.
#pragma once

#include <stdint.h>

#include "yoso_simt.h"

namespace yoso {

// The device's L2 size in bytes (the emulation: an H100's 50 MB).
int64_t l2_cache_bytes();

// codes [B, m, n] (every one written) of x [B, n, d] under diagonals [B, R, 3, P].
cudaError_t launch_fast_hash(const float* x, const float* diagonals, int32_t* codes, int64_t B, int n, int d, int R,
                             int P, int m, int tau, cudaStream_t stream);

// out [B, nq, dv] += (1/m) sum_h sum_t weight_q[b,h|0,t,i] T_h[code_q(i), t], T_h[c, t] = sum_{code_k(j) = c}
// weight_k[b,h|0,t,j] v_j: p weight channels, weights [B, mq|mk (1 or m), p, n]; dv <= kMaxHeadDim.
int64_t cumulation_workspace(int64_t B, int m, int nk, int p, int dv, int64_t workspace_bytes);
cudaError_t launch_cumulation(const int32_t* codes_q, const int32_t* sorted_k, const int32_t* order_k,
                              const float* weight_q, int mq, const float* weight_k, int mk, int p, const float* values,
                              float* out, float* workspace, int64_t workspace_floats, int64_t B, int m, int nq, int nk,
                              int dv, int tau, cudaStream_t stream);

// The default backward (eq. 4 with exact pair weights): grad_q, grad_k [B, n, d] and grad_v [B, nk, dv]
// (zeroed by the caller) += the gradients of Y = (1/m) sum_h B_h (w . V). A bucket with many pairs goes
// through its dv x d tables (M = sum w v k^T for the queries, N = sum g q^T and sum g for the keys).
int64_t exact_backward_workspace(int64_t B, int m, int nq, int nk, int d, int dv, int64_t workspace_bytes);
cudaError_t launch_exact_backward(const int32_t* codes_q, const int32_t* codes_k, const int32_t* sorted_q,
                                  const int32_t* order_q, const int32_t* sorted_k, const int32_t* order_k,
                                  const float* q, const float* k, const float* v, const float* key_weight,
                                  const float* grad, float* grad_q, float* grad_k, float* grad_v, float* workspace,
                                  int64_t workspace_floats, int64_t B, int m, int nq, int nk, int d, int dv, int tau,
                                  cudaStream_t stream);

// The *YOSO backward (eq. 3): out [B, ns, d] (zeroed by the caller) += (1/m) sum_h sum_{o colliding}
// mask_o (s_s . w_o) rho(a_s . o_o) o_o.
cudaError_t launch_pair_gradient(const int32_t* codes_s, const int32_t* sorted_o, const int32_t* order_o,
                                 const float* a, const float* o, const float* s, const float* w,
                                 const float* mask_o, float* out, int64_t B, int m, int ns, int no, int d, int dv,
                                 int tau, float clamp, cudaStream_t stream);

// The largest head and value dims the gradient kernels keep per thread.
constexpr int kMaxHeadDim = 256;

}  // namespace yoso
