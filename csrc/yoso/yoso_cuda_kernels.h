// Launchers of the YOSO CUDA kernels (yoso_cuda_kernels.cu), called from yoso_cuda.cpp.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace yoso {

// Largest number of (batch, hash) tables one cumulation chunk may use: grid.y of its kernels.
constexpr int64_t kMaxTablesPerChunk = 65535;

cudaError_t launch_fast_hash(const float* x, const float* diagonals, int32_t* codes, int64_t B, int n, int d,
                             int R, int P, int m, int tau, cudaStream_t stream);

// `tables` holds `table_pairs` tables of 2^tau × p × dv floats (p weight channels); the (batch, hash) pairs are processed
// in chunks of that many, so memory stays bounded whatever B·m is.
cudaError_t launch_cumulation(const int32_t* codes_q, const int32_t* codes_k, const float* weight_q, int mq,
                              const float* weight_k, int mk, int p, const float* values, float* out, float* tables,
                              int64_t table_pairs, int64_t B, int m, int nq, int nk, int dv, int tau,
                              cudaStream_t stream);

cudaError_t launch_pair_gradient(const int32_t* codes_s, const int32_t* sorted_o, const int32_t* order_o,
                                 const float* a, const float* o, const float* s, const float* w,
                                 const float* mask_o, float* out, int64_t B, int m, int ns, int no, int d, int dv,
                                 int tau, float clamp, cudaStream_t stream);

}  // namespace yoso
