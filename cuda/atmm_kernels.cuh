// ATMM CUDA C++ kernels: the host-side interface (no torch, no device code).
//
// Same semantics as the Triton kernels in sglang_vlora/atmm/triton_kernels.py:
//
//   shrink: out[row_start_i + j, 0:S*r_i]  = x[tok(seg_start_i + j)] @ A[slot_i, 0:S*r_i].T
//   expand: out[tok(seg_start_i + j), lo_s:hi_s] += scale_i *
//               inter[row_start_i + j, s*r_i:(s+1)*r_i] @ B[slot_i, lo_s:hi_s, 0:r_i].T
//
// for every work item i and token j < seg_len_i, where tok() is the optional token
// permutation and r_i = ranks[slot_i]. Items with seg_len 0 or rank 0 do nothing.
// Inputs are bf16 or fp16, products accumulate in fp32 on tensor cores (WMMA,
// sm_80+), cp.async multi-stage pipelines feed shared memory.
//
// Scheduling is the Triton kernels' flat scheme: grid.y enumerates row tiles; each
// block finds its (item, row tile) by a prefix sum over cdiv(seg_len, BLOCK_M) of the
// items (of its layer, for expand), so grid.y may be any upper bound of the tile count.
//
// Tile shapes are template arguments; the instantiated set is the X-macro lists
// below (mirrored in sglang_vlora/atmm/tiling.py: CUDA_SHRINK_TILES /
// CUDA_EXPAND_TILES, a test keeps them equal). Split-K of shrink is a runtime value.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace atmm {

// (BLOCK_M, BLOCK_N, BLOCK_K, WARPS_M, WARPS_N, WARPS_K, STAGES). Warps split the block
// tile into WARPS_M x WARPS_N warp tiles; WARPS_K > 1 splits the 16-wide K steps of a
// block tile between warps too (summed in shared memory), for the small row tiles of
// decode where one warp tile would leave the other warps idle.
#define ATMM_SHRINK_TILES(X)     \
  X(16, 16, 256, 1, 1, 4, 3)     \
  X(16, 32, 256, 1, 2, 2, 3)     \
  X(16, 64, 128, 1, 4, 1, 4)     \
  X(16, 64, 256, 1, 2, 2, 3)     \
  X(16, 128, 128, 1, 4, 1, 3)    \
  X(32, 32, 128, 2, 2, 1, 3)     \
  X(32, 64, 128, 2, 2, 1, 3)     \
  X(64, 64, 64, 2, 2, 1, 3)      \
  X(64, 128, 64, 2, 2, 1, 3)     \
  X(128, 64, 64, 2, 2, 1, 3)     \
  X(128, 128, 64, 2, 4, 1, 3)

#define ATMM_EXPAND_TILES(X)     \
  X(16, 64, 16, 1, 4, 1, 2)      \
  X(16, 128, 16, 1, 4, 1, 2)     \
  X(16, 64, 32, 1, 4, 1, 2)      \
  X(16, 128, 32, 1, 4, 1, 2)     \
  X(16, 128, 64, 1, 4, 1, 2)     \
  X(16, 256, 64, 1, 4, 1, 2)     \
  X(32, 128, 32, 2, 2, 1, 2)     \
  X(64, 128, 16, 2, 2, 1, 2)     \
  X(64, 128, 32, 2, 2, 1, 2)     \
  X(64, 128, 64, 2, 2, 1, 2)     \
  X(128, 64, 64, 2, 2, 1, 2)     \
  X(64, 256, 32, 2, 4, 1, 2)     \
  X(128, 128, 32, 2, 4, 1, 2)

enum class DType : int { kBF16 = 0, kF16 = 1 };
enum class Op : int { kShrink = 0, kExpand = 1 };

// A tile config as tiling.py names it; num_warps = WARPS_M * WARPS_N * WARPS_K.
struct TileConfig {
  int block_m, block_n, block_k, num_warps, num_stages;
};

// Work items, all device pointers. layers may be null (one layer); perm may be null.
struct Items {
  const int32_t* seg_starts;  // [n_items]
  const int32_t* seg_lens;    // [n_items]
  const int32_t* slots;       // [n_items]
  const float* scales;        // [n_items] (expand only)
  const int32_t* row_starts;  // [n_items]
  const int32_t* layers;      // [n_items] or null
  const int32_t* ranks;       // [n_slots]
  const int64_t* perm;        // [n_tokens] or null
  int n_items;
};

// Element strides; every innermost dim has stride 1.
struct ShrinkParams {
  const void* x;  // [tokens, k]
  int64_t x_stride;
  const void* a;  // [slots, n_max, k]
  int64_t a_stride_slot, a_stride_row;
  void* out;  // [rows, n_max]
  int64_t out_stride;
  float* partials;  // [split_k, rows, n_max] fp32, only for split_k > 1
  int64_t part_stride_split, part_stride_row;
  int32_t* counters;  // zeroed, >= grid tiles; re-armed by the kernel (split_k > 1)
  int64_t num_counters;
  int k, n_max, num_slices;
  int row_tiles;  // grid.y: an upper bound of sum(cdiv(seg_len, BLOCK_M))
  int split_k;
  int vec_loads;  // 16-byte aligned base pointers and strides: cp.async path
  int vec_out;    // 16-byte aligned out and out_stride: vector stores
};

struct ExpandParams {
  const void* inter;  // [rows, >= S * max_rank]
  int64_t inter_stride;
  const void* b;  // [slots, n_total, max_rank]
  int64_t b_stride_slot, b_stride_row;
  void* out;  // [tokens, n_total]
  int64_t out_stride_row, out_stride_col;
  int offsets[4];  // slice s covers output columns [offsets[s], offsets[s + 1])
  int num_slices;  // 1..3
  int layer;       // only items of this layer (-1: all items)
  int row_tiles;
  int vec_loads;
  int vec_out;  // out_stride_col == 1, 16-byte aligned rows and offsets
};

// cudaErrorInvalidValue for a config that is not instantiated or a bad argument.
cudaError_t launch_shrink(DType dtype, const TileConfig& cfg, const ShrinkParams& p, const Items& items,
                          cudaStream_t stream);
cudaError_t launch_expand(DType dtype, const TileConfig& cfg, const ExpandParams& p, const Items& items,
                          cudaStream_t stream);

// The instantiated tiles of an op, as 7-tuples of the X-macro lists.
int num_tiles(Op op);
void tile_at(Op op, int index, int out[7]);

}  // namespace atmm
