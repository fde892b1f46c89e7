// Device helpers shared by the YOSO CUDA kernels (yoso_cuda_*.cu): binary search in sorted codes, the
// code check, and the team: the lanes of a warp that hold one token's rows between them.
#pragma once

#include <stdint.h>

#include <initializer_list>

#include "yoso_cuda_kernels.h"
#include "yoso_simt.h"

namespace yoso {

constexpr int kWarp = 32;

// Lets `kernel` launch with `bytes` of dynamic shared memory: past the kTableBytes every kernel may use, the
// kernel is opted into `most`, the device's largest block (always that, so that no call lowers another's).
// A refusal is returned cleared, as a launch's error is (YOSO_LAUNCH).
template <typename Kernel>
cudaError_t allow_shared_bytes(Kernel kernel, int64_t bytes, int64_t most) {
  if (bytes <= kTableBytes) return cudaSuccess;
  if (bytes > most || most > 2147483647) return cudaErrorInvalidValue;  // the host checks first
  const cudaError_t status =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(most));
  if (status != cudaSuccess) cudaGetLastError();
  return status;
}

// The first position of a sorted run [0, count) whose value is not below `value`.
YOSO_DEVICE int lower_bound(const int32_t* sorted, int count, int32_t value) {
  int low = 0, high = count;
  while (low < high) {
    const int mid = (low + high) >> 1;
    if (load(sorted + mid) < value) low = mid + 1; else high = mid;
  }
  return low;
}

// The first position of `code` in a sorted run of `count` codes, or -1 when the run lacks it.
YOSO_DEVICE int find_first(const int32_t* sorted, int count, int32_t code) {
  const int at = lower_bound(sorted, count, code);
  return at < count && load(sorted + at) == code ? at : -1;
}

// The first position of `code` in a pair's sorted codes, or -1: one load from the pair's run starts
// (launch_run_starts) where the host made them, else a binary search.
YOSO_DEVICE int run_of(const int32_t* starts, int64_t pair, int tau, const int32_t* sorted, int count, int32_t code) {
  return starts != nullptr ? load(starts + (pair << tau) + code) : find_first(sorted, count, code);
}

// The code at codes[index], trapped unless it is a tau-bit code (see YOSO_TRAP: a trap ends the CUDA
// context; the host never passes such codes unless they were corrupted).
YOSO_DEVICE int32_t checked_code(const int32_t* codes, int64_t index, int tau) {
  const int32_t code = load(codes + index);
  YOSO_TRAP(code >= 0 && code < (int32_t(1) << tau));
  return code;
}

// A bfloat16's float32: its 16 bits are the top half of the float's (exact: no rounding on the way in).
YOSO_DEVICE float widened(uint32_t bf16) { return __uint_as_float(bf16 << 16); }

// A float32 rounded to bfloat16 (to nearest, ties to even; a NaN to the quiet NaN 0x7FC0), as torch rounds: its 16
// bits.
YOSO_DEVICE uint32_t rounded_bf16(float x) {
  const uint32_t bits = __float_as_uint(x);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
  return (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
}

// Element `index` of a row matrix, as a float32.
YOSO_DEVICE float element(const Rows& rows, int64_t index) {
  return rows.bf16 ? widened(load(static_cast<const uint16_t*>(rows.data) + index))
                   : load(static_cast<const float*>(rows.data) + index);
}

// One token's vectors split over a team of consecutive lanes. D > 0 (16, 32, 64, 128; the head dim and
// the value dim both D): L = D/C lanes, lane `rank` holding the float4s rank, rank + L, … of a row (C/4 of
// them: each float4 load or store of the team contiguous; rows 16-byte aligned; C = 8 halves the lanes a token
// takes for twice the registers a lane, so that an SM holds more tokens where its threads or registers bound
// it). D = 0 (any dims up to kMaxHeadDim): 32 lanes, lane `rank` holding coordinates rank, rank + 32, … below
// the row's width. Every vector lives in registers.
template <int D, int C = 4>
struct Team {
  static constexpr int kLanes = D == 0 ? kWarp : D / C;
  static constexpr int kSlots = D == 0 ? kMaxHeadDim / kWarp : C;
  static_assert(D == 0 || D == 16 || D == 32 || D == 64 || D == 128, "teams of 2 to 32 lanes");
  static_assert(C == 4 || C == 8, "4 or 8 coordinates a lane");

  int rank;       // this lane's place in the team
  unsigned mask;  // the team's lanes in the warp

  YOSO_DEVICE static Team of_thread() {
    const unsigned lane = threadIdx.x & (kWarp - 1);
    const unsigned first = lane & ~unsigned(kLanes - 1);
    return {static_cast<int>(lane - first), (kLanes == kWarp ? 0xffffffffu : ((1u << kLanes) - 1u)) << first};
  }
  // D > 0: this lane's f-th group of 4 coordinates (slots 4f … 4f + 3) in a row of such groups (float4 or a
  // bfloat16 uint2). The lane's offset added to the row first, as one pointer the f-th adds a constant to.
  template <typename Group>
  YOSO_DEVICE Group* quad(Group* row, int f) const { return row + rank + kLanes * f; }
  YOSO_DEVICE int coordinate(int s) const {
    return D == 0 ? s * kWarp + rank : (s / 4) * (4 * kLanes) + rank * 4 + s % 4;
  }

  // This lane's coordinates of row[0, width) (0 past the width).
  YOSO_DEVICE void read(const float* row, int width, float (&x)[kSlots]) const {
    if constexpr (D > 0) {
#pragma unroll
      for (int f = 0; f < C / 4; ++f) {
        const float4 packed = load(quad(reinterpret_cast<const float4*>(row), f));
        x[4 * f] = packed.x, x[4 * f + 1] = packed.y, x[4 * f + 2] = packed.z, x[4 * f + 3] = packed.w;
      }
    } else {
#pragma unroll
      for (int s = 0; s < kSlots; ++s) x[s] = coordinate(s) < width ? load(row + coordinate(s)) : 0.0f;
    }
  }
  // This lane's coordinates of row `row` of a row matrix `width` wide (float32 or bfloat16: four bfloat16s
  // are one 8-byte load, D > 0).
  YOSO_DEVICE void read(const Rows& rows, int64_t row, int width, float (&x)[kSlots]) const {
    if (!rows.bf16) {
      read(static_cast<const float*>(rows.data) + row * width, width, x);
    } else if constexpr (D > 0) {
      const uint2* at = reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(rows.data) + row * width);
#pragma unroll
      for (int f = 0; f < C / 4; ++f) {
        const uint2 packed = load(quad(at, f));
        x[4 * f] = widened(packed.x & 0xffffu), x[4 * f + 1] = __uint_as_float(packed.x & 0xffff0000u);
        x[4 * f + 2] = widened(packed.y & 0xffffu), x[4 * f + 3] = __uint_as_float(packed.y & 0xffff0000u);
      }
    } else {
#pragma unroll
      for (int s = 0; s < kSlots; ++s) x[s] = coordinate(s) < width ? element(rows, row * width + coordinate(s)) : 0.0f;
    }
  }
  // row[coordinate] = x for this lane's coordinates below the width.
  YOSO_DEVICE void write(float* row, int width, const float (&x)[kSlots]) const {
    if constexpr (D > 0) {
#pragma unroll
      for (int f = 0; f < C / 4; ++f) {
        store(quad(reinterpret_cast<float4*>(row), f), float4{x[4 * f], x[4 * f + 1], x[4 * f + 2], x[4 * f + 3]});
      }
    } else {
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        if (coordinate(s) < width) store(row + coordinate(s), x[s]);
      }
    }
  }
  // row[coordinate] = x rounded to bfloat16 (four to an 8-byte store, D > 0), below the width.
  YOSO_DEVICE void write_bf16(uint16_t* row, int width, const float (&x)[kSlots]) const {
    if constexpr (D > 0) {
#pragma unroll
      for (int f = 0; f < C / 4; ++f) {
        store(quad(reinterpret_cast<uint2*>(row), f),
              uint2{rounded_bf16(x[4 * f]) | rounded_bf16(x[4 * f + 1]) << 16,
                    rounded_bf16(x[4 * f + 2]) | rounded_bf16(x[4 * f + 3]) << 16});
      }
    } else {
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        if (coordinate(s) < width) store(row + coordinate(s), static_cast<uint16_t>(rounded_bf16(x[s])));
      }
    }
  }
  // row[coordinate] += x, atomically (other teams add to the same rows).
  YOSO_DEVICE void add(float* row, int width, const float (&x)[kSlots]) const {
    if constexpr (D > 0) {
#pragma unroll
      for (int f = 0; f < C / 4; ++f) {
        atomic_add4(quad(reinterpret_cast<float4*>(row), f),
                    float4{x[4 * f], x[4 * f + 1], x[4 * f + 2], x[4 * f + 3]});
      }
    } else {
#pragma unroll
      for (int s = 0; s < kSlots; ++s) {
        if (coordinate(s) < width) atomic_add(row + coordinate(s), x[s]);
      }
    }
  }
  // The dot product of two rows, each held as this team holds them: every lane gets the same sum (a
  // butterfly over the team's lanes, in one fixed order).
  YOSO_DEVICE float dot(const float (&x)[kSlots], const float (&y)[kSlots]) const {
    float sums[1] = {0.0f};
#pragma unroll
    for (int s = 0; s < kSlots; ++s) sums[0] += x[s] * y[s];
    reduce(sums);
    return sums[0];
  }
  template <int N>
  YOSO_DEVICE void reduce(float (&sums)[N]) const {
#pragma unroll
    for (int half = kLanes / 2; half > 0; half >>= 1) {
      float other[N];
#pragma unroll
      for (int k = 0; k < N; ++k) other[k] = sums[k];
      exchange_xor(mask, other, half);
#pragma unroll
      for (int k = 0; k < N; ++k) sums[k] += other[k];
    }
  }
  // sum[e] += Σ_l x_l · table[l][e] over l < length, x row `row` of a row matrix `length` wide (table rows
  // `width` floats apart, 16-byte aligned when D > 0), for this lane's coordinates e: a vector (whose
  // coordinates are read whole, the same address for every lane of the team) times a table.
  YOSO_DEVICE void add_times_table(const Rows& x, int64_t row, int length, const float* table, int width,
                                   float (&sum)[kSlots]) const {
    for (int l = 0; l < length; ++l) {
      const float a = element(x, row * length + l);
      float t[kSlots];
      read(table + int64_t(l) * width, width, t);
#pragma unroll
      for (int s = 0; s < kSlots; ++s) sum[s] += a * t[s];
    }
  }
};

// Global memory of a 16-byte-aligned row layout: every pointer aligned, so float4 accesses are legal.
inline bool aligned16(const void* pointer) { return (reinterpret_cast<uintptr_t>(pointer) & 15) == 0; }

// The Team instance for (d, dv): D when both are D and every row is 16-byte aligned, else 0 (any dims).
inline int instance(int d, int dv, std::initializer_list<const void*> rows) {
  if (d != dv || (d != 16 && d != 32 && d != 64 && d != 128)) return 0;
  for (const void* row : rows) {
    if (row != nullptr && !aligned16(row)) return 0;
  }
  return d;
}

// Coordinates a lane in the teams of the kernels that wait on chains of dependent loads (bucket_rows,
// query_gradients, key_gradients): a token on half the lanes lets an SM hold more tokens at once where its
// threads or registers bound them (Team's C).
constexpr int kChainedCoords = 8;

// Teams in blocks of kTeamThreads threads: the team of this thread (x counts teams), and the blocks for `teams`.
constexpr int kTeamThreads = 128;
template <int D, int C = 4>
YOSO_DEVICE int64_t team_index() {
  return (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / Team<D, C>::kLanes;
}
inline unsigned blocks_for(int64_t teams, int lanes) {
  return static_cast<unsigned>((teams * lanes + kTeamThreads - 1) / kTeamThreads);
}

}  // namespace yoso
