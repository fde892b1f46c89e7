// CUDA kernels of YOSO attention's forward: hashing and the LSH cumulation (yoso_cuda_kernels.h).
// Plain CUDA through yoso_simt.h: no torch headers, so this file compiles with nvcc on any machine
// and, with -DYOSO_SIMT_EMULATION, with a host compiler to run on the CPU under the suite's sanitizers.
#include <algorithm>

#include "yoso_cuda_common.h"
#include "yoso_cuda_kernels.h"
#include "yoso_math.h"

namespace yoso {
namespace {

constexpr int kMaxCodesPerThread = 16;  // P ≤ 4096 coordinates over ≥ 256 threads
constexpr int kRowsPerBlock = 8;        // warps per block: one sorted position or one query each
constexpr int kValueSlots = 4;          // value coordinates per lane and tile kept in registers
constexpr int kValueTiles = 2;          // tiles of 32 · 4 coordinates: dv ≤ 256

// One block per token: x (once) and the product being computed live in shared memory; thread t
// holds the bits of codes t, t + blockDim, … in registers and writes each code once, after its last
// bit. Product r = g·tau + t gives bit t of hashes g·P … g·P + P − 1 (one coordinate each).
YOSO_GLOBAL void fast_hash_kernel(const float* x, const float* diagonals, int32_t* codes, int n, int d, int R, int P,
                                  int m, int tau) {
  YOSO_DYNAMIC_SHARED(float, shared);
  float* buffer = shared;      // P floats: the product
  float* token = shared + P;   // d floats: x
  const int64_t row = blockIdx.x;
  const int64_t b = row / n, i = row % n;
  for (int t = threadIdx.x; t < d; t += blockDim.x) token[t] = load(x + row * d + t);
  int32_t bits[kMaxCodesPerThread];
  for (int u = 0; u < kMaxCodesPerThread; ++u) bits[u] = 0;
  __syncthreads();
  for (int r = 0; r < R; ++r) {
    const float* diag = diagonals + ((b * R + r) * 3) * P;
    for (int t = threadIdx.x; t < P; t += blockDim.x) buffer[t] = (t < d ? token[t] : 0.0f) * load(diag + t);
    __syncthreads();
    for (int stage = 0; stage < 3; ++stage) {
      if (stage > 0) {
        for (int t = threadIdx.x; t < P; t += blockDim.x) buffer[t] *= load(diag + stage * P + t);
        __syncthreads();
      }
      for (int half = 1; half < P; half *= 2) {
        for (int index = threadIdx.x; index < P / 2; index += blockDim.x) hadamard_butterfly(buffer, half, index);
        __syncthreads();
      }
    }
    const int group = r / tau, bit = r % tau;
    for (int u = 0; u < kMaxCodesPerThread; ++u) {
      const int c = threadIdx.x + u * blockDim.x;
      if (c < P) bits[u] |= (buffer[c] > 0.0f ? 1 : 0) << bit;
    }
    if (bit == tau - 1 || r == R - 1) {
      for (int u = 0; u < kMaxCodesPerThread; ++u) {
        const int c = threadIdx.x + u * blockDim.x;
        if (c < P && group * P + c < m) store(codes + (b * m + group * P + c) * n + i, bits[u]);
        bits[u] = 0;
      }
    }
    __syncthreads();  // the next product overwrites the buffer
  }
}

// One warp per sorted key position of a pair of the chunk: the first position of a bucket sums the
// bucket's weighted values into its row, [p channels × dv], at that position. Lanes run over dv.
YOSO_GLOBAL void bucket_rows_kernel(const int32_t* sorted_k, const int32_t* order_k, const float* weight_k, int mk,
                                    int p, const float* values, float* rows, int64_t first_pair, int m, int nk,
                                    int dv) {
  const int64_t local = blockIdx.y, pair = first_pair + local, b = pair / m, h = pair % m;
  const int t = blockIdx.x * kRowsPerBlock + threadIdx.y;
  if (t >= nk) return;
  const int32_t* sorted = sorted_k + pair * nk;
  const int32_t code = load(sorted + t);
  if (t > 0 && load(sorted + t - 1) == code) return;  // inside a bucket: its first position sums it
  const int32_t* order = order_k + pair * nk;
  const float* weight = weight_k + (b * mk + (mk == 1 ? 0 : h)) * int64_t(p) * nk;
  float* row = rows + (local * nk + t) * int64_t(p) * dv;
  for (int c = 0; c < p; ++c) {
    for (int l = threadIdx.x; l < dv; l += kWarp) {
      float sum = 0.0f;
      for (int r = t; r < nk && load(sorted + r) == code; ++r) {
        const int32_t j = load(order + r);
        const float w = load(weight + int64_t(c) * nk + j);
        if (w != 0.0f) sum += w * load(values + (b * nk + j) * dv + l);
      }
      store(row + int64_t(c) * dv + l, sum);
    }
  }
}

// One warp per query of a batch element of the chunk. The warp's lanes find the query's bucket under 32
// hashes at once (a lane per hash: its code, a binary search) and leave the positions in shared
// memory; then every lane sums its value coordinates of the found rows, over every hash of the
// chunk, in registers, and adds them to its output once (a single writer: no atomics). dv <= 256.
YOSO_GLOBAL void gather_rows_kernel(const int32_t* codes_q, const int32_t* sorted_k, const float* weight_q, int mq,
                                    int p, const float* rows, float* out, int64_t first_pair, int64_t end_pair, int m,
                                    int nq, int nk, int dv, int tau, float inv_m) {
  YOSO_DYNAMIC_SHARED(int, found);  // [kRowsPerBlock][kWarp]: a row's position under each hash of the group
  int* position = found + threadIdx.y * kWarp;
  const int64_t b = first_pair / m + blockIdx.y;
  const int i = blockIdx.x * kRowsPerBlock + threadIdx.y;
  const bool valid = i < nq;  // no early return: every thread meets the block's barriers
  const HashRange hashes = chunk_hashes(b, m, first_pair, end_pair);
  float sum[kValueTiles][kValueSlots];
  for (int tile = 0; tile < kValueTiles; ++tile) {
    for (int s = 0; s < kValueSlots; ++s) sum[tile][s] = 0.0f;
  }
  for (int64_t group = hashes.begin; group < hashes.end; group += kWarp) {
    const int64_t h = group + threadIdx.x;
    int t = -1;
    if (valid && h < hashes.end) {
      const int64_t pair = b * m + h;
      const int32_t code = checked_code(codes_q, pair * nq + i, tau);
      const int32_t* sorted = sorted_k + pair * nk;
      const int at = lower_bound(sorted, nk, code);
      if (at < nk && load(sorted + at) == code) t = at;  // else no key in this bucket
    }
    position[threadIdx.x] = t;
    __syncthreads();
    const int count = static_cast<int>(hashes.end - group < kWarp ? hashes.end - group : kWarp);
    for (int u = 0; valid && u < count; ++u) {
      const int row_at = position[u];
      if (row_at < 0) continue;
      const int64_t pair = b * m + group + u;
      const float* row = rows + ((pair - first_pair) * nk + row_at) * int64_t(p) * dv;
      const float* weight = weight_q + (b * mq + (mq == 1 ? 0 : group + u)) * int64_t(p) * nq + i;
      for (int c = 0; c < p; ++c) {
        const float w = load(weight + int64_t(c) * nq);
        if (w == 0.0f) continue;
        for (int tile = 0; tile < kValueTiles; ++tile) {
          for (int s = 0; s < kValueSlots; ++s) {
            const int l = (tile * kValueSlots + s) * kWarp + threadIdx.x;
            if (l < dv) sum[tile][s] += w * load(row + int64_t(c) * dv + l);
          }
        }
      }
    }
    __syncthreads();  // the next group overwrites the positions
  }
  if (!valid) return;
  for (int tile = 0; tile < kValueTiles; ++tile) {
    for (int s = 0; s < kValueSlots; ++s) {
      const int l = (tile * kValueSlots + s) * kWarp + threadIdx.x;
      if (l < dv) {
        float* y = out + (b * nq + i) * dv + l;
        store(y, load(y) + inv_m * sum[tile][s]);
      }
    }
  }
}

int threads_for(int width) { return std::min(256, std::max(32, (width + 31) / 32 * 32)); }

}  // namespace

int64_t l2_cache_bytes() {
  int device = 0, bytes = 0;
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, device) != cudaSuccess ||
      bytes <= 0) {
    return int64_t(40) << 20;  // an A100's, if the device does not say
  }
  return bytes;
}

cudaError_t launch_fast_hash(const float* x, const float* diagonals, int32_t* codes, int64_t B, int n, int d, int R,
                             int P, int m, int tau, cudaStream_t stream) {
  if (B * n == 0) return cudaSuccess;
  if (P > kMaxCodesPerThread * 256 || B * n > 2147483647) return cudaErrorInvalidValue;  // grid.x: one block a token
  return YOSO_LAUNCH(fast_hash_kernel, dim3(static_cast<unsigned>(B * n)), dim3(threads_for(P / 2)),
                     (P + d) * sizeof(float), stream, x, diagonals, codes, n, d, R, P, m, tau);
}

int64_t cumulation_workspace(int64_t B, int m, int nk, int p, int dv, int64_t workspace_bytes) {
  const int64_t per_pair = int64_t(nk) * p * dv;
  return pairs_per_chunk(B * m, per_pair, workspace_bytes, l2_cache_bytes()) * per_pair;
}

cudaError_t launch_cumulation(const int32_t* codes_q, const int32_t* sorted_k, const int32_t* order_k,
                              const float* weight_q, int mq, const float* weight_k, int mk, int p, const float* values,
                              float* out, float* workspace, int64_t workspace_floats, int64_t B, int m, int nq, int nk,
                              int dv, int tau, cudaStream_t stream) {
  const int64_t total = B * m, per_pair = int64_t(nk) * p * dv;
  if (total == 0 || nq == 0 || nk == 0 || dv == 0) return cudaSuccess;
  if (dv > kValueTiles * kValueSlots * kWarp) return cudaErrorInvalidValue;  // the wrapper says so first
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(workspace_floats / per_pair, 65535));
  const dim3 block(kWarp, kRowsPerBlock);
  for (int64_t first = 0; first < total; first += chunk) {
    const int64_t end = std::min(total, first + chunk);
    cudaError_t status = YOSO_LAUNCH(bucket_rows_kernel,
                                     dim3((nk + kRowsPerBlock - 1) / kRowsPerBlock, static_cast<unsigned>(end - first)),
                                     block, 0, stream, sorted_k, order_k, weight_k, mk, p, values, workspace, first, m,
                                     nk, dv);
    if (status != cudaSuccess) return status;
    const int64_t batches = (end - 1) / m - first / m + 1;
    status = YOSO_LAUNCH(gather_rows_kernel,
                         dim3((nq + kRowsPerBlock - 1) / kRowsPerBlock, static_cast<unsigned>(batches)), block,
                         kRowsPerBlock * kWarp * sizeof(int), stream, codes_q, sorted_k, weight_q, mq, p, workspace, out, first, end, m, nq, nk, dv, tau,
                         1.0f / m);
    if (status != cudaSuccess) return status;
  }
  return cudaSuccess;
}

}  // namespace yoso
