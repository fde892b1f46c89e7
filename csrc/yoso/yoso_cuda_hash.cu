// CUDA kernel of YOSO's hashing (yoso_cuda_kernels.h): codes of x under H D3 H D2 H D1, the
// Walsh–Hadamard transform done in registers and warp shuffles. Plain CUDA through yoso_simt.h.
#include <algorithm>

#include "yoso_cuda_common.h"
#include "yoso_cuda_kernels.h"

namespace yoso {
namespace {

// One token's padded vector (P = 2^k coordinates) is held by a group of G = P / S lanes, lane `rank`
// holding coordinates rank·S … rank·S + S − 1 in registers. A block holds T = blockDim / G consecutive
// tokens of one batch element. Each product is three rounds of a diagonal and a transform; stage
// `half` pairs coordinates c and c + half as (u + v, u − v): inside a lane while half < S, else with lane
// rank ^ (half / S) through a shuffle. The same pairs, operands and order as the CPU kernel and the
// PyTorch path: the codes are bitwise the same. A code's τ bits are gathered in registers and, after the
// product of its last bit, the group's P codes of the block's T tokens go through shared memory, so each
// hash's codes of the T tokens are stored side by side.
// At S = 128 (P = 4,096, 32 lanes a token) a lane's y alone fills half the registers a thread may have:
// kWide keeps its token in global memory (read again each product), its code bits in its own slots of
// the shared staging buffer, and exchanges y a chunk of 32 coordinates at a time, so nothing spills.
template <int S>
constexpr bool kWide = S > 64;

template <int S>
YOSO_DEVICE void transform(float (&y)[S], int rank, int P) {
#pragma unroll
  for (int half = 1; half < S; half <<= 1) {
#pragma unroll
    for (int s = 0; s < S; ++s) {
      if (!(s & half)) {
        const float u = y[s], v = y[s + half];
        y[s] = u + v;
        y[s + half] = u - v;
      }
    }
  }
  constexpr int K = kWide<S> ? 32 : S;  // coordinates a shuffle round exchanges
  for (int half = S; half < P; half <<= 1) {
    const int lane_mask = half / S;
    const bool lower = !(rank & lane_mask);
#pragma unroll
    for (int chunk = 0; chunk < S; chunk += K) {
      float other[K];
#pragma unroll
      for (int s = 0; s < K; ++s) other[s] = y[chunk + s];
      exchange_xor(0xffffffffu, other, lane_mask);
#pragma unroll
      for (int s = 0; s < K; ++s) y[chunk + s] = lower ? y[chunk + s] + other[s] : other[s] - y[chunk + s];
    }
  }
}

template <int S>
YOSO_GLOBAL void fast_hash_kernel(const float* x, const float* diagonals, int32_t* codes, int n, int d, int R, int P,
                                  int m, int tau, int group_shift, int tokens_shift, int tiles) {
  YOSO_DYNAMIC_SHARED(int32_t, staged);  // [P][T]: the current group's codes of the block's tokens
  const int tokens = 1 << tokens_shift;
  const int rank = threadIdx.x & ((1 << group_shift) - 1), slot = threadIdx.x >> group_shift;
  const int64_t b = blockIdx.x / tiles;
  const int first = (blockIdx.x - int(b * tiles)) << tokens_shift, i = first + slot;
  constexpr bool wide = kWide<S>;
  auto coordinate = [&](int s) {  // a token past n hashes zeros, unstored
    const int c = rank * S + s;
    return i < n && c < d ? load(x + (b * n + i) * d + c) : 0.0f;
  };
  int32_t* own = staged + ((rank * S) << tokens_shift) + slot;  // coordinate s's code: own[s << tokens_shift]
  float token[S];
  int32_t bits[S];  // (both unused when wide: the token is read again, the bits gather in `own`)
#pragma unroll
  for (int s = 0; s < S; ++s) {
    if constexpr (wide) {
      own[s << tokens_shift] = 0;
    } else {
      token[s] = coordinate(s);
      bits[s] = 0;
    }
  }
  int bit = 0, group = 0;
  for (int r = 0; r < R; ++r) {
    const float* diag = diagonals + (b * R + r) * 3 * P + rank * S;
    float y[S];
#pragma unroll
    for (int s = 0; s < S; ++s) {
      if constexpr (wide) {
        y[s] = coordinate(s) * load(diag + s);
      } else {
        y[s] = token[s] * load(diag + s);
      }
    }
    transform(y, rank, P);
#pragma unroll
    for (int s = 0; s < S; ++s) y[s] *= load(diag + P + s);
    transform(y, rank, P);
#pragma unroll
    for (int s = 0; s < S; ++s) y[s] *= load(diag + 2 * P + s);
    transform(y, rank, P);
#pragma unroll
    for (int s = 0; s < S; ++s) {
      if constexpr (wide) {
        own[s << tokens_shift] |= (y[s] > 0.0f ? 1 : 0) << bit;
      } else {
        bits[s] |= (y[s] > 0.0f ? 1 : 0) << bit;
      }
    }
    if (++bit < tau && r < R - 1) continue;
    // Product r = group·τ + bit gives bit `bit` of hashes group·P + c: the group's codes are complete.
    if constexpr (!wide) {
#pragma unroll
      for (int s = 0; s < S; ++s) {
        own[s << tokens_shift] = bits[s];
        bits[s] = 0;
      }
    }
    __syncthreads();
    for (int at = threadIdx.x; at < (P << tokens_shift); at += blockDim.x) {
      const int h = group * P + (at >> tokens_shift), token_at = first + (at & (tokens - 1));
      if (h < m && token_at < n) store(codes + (b * m + h) * n + token_at, staged[at]);
    }
    __syncthreads();  // the next group overwrites the staged codes
    if constexpr (wide) {
      for (int s = 0; s < S; ++s) own[s << tokens_shift] = 0;
    }
    bit = 0;
    ++group;
  }
}

template <int S>
cudaError_t launch_with(const float* x, const float* diagonals, int32_t* codes, int64_t B, int n, int d, int R,
                        int P, int m, int tau, cudaStream_t stream) {
  const int group = P / S, threads = std::min(128, 4096 / S), tokens = threads / group;
  int group_shift = 0, tokens_shift = 0;
  while ((1 << group_shift) < group) ++group_shift;
  while ((1 << tokens_shift) < tokens) ++tokens_shift;
  const int64_t tiles = (n + tokens - 1) / tokens;
  if (B * tiles > 2147483647) return cudaErrorInvalidValue;
  return YOSO_LAUNCH(fast_hash_kernel<S>, dim3(static_cast<unsigned>(B * tiles)), dim3(threads),
                     int64_t(P) * tokens * sizeof(int32_t), stream, x, diagonals, codes, n, d, R, P, m, tau,
                     group_shift, tokens_shift, static_cast<int>(tiles));
}

}  // namespace

// Coordinates per lane: P itself up to 32 (one lane a token: every stage in registers, no shuffle), 32 up to
// P = 1,024 (P / 32 lanes), then P / 32 (a warp a token). A lane holding more coordinates issues fewer
// instructions a token (a shuffle stage costs a shuffle and a select per coordinate). The cost model mirrors
// this choice and each instance's registers (lra/benchmarks/yoso_cost: hash_coordinates, HASH_REGISTERS).
cudaError_t launch_fast_hash(const float* x, const float* diagonals, int32_t* codes, int64_t B, int n, int d, int R,
                             int P, int m, int tau, cudaStream_t stream) {
  if (B * n == 0 || R == 0) return cudaSuccess;
  switch (P <= 32 ? P : P <= 1024 ? 32 : P / 32) {
    case 1: return launch_with<1>(x, diagonals, codes, B, n, d, R, P, m, tau, stream);
    case 2: return launch_with<2>(x, diagonals, codes, B, n, d, R, P, m, tau, stream);
    case 4: return launch_with<4>(x, diagonals, codes, B, n, d, R, P, m, tau, stream);
    case 8: return launch_with<8>(x, diagonals, codes, B, n, d, R, P, m, tau, stream);
    case 16: return launch_with<16>(x, diagonals, codes, B, n, d, R, P, m, tau, stream);
    case 32: return launch_with<32>(x, diagonals, codes, B, n, d, R, P, m, tau, stream);
    case 64: return launch_with<64>(x, diagonals, codes, B, n, d, R, P, m, tau, stream);
    case 128: return launch_with<128>(x, diagonals, codes, B, n, d, R, P, m, tau, stream);
    default: return cudaErrorInvalidValue;  // P is a power of two up to 4096 (the bindings check)
  }
}

}  // namespace yoso
