// The few CUDA constructs the YOSO kernels use, spelled so that one source compiles two ways: with
// nvcc for the GPU, or with a host C++20 compiler and -DYOSO_SIMT_EMULATION to run on the CPU
// (tests/simt/runtime.cpp implements the emulation; tests/test_cuda_emulation.py runs it).
//
// The emulation runs every CUDA thread as a fiber (its own stack, switched in user space) and a launch's
// blocks on two host threads at once, in a seeded random order, with the threads of a block resumed in
// a seeded random order too (in every other block, one warp at a time as far as it can go): so a race
// between blocks is a race between host threads (ThreadSanitizer reports it), and a barrier or warp
// exchange that is missing lets a thread read what another has not written yet, or overwrite what
// another has not read yet. __syncthreads, __syncwarp, the warp shuffles and __match_any_sync are real
// rendezvous: a barrier that some threads of a block skip, or a shuffle whose mask names a lane that never
// comes, aborts with a message instead of hanging. Dynamic shared memory starts every block filled with the
// word 0x7FA5A5A5 (a NaN as a float, a large positive number as an int: neither 0 nor -1, the kernels'
// sentinels). CUDA's launch limits are asserted on every launch, atomicAdd is
// std::atomic_ref<float>::fetch_add, and yoso::load / store / atomic_add are counted per launch (tests
// compare the cost model's bytes; yoso::shared_add, into shared memory, is not).
#pragma once

#include <stdint.h>

#if !defined(YOSO_SIMT_EMULATION)  // ------------------------------------------------------- CUDA

#include <cuda_runtime.h>

#if defined(__CUDACC__)  // the kernels' spelling; a host file (the torch wrappers) needs only the types
#define YOSO_GLOBAL __global__
#define YOSO_DEVICE __device__ __forceinline__
// A kernel's registers capped so that `blocks` blocks of `threads` fit an SM, on the architectures where ptxas
// then spills nothing (tests/test_kernel_build.py compiles every one the Docker image builds); elsewhere (sm_86,
// sm_89, sm_100, sm_120 spill 8-36 bytes under the cap) the kernel is left uncapped.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 750 || __CUDA_ARCH__ == 800 || __CUDA_ARCH__ == 900)
#define YOSO_LAUNCH_BOUNDS(threads, blocks) __launch_bounds__(threads, blocks)
#else
#define YOSO_LAUNCH_BOUNDS(threads, blocks)
#endif
// Launch and return the launch's own error, cleared (cudaGetLastError), so that the caller reports it as
// this kernel's and the next, unrelated CUDA call does not raise it again; execution errors surface at the
// next sync. The torch wrappers clear nothing of others': an error pending before a YOSO op is raised,
// named as an earlier operation's, before its first launch (yoso_cuda.cpp).
#define YOSO_LAUNCH(kernel, grid, block, shared, stream, ...) \
  (kernel<<<(grid), (block), (shared), (stream)>>>(__VA_ARGS__), cudaGetLastError())
#define YOSO_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
// A code outside [0, 2^tau) would index past a table: the kernel stops the device. This is a sticky
// error: the CUDA context is unusable afterwards (every later CUDA call in the process fails), so the
// process must restart. The host checks shapes; only corrupted codes can reach it.
#define YOSO_TRAP(condition)    \
  do {                          \
    if (!(condition)) __trap(); \
  } while (0)

namespace yoso {
template <typename T>
__device__ __forceinline__ T load(const T* address) {
  return *address;
}
template <typename T>
__device__ __forceinline__ void store(T* address, T value) {
  *address = value;
}
// A float added to global memory by one atomic instruction (a reduction: its result is not read back).
__device__ __forceinline__ void atomic_add(float* address, float value) { atomicAdd(address, value); }
// Four consecutive floats (16-byte aligned) added atomically: one vector atomic from sm_90 on (one update of
// their 32-byte sector instead of four), four scalar ones before.
__device__ __forceinline__ void atomic_add4(float4* address, float4 value) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(address, value);
#else
  atomicAdd(&address->x, value.x);
  atomicAdd(&address->y, value.y);
  atomicAdd(&address->z, value.z);
  atomicAdd(&address->w, value.w);
#endif
}
// A float added to a block's shared memory atomically (not counted with global memory's atomics).
__device__ __forceinline__ void shared_add(float* address, float value) { atomicAdd(address, value); }
// A shared counter incremented atomically: its value before.
__device__ __forceinline__ int shared_increment(int* address) { return atomicAdd(address, 1); }
// values of this lane replaced by those of lane (lane ^ lane_mask) of the same warp; every lane named in
// `mask` takes part with the same mask.
template <int COUNT>
__device__ __forceinline__ void exchange_xor(unsigned mask, float (&values)[COUNT], int lane_mask) {
#pragma unroll
  for (int s = 0; s < COUNT; ++s) values[s] = __shfl_xor_sync(mask, values[s], lane_mask);
}
}  // namespace yoso
#endif

#else  // ------------------------------------------------------------------------------------ emulation

#include <atomic>
#include <cstring>
#include <functional>
#include <string>

#define YOSO_GLOBAL
#define YOSO_DEVICE inline
#define YOSO_LAUNCH_BOUNDS(threads, blocks)
#define __host__
#define __device__
#define __forceinline__ inline

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct alignas(16) float4 {  // (aligned as CUDA's: a misaligned vector access is UBSan's to report)
  float x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned x, y;
};
inline float __uint_as_float(unsigned bits) {
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}
inline unsigned __float_as_uint(float value) {
  unsigned bits;
  std::memcpy(&bits, &value, 4);
  return bits;
}
using cudaStream_t = void*;
enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorInvalidConfiguration = 9 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
inline const char* cudaGetErrorString(cudaError_t error) { return error == cudaSuccess ? "no error" : "emulated error"; }
inline cudaError_t cudaGetLastError() { return cudaSuccess; }

namespace simt {

[[noreturn]] void fail(const std::string& message);

// The CUDA thread running now: its index in the block, and what it loaded, stored and added atomically.
struct Thread {
  dim3 index;
  int64_t loaded = 0, stored = 0, atomic = 0;
};
Thread& this_thread();
const dim3& block_index();
const dim3& block_dim();
const dim3& grid_dim();
unsigned char* block_shared();

// Runs body() as every thread of every block of grid (after checking CUDA's limits for `name`).
cudaError_t run_grid(const char* name, const void* kernel, dim3 grid, dim3 block, int64_t shared_bytes,
                     const std::function<void()>& body);
cudaError_t set_shared_opt_in(const void* kernel, int value);

// The warp rendezvous: every lane named in `mask` arrives with the same mask; each receives `words`
// 32-bit words sent by `source` (a lane of the mask, or -1 for none: a plain __syncwarp).
void warp_exchange(unsigned mask, const uint32_t* send, uint32_t* receive, int words, int source);
void block_barrier();

template <typename Params, typename... Args>
cudaError_t launch(const char* name, Params kernel, dim3 grid, dim3 block, int64_t shared_bytes, Args... args) {
  const std::function<void()> body = [&] { kernel(args...); };
  return run_grid(name, reinterpret_cast<const void*>(kernel), grid, block, shared_bytes, body);
}

inline unsigned lane_id() {
  const dim3 &t = this_thread().index, &b = block_dim();
  return (t.x + b.x * (t.y + b.y * t.z)) % 32;
}

template <typename T>
T shuffle(unsigned mask, T value, int source) {
  static_assert(sizeof(T) == 4, "32-bit shuffles only");
  uint32_t word, received;
  std::memcpy(&word, &value, 4);
  warp_exchange(mask, &word, &received, 1, source);
  std::memcpy(&value, &received, 4);
  return value;
}

}  // namespace simt

#define threadIdx (::simt::this_thread().index)
#define blockIdx (::simt::block_index())
#define blockDim (::simt::block_dim())
#define gridDim (::simt::grid_dim())

inline void __syncthreads() { simt::block_barrier(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { simt::warp_exchange(mask, nullptr, nullptr, 0, -1); }
template <typename T>
T __shfl_sync(unsigned mask, T value, int source, int width = 32) {
  return simt::shuffle(mask, value, int(simt::lane_id() & ~unsigned(width - 1)) + (source & (width - 1)));
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32) {
  const unsigned lane = simt::lane_id(), source = lane ^ unsigned(lane_mask);
  return simt::shuffle(mask, value, int((source & ~unsigned(width - 1)) == (lane & ~unsigned(width - 1)) ? source : lane));
}
template <typename T>
T __shfl_up_sync(unsigned mask, T value, unsigned delta, int width = 32) {
  const unsigned lane = simt::lane_id();
  return simt::shuffle(mask, value, int((lane & unsigned(width - 1)) >= delta ? lane - delta : lane));
}
// The lanes of `mask` whose value equals this lane's: every lane's value gathered by one shuffle from each.
inline unsigned __match_any_sync(unsigned mask, int value) {
  unsigned peers = 0;
  for (int source = 0; source < 32; ++source) {
    if ((mask >> source) & 1u) peers |= unsigned(simt::shuffle(mask, value, source) == value) << source;
  }
  return peers;
}
inline int __popc(unsigned bits) { return __builtin_popcount(bits); }
[[noreturn]] inline void __trap() { simt::fail("a kernel trapped (__trap)"); }

template <typename Kernel>
inline cudaError_t cudaFuncSetAttribute(Kernel kernel, cudaFuncAttribute attribute, int value) {
  if (attribute != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaErrorInvalidValue;
  return simt::set_shared_opt_in(reinterpret_cast<const void*>(kernel), value);
}

#define YOSO_LAUNCH(kernel, grid, block, shared, stream, ...) \
  ::simt::launch(#kernel, kernel, (grid), (block), (shared), __VA_ARGS__)
#define YOSO_DYNAMIC_SHARED(type, name) type* name = reinterpret_cast<type*>(::simt::block_shared())
#define YOSO_TRAP(condition)                                                             \
  do {                                                                                   \
    if (!(condition)) ::simt::fail(std::string("device check failed: ") + #condition); \
  } while (0)

namespace yoso {
template <typename T>
inline T load(const T* address) {
  simt::this_thread().loaded += sizeof(T);
  return *address;
}
template <typename T>
inline void store(T* address, T value) {
  simt::this_thread().stored += sizeof(T);
  *address = value;
}
inline void atomic_add(float* address, float value) {
  simt::this_thread().atomic += sizeof(float);
  std::atomic_ref<float>(*address).fetch_add(value, std::memory_order_relaxed);
}
inline void atomic_add4(float4* address, float4 value) {
  if (reinterpret_cast<uintptr_t>(address) % 16 != 0) simt::fail("a vector atomic on an address not 16-byte aligned");
  atomic_add(&address->x, value.x);
  atomic_add(&address->y, value.y);
  atomic_add(&address->z, value.z);
  atomic_add(&address->w, value.w);
}
inline void shared_add(float* address, float value) {
  std::atomic_ref<float>(*address).fetch_add(value, std::memory_order_relaxed);
}
inline int shared_increment(int* address) {
  return std::atomic_ref<int>(*address).fetch_add(1, std::memory_order_relaxed);
}
template <int COUNT>
inline void exchange_xor(unsigned mask, float (&values)[COUNT], int lane_mask) {  // one rendezvous for all
  uint32_t words[COUNT];
  std::memcpy(words, values, sizeof(words));
  simt::warp_exchange(mask, words, words, COUNT, int(simt::lane_id() ^ unsigned(lane_mask)));
  std::memcpy(values, words, sizeof(words));
}
}  // namespace yoso

#endif
