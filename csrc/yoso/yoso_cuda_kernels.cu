// CUDA kernels of YOSO attention. Plain CUDA: no torch headers, so this file compiles with nvcc
// on any machine (the bindings live in yoso_cuda.cpp). Shapes as in yoso_cpu.cpp.
#include <cuda_runtime.h>

#include <algorithm>

#include "yoso_cuda_kernels.h"
#include "yoso_math.h"

namespace {

// One block per token: the vector padded to P lives in shared memory through the three
// Hadamard rounds of every product; each product then yields P / tau codes.
__global__ void fast_hash_kernel(const float* x, const float* diagonals, int32_t* codes, int n, int d, int R,
                                 int P, int m, int tau) {
  extern __shared__ float buffer[];
  const int64_t row = blockIdx.x;
  const int64_t b = row / n, i = row % n;
  for (int r = 0; r < R; ++r) {
    const float* diag = diagonals + ((b * R + r) * 3) * P;
    for (int t = threadIdx.x; t < P; t += blockDim.x) buffer[t] = (t < d ? x[row * d + t] : 0.0f) * diag[t];
    __syncthreads();
    for (int stage = 0; stage < 3; ++stage) {
      if (stage > 0) {
        for (int t = threadIdx.x; t < P; t += blockDim.x) buffer[t] *= diag[stage * P + t];
        __syncthreads();
      }
      for (int half = 1; half < P; half *= 2) {
        for (int index = threadIdx.x; index < P / 2; index += blockDim.x) yoso::hadamard_butterfly(buffer, half, index);
        __syncthreads();
      }
    }
    // Product r = g·tau + t gives bit t of hashes g·P … g·P + P − 1 (one coordinate each);
    // the codes start at zero (the launcher clears them).
    const int group = r / tau, bit = r % tau;
    for (int c = threadIdx.x; c < P && group * P + c < m; c += blockDim.x) {
      codes[(b * m + group * P + c) * n + i] |= (buffer[c] > 0.0f ? 1 : 0) << bit;
    }
    __syncthreads();
  }
}

// Tables for `pairs` consecutive (batch, hash) pairs starting at `first_pair` (= b·m + h); a table
// row holds one dv-vector per weight channel (p of them). Threads run over the p·dv cells of a row.
__global__ void scatter_kernel(const int32_t* codes_k, const float* weight_k, int mk, int p, const float* values,
                               float* tables, int64_t first_pair, int m, int nk, int dv, int tau) {
  const int64_t pair = first_pair + blockIdx.y;
  const int64_t b = pair / m, h = pair % m, j = blockIdx.x;
  const int64_t code = codes_k[pair * nk + j];
  const float* weights = weight_k + (b * mk + (mk == 1 ? 0 : h)) * p * nk + j;
  float* row = tables + ((static_cast<int64_t>(blockIdx.y) << tau) + code) * p * dv;
  const float* v = values + (b * nk + j) * dv;
  for (int cell = threadIdx.x; cell < p * dv; cell += blockDim.x) {
    const float weight = weights[(cell / dv) * nk];
    if (weight != 0.0f) atomicAdd(row + cell, weight * v[cell % dv]);
  }
}

__global__ void gather_kernel(const int32_t* codes_q, const float* weight_q, int mq, int p, const float* tables,
                              float* out, int64_t first_pair, int m, int nq, int dv, int tau, float inv_m) {
  const int64_t pair = first_pair + blockIdx.y;
  const int64_t b = pair / m, h = pair % m, i = blockIdx.x;
  const int64_t code = codes_q[pair * nq + i];
  const float* weights = weight_q + (b * mq + (mq == 1 ? 0 : h)) * p * nq + i;
  const float* row = tables + ((static_cast<int64_t>(blockIdx.y) << tau) + code) * p * dv;
  float* y = out + (b * nq + i) * dv;
  for (int l = threadIdx.x; l < dv; l += blockDim.x) {
    float sum = 0.0f;
    for (int t = 0; t < p; ++t) sum += weights[t * nq] * row[t * dv + l];
    if (sum != 0.0f) atomicAdd(y + l, sum * inv_m);
  }
}

__device__ int lower_bound(const int32_t* sorted, int count, int32_t value) {
  int low = 0, high = count;
  while (low < high) {
    const int mid = (low + high) / 2;
    if (sorted[mid] < value) low = mid + 1; else high = mid;
  }
  return low;
}

// One thread per (batch, hash, token s): every colliding o adds mask_o · (s_s·w_o) · ρ(a_s·o_o) · o_o / m.
__global__ void pair_gradient_kernel(const int32_t* codes_s, const int32_t* sorted_o, const int32_t* order_o,
                                     const float* a, const float* o, const float* s, const float* w,
                                     const float* mask_o, float* out, int64_t total, int m, int ns, int no, int d,
                                     int dv, int tau, float clamp, float inv_m) {
  const int64_t index = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (index >= total) return;
  const int64_t pair = index / ns, i = index % ns, b = pair / m;
  const int32_t code = codes_s[index];
  const int32_t* sorted = sorted_o + pair * no;
  const int first = lower_bound(sorted, no, code);
  const int last = lower_bound(sorted, no, code + 1);
  const float* ai = a + (b * ns + i) * d;
  const float* si = s + (b * ns + i) * dv;
  float* gi = out + (b * ns + i) * d;
  for (int position = first; position < last; ++position) {
    const int64_t j = order_o[pair * no + position];
    const float mask = mask_o[b * no + j];
    if (mask == 0.0f) continue;
    const float* oj = o + (b * no + j) * d;
    const float coefficient = mask * inv_m * yoso::pair_weight(ai, oj, si, w + (b * no + j) * dv, d, dv, tau, clamp);
    for (int l = 0; l < d; ++l) atomicAdd(gi + l, coefficient * oj[l]);
  }
}

int threads_for(int width) { return std::min(256, std::max(32, (width + 31) / 32 * 32)); }

}  // namespace

namespace yoso {

cudaError_t launch_fast_hash(const float* x, const float* diagonals, int32_t* codes, int64_t B, int n, int d,
                             int R, int P, int m, int tau, cudaStream_t stream) {
  if (B * n == 0) return cudaSuccess;
  const int threads = threads_for(P / 2);
  const cudaError_t status = cudaMemsetAsync(codes, 0, B * m * n * sizeof(int32_t), stream);
  if (status != cudaSuccess) return status;
  fast_hash_kernel<<<static_cast<unsigned>(B * n), threads, P * sizeof(float), stream>>>(x, diagonals, codes, n, d,
                                                                                          R, P, m, tau);
  return cudaGetLastError();
}

cudaError_t launch_cumulation(const int32_t* codes_q, const int32_t* codes_k, const float* weight_q, int mq,
                              const float* weight_k, int mk, int p, const float* values, float* out, float* tables,
                              int64_t table_pairs, int64_t B, int m, int nq, int nk, int dv, int tau,
                              cudaStream_t stream) {
  const int64_t total_pairs = B * m;
  const size_t table_bytes = (static_cast<size_t>(1) << tau) * p * dv * sizeof(float);
  for (int64_t first = 0; first < total_pairs; first += table_pairs) {
    const int64_t pairs = std::min(table_pairs, total_pairs - first);
    cudaError_t status = cudaMemsetAsync(tables, 0, pairs * table_bytes, stream);
    if (status != cudaSuccess) return status;
    if (nk > 0) {
      scatter_kernel<<<dim3(nk, static_cast<unsigned>(pairs)), threads_for(p * dv), 0, stream>>>(
          codes_k, weight_k, mk, p, values, tables, first, m, nk, dv, tau);
    }
    if (nq > 0) {
      gather_kernel<<<dim3(nq, static_cast<unsigned>(pairs)), threads_for(dv), 0, stream>>>(
          codes_q, weight_q, mq, p, tables, out, first, m, nq, dv, tau, 1.0f / m);
    }
    status = cudaGetLastError();
    if (status != cudaSuccess) return status;
  }
  return cudaSuccess;
}

cudaError_t launch_pair_gradient(const int32_t* codes_s, const int32_t* sorted_o, const int32_t* order_o,
                                 const float* a, const float* o, const float* s, const float* w,
                                 const float* mask_o, float* out, int64_t B, int m, int ns, int no, int d, int dv,
                                 int tau, float clamp, cudaStream_t stream) {
  const int64_t total = B * m * ns;
  if (total == 0) return cudaSuccess;
  const int threads = 128;
  const int64_t blocks = (total + threads - 1) / threads;
  pair_gradient_kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
      codes_s, sorted_o, order_o, a, o, s, w, mask_o, out, total, m, ns, no, d, dv, tau, clamp, 1.0f / m);
  return cudaGetLastError();
}

}  // namespace yoso
