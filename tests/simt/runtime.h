// What the emulation's test driver asks of the SIMT runtime (tests/simt/runtime.cpp) beyond the kernels'
// view of it in csrc/yoso/yoso_simt.h: the record of every launch, and the seed of its random orders.
#pragma once

#include <stdint.h>

#include <string>
#include <vector>

#include "yoso_simt.h"

namespace simt {

constexpr int64_t kOptInSharedLimit = 227 * 1024;  // an H100's largest opt-in: what cudaFuncSetAttribute allows

struct LaunchRecord {
  std::string kernel;
  dim3 grid, block;
  int64_t shared_bytes;
  int64_t loaded_bytes, stored_bytes, atomic_bytes;
};

// The seed of the order in which blocks are taken and a block's threads resumed (the same seed, the same
// orders: a run is repeatable; other seeds interleave differently).
void set_seed(uint64_t seed);
std::vector<LaunchRecord> launches();

}  // namespace simt
