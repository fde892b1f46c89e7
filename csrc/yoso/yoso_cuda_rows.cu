// CUDA kernels of unit rows (yoso_cuda_kernels.h, UnitRows): the default backward's, the unit rows of q and k
// the gradient kernels read, made in one launch for both sides, and the gradients pulled back through the
// normalization in one more, in place; and the output's (N-YOSO), one side, one launch forward and one
// backward. A team (yoso_cuda_common.h) per row, the arithmetic of yoso_math.h's unit_row_*. Through
// yoso_simt.h, as the others.
#include <math.h>

#include "yoso_cuda_common.h"
#include "yoso_cuda_kernels.h"
#include "yoso_math.h"

namespace yoso {
namespace {

// This thread's team, its side (block y: 0 queries, 1 keys) and its row there; past the side's rows, the whole
// team returns (its shuffles name its own lanes alone).
template <int D>
struct SideRow {
  Team<D> team;
  UnitRows side;
  int64_t row;
};
template <int D>
YOSO_DEVICE SideRow<D> side_row(const UnitRows& queries, const UnitRows& keys) {
  return {Team<D>::of_thread(), blockIdx.y == 0 ? queries : keys, team_index<D>()};
}

// A team per row of each side: its norm, and x / max(‖x‖, eps) as the side wants it.
template <int D>
YOSO_GLOBAL void unit_rows_kernel(UnitRows queries, UnitRows keys, int width, float eps) {
  using T = Team<D>;
  const auto [team, side, row] = side_row<D>(queries, keys);
  if (row >= side.rows) return;
  float x[T::kSlots];
  team.read(side.x + row * width, width, x);
  const float norm = sqrtf(team.dot(x, x)), divisor = unit_row_divisor(norm, eps);
#pragma unroll
  for (int s = 0; s < T::kSlots; ++s) x[s] /= divisor;
  if (side.bf16) {
    team.write_bf16(static_cast<uint16_t*>(side.unit) + row * width, width, x);
  } else {
    team.write(static_cast<float*>(side.unit) + row * width, width, x);
  }
  if (team.rank == 0) store(side.norms + row, norm);
}

// A team per row of each side: grad = (g − y (g·y)) / max(‖x‖, eps), y = x / max(‖x‖, eps) in float32 (where x
// is null: the float32 unit rows y as they were made).
template <int D>
YOSO_GLOBAL void through_unit_rows_kernel(UnitRows queries, UnitRows keys, int width, float eps) {
  using T = Team<D>;
  const auto [team, side, row] = side_row<D>(queries, keys);
  if (row >= side.rows) return;
  float g[T::kSlots], y[T::kSlots];
  team.read(side.incoming + row * width, width, g);
  const float norm = load(side.norms + row), divisor = unit_row_divisor(norm, eps);
  if (side.x != nullptr) {
    team.read(side.x + row * width, width, y);
#pragma unroll
    for (int s = 0; s < T::kSlots; ++s) y[s] /= divisor;
  } else {
    team.read(static_cast<const float*>(side.unit) + row * width, width, y);
  }
  const float along = unit_row_along(team.dot(g, y), norm, eps);  // (every lane takes part in the dot product)
#pragma unroll
  for (int s = 0; s < T::kSlots; ++s) g[s] = (g[s] - y[s] * along) / divisor;
  team.write(side.grad + row * width, width, g);
}

template <int D>
cudaError_t launch_sides(bool through, const UnitRows& queries, const UnitRows& keys, int width, float eps,
                         cudaStream_t stream) {
  const int64_t rows = queries.rows > keys.rows ? queries.rows : keys.rows;
  const dim3 grid(blocks_for(rows, Team<D>::kLanes), keys.rows > 0 ? 2 : 1);  // (one side: the output's)
  return through ? YOSO_LAUNCH(through_unit_rows_kernel<D>, grid, dim3(kTeamThreads), 0, stream, queries, keys, width, eps)
                 : YOSO_LAUNCH(unit_rows_kernel<D>, grid, dim3(kTeamThreads), 0, stream, queries, keys, width, eps);
}

cudaError_t launch(bool through, const UnitRows& queries, const UnitRows& keys, int width, float eps,
                   cudaStream_t stream) {
  if (width > kMaxHeadDim) return cudaErrorInvalidValue;  // the host logic says so first
  if (queries.rows + keys.rows == 0 || width == 0) return cudaSuccess;
  // (bfloat16 unit rows of a templated team: 8-byte stores, aligned where the float32 rows are 16-byte aligned)
  switch (instance(width, width, {queries.x, keys.x, queries.unit, keys.unit, queries.incoming, keys.incoming,
                                  queries.grad, keys.grad})) {
    case 16: return launch_sides<16>(through, queries, keys, width, eps, stream);
    case 32: return launch_sides<32>(through, queries, keys, width, eps, stream);
    case 64: return launch_sides<64>(through, queries, keys, width, eps, stream);
    case 128: return launch_sides<128>(through, queries, keys, width, eps, stream);
    default: return launch_sides<0>(through, queries, keys, width, eps, stream);
  }
}

}  // namespace

cudaError_t launch_unit_rows(const UnitRows& queries, const UnitRows& keys, int width, float eps,
                             cudaStream_t stream) {
  return launch(false, queries, keys, width, eps, stream);
}

cudaError_t launch_through_unit_rows(const UnitRows& queries, const UnitRows& keys, int width, float eps,
                                     cudaStream_t stream) {
  return launch(true, queries, keys, width, eps, stream);
}

}  // namespace yoso
