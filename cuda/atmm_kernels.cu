// ATMM CUDA C++ kernels: LoRA shrink and expand over work items (see atmm_kernels.cuh).
//
// Both ops are one "NT" GEMM core, C[m, n] = sum_k P[m, k] * Q[n, k], with gathered
// rows of P (token rows of x for shrink, intermediate rows for expand) and a per-block
// base pointer of Q (the slot's A rows, or the slot's B rows of one slice). The core:
// a STAGES-deep cp.async pipeline of [BM x BK] and [BN x BK] tiles in shared memory
// (rows padded by 8 elements against bank conflicts), WMMA 16x16x16 fragments with
// fp32 accumulators, and the tile written back to shared memory as fp32 for the
// op-specific epilogue (store / split-K reduction / scaled accumulate into output).
// Plain CUDA, compiles with bare nvcc (sm_80+).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cstdint>
#include <mutex>
#include <set>
#include <utility>

#include "atmm_kernels.cuh"

namespace atmm {
namespace {

using namespace nvcuda;

constexpr unsigned kFullMask = 0xffffffffu;

template <int BM, int BN, int BK, int WM, int WN, int WK, int STAGES>
struct Tile {
  static constexpr int kBM = BM, kBN = BN, kBK = BK, kWM = WM, kWN = WN, kWK = WK, kStages = STAGES;
  static constexpr int kWarps = WM * WN * WK;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kLds = BK + 8;  // shared row pitch of operand tiles (elements)
  static constexpr int kLdc = BN + 4;  // shared row pitch of the fp32 result tile
  static constexpr int kWarpM = BM / WM, kWarpN = BN / WN;
  static constexpr int kFragM = kWarpM / 16, kFragN = kWarpN / 16;
  static constexpr int kKSteps = BK / 16;
  static constexpr int kStageElems = (BM + BN) * kLds;
  static constexpr size_t kPipeBytes = size_t(STAGES) * kStageElems * 2;
  static constexpr size_t kEpiBytes = size_t(WK) * BM * kLdc * 4;
  // + 128: the kernel aligns its dynamic shared memory to 128 bytes itself (WMMA needs 32)
  static constexpr size_t kSmemBytes = (kPipeBytes > kEpiBytes ? kPipeBytes : kEpiBytes) + 128;
  static_assert(BM % (16 * WM) == 0 && BN % (16 * WN) == 0, "warp tiles must be multiples of 16");
  static_assert(BK % 16 == 0 && kKSteps % WK == 0, "K steps must split evenly over WARPS_K");
  static_assert(STAGES >= 2, "the pipeline needs at least two stages");
  static_assert(BN % 8 == 0, "epilogue works in groups of 8 columns");
};

// ---- small device helpers ------------------------------------------------------------

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(addr), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

template <typename T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <>
__device__ __forceinline__ float to_float<__half>(__half v) {
  return __half2float(v);
}
template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}

// Dynamic shared memory rounded up to a 128-byte boundary (the launch adds 128 bytes).
__device__ __forceinline__ unsigned char* align128(unsigned char* p) {
  return reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(p) + 127) & ~uintptr_t(127));
}

// Two values packed in 32 bits (register-only conversions, no local arrays).
template <typename T>
struct Pair;
template <>
struct Pair<__nv_bfloat16> {
  using type = __nv_bfloat162;
  static __device__ __forceinline__ float2 to_float2(type v) { return __bfloat1622float2(v); }
  static __device__ __forceinline__ type from_floats(float a, float b) { return __floats2bfloat162_rn(a, b); }
};
template <>
struct Pair<__half> {
  using type = __half2;
  static __device__ __forceinline__ float2 to_float2(type v) { return __half22float2(v); }
  static __device__ __forceinline__ type from_floats(float a, float b) { return __floats2half2_rn(a, b); }
};
template <typename T>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  typename Pair<T>::type v = Pair<T>::from_floats(a, b);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t u) {
  return Pair<T>::to_float2(*reinterpret_cast<typename Pair<T>::type*>(&u));
}

// Block-wide: map flat row tile t to (item, row tile within the item, seg_len) in
// found[0..2]; found[0] = -1 past the last tile. Warp 0 scans the items 32 at a time
// (inclusive shuffle scan of cdiv(seg_len, bm)); items of other layers own no tiles.
__device__ __forceinline__ void find_tile(const Items& it, int t, int bm, int layer, int* found) {
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    int base = 0;
    bool hit = false;
    for (int c = 0; c < it.n_items; c += 32) {
      const int i = c + lane;
      int len = 0;
      if (i < it.n_items) {
        len = max(it.seg_lens[i], 0);
        if (layer >= 0 && it.layers != nullptr && it.layers[i] != layer) len = 0;
      }
      const int tiles = (len + bm - 1) / bm;
      int incl = tiles;
#pragma unroll
      for (int d = 1; d < 32; d <<= 1) {
        const int v = __shfl_up_sync(kFullMask, incl, d);
        if (lane >= d) incl += v;
      }
      const int total = __shfl_sync(kFullMask, incl, 31);
      if (t < base + total) {
        const unsigned ballot = __ballot_sync(kFullMask, base + incl > t);
        if (lane == __ffs(ballot) - 1) {
          found[0] = i;
          found[1] = t - (base + incl - tiles);
          found[2] = len;
        }
        hit = true;
        break;
      }
      base += total;
    }
    if (!hit && lane == 0) found[0] = -1;
  }
  __syncthreads();
}

// Copy 8 elements (16 bytes) of row `off` (element offset, -1: no row) at column k into
// shared memory: cp.async when allowed and in bounds, zeros past the row or K, and an
// element-wise copy for a K tail or unaligned data.
__device__ __forceinline__ void load_chunk(uint16_t* dst, const uint16_t* base, int64_t off, int k, int k_end,
                                           bool vec) {
  if (off >= 0 && k + 8 <= k_end && vec) {
    cp_async16(dst, base + off + k);
  } else if (off < 0 || k >= k_end) {
    *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) dst[j] = (k + j < k_end) ? base[off + k + j] : uint16_t(0);
  }
}

// The GEMM core. p_off[m] is the element offset of P's row m from p_base (-1: no row,
// read as zeros); Q's row n is q_base + n * q_stride for n < q_rows. Sums k in
// [k_begin, k_end). On return the fp32 tile is in shared memory as float[BM][kLdc]
// (from the start of smem) and the block is synchronized.
template <typename T, class C>
__device__ __forceinline__ void gemm_tile(const uint16_t* p_base, const int64_t* p_off, const uint16_t* q_base,
                                          int64_t q_stride, int q_rows, int k_begin, int k_end, bool vec,
                                          unsigned char* smem) {
  constexpr int BM = C::kBM, BN = C::kBN, BK = C::kBK, LDS = C::kLds, LDC = C::kLdc;
  constexpr int CPR = BK / 8;  // 16-byte chunks per tile row
  uint16_t* stages = reinterpret_cast<uint16_t*>(smem);
  const int warp = threadIdx.x / 32;
  const int wk = warp / (C::kWM * C::kWN);
  const int wm = (warp % (C::kWM * C::kWN)) / C::kWN;
  const int wn = warp % C::kWN;

  auto load_stage = [&](int stage, int k0) {
    uint16_t* sp = stages + stage * C::kStageElems;
    uint16_t* sq = sp + BM * LDS;
    for (int c = threadIdx.x; c < BM * CPR; c += C::kThreads) {
      const int r = c / CPR, kc = (c % CPR) * 8;
      load_chunk(sp + r * LDS + kc, p_base, p_off[r], k0 + kc, k_end, vec);
    }
    for (int c = threadIdx.x; c < BN * CPR; c += C::kThreads) {
      const int r = c / CPR, kc = (c % CPR) * 8;
      const int64_t off = r < q_rows ? int64_t(r) * q_stride : int64_t(-1);
      load_chunk(sq + r * LDS + kc, q_base, off, k0 + kc, k_end, vec);
    }
  };

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[C::kFragM][C::kFragN];
#pragma unroll
  for (int i = 0; i < C::kFragM; ++i)
#pragma unroll
    for (int j = 0; j < C::kFragN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  const int num_k = k_end > k_begin ? (k_end - k_begin + BK - 1) / BK : 0;
#pragma unroll
  for (int s = 0; s < C::kStages - 1; ++s) {
    if (s < num_k) load_stage(s, k_begin + s * BK);
    cp_async_commit();
  }
  for (int kt = 0; kt < num_k; ++kt) {
    cp_async_wait<C::kStages - 2>();
    __syncthreads();  // stage kt landed; every warp is done with stage kt - 1
    const int next = kt + C::kStages - 1;
    if (next < num_k) load_stage(next % C::kStages, k_begin + next * BK);
    cp_async_commit();
    const T* sp = reinterpret_cast<const T*>(stages + (kt % C::kStages) * C::kStageElems);
    const T* sq = sp + BM * LDS;
#pragma unroll
    for (int ks = wk; ks < C::kKSteps; ks += C::kWK) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa[C::kFragM];
#pragma unroll
      for (int i = 0; i < C::kFragM; ++i)
        wmma::load_matrix_sync(fa[i], sp + (wm * C::kWarpM + i * 16) * LDS + ks * 16, LDS);
#pragma unroll
      for (int j = 0; j < C::kFragN; ++j) {
        // Q is stored [n][k]: as the K x N operand that is column-major with pitch LDS.
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
        wmma::load_matrix_sync(fb, sq + (wn * C::kWarpN + j * 16) * LDS + ks * 16, LDS);
#pragma unroll
        for (int i = 0; i < C::kFragM; ++i) wmma::mma_sync(acc[i][j], fa[i], fb, acc[i][j]);
      }
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // pipeline buffers are reused for the result tile

  float* sc = reinterpret_cast<float*>(smem) + wk * BM * LDC;
#pragma unroll
  for (int i = 0; i < C::kFragM; ++i)
#pragma unroll
    for (int j = 0; j < C::kFragN; ++j)
      wmma::store_matrix_sync(sc + (wm * C::kWarpM + i * 16) * LDC + wn * C::kWarpN + j * 16, acc[i][j], LDC,
                              wmma::mem_row_major);
  __syncthreads();
  if (C::kWK > 1) {  // sum the K-split warps' tiles into the first one
    float* s0 = reinterpret_cast<float*>(smem);
    for (int e = threadIdx.x; e < BM * BN; e += C::kThreads) {
      const int idx = (e / BN) * LDC + e % BN;
      float v = s0[idx];
#pragma unroll
      for (int w = 1; w < C::kWK; ++w) v += s0[w * BM * LDC + idx];
      s0[idx] = v;
    }
    __syncthreads();
  }
}

// Store 8 consecutive fp32 values of the result tile as T: one 16-byte store when
// allowed, else element by element for the first `valid` of them.
template <typename T>
__device__ __forceinline__ void store8(T* dst, int64_t col_stride, const float* src, int valid, bool vec) {
  if (vec && valid >= 8) {
    *reinterpret_cast<uint4*>(dst) = make_uint4(pack2<T>(src[0], src[1]), pack2<T>(src[2], src[3]),
                                                pack2<T>(src[4], src[5]), pack2<T>(src[6], src[7]));
  } else {
    for (int j = 0; j < valid && j < 8; ++j) dst[j * col_stride] = from_float<T>(src[j]);
  }
}

// ---- shrink ----------------------------------------------------------------------------

template <typename T, class C>
__global__ void __launch_bounds__(C::kThreads, 1) shrink_kernel(const ShrinkParams p, const Items it) {
  constexpr int BM = C::kBM, BN = C::kBN, BK = C::kBK, LDC = C::kLdc;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = align128(smem_raw);
  __shared__ int found[3];
  __shared__ int64_t p_off[BM];
  __shared__ int is_last;

  find_tile(it, blockIdx.y, BM, -1, found);
  const int item = found[0];
  if (item < 0) return;
  const int slot = it.slots[item];
  const int width = it.ranks[slot] * p.num_slices;
  const int n0 = blockIdx.x * BN;
  if (n0 >= width) return;  // block-uniform: columns past S * r are not this item's
  const int m0 = found[1] * BM;
  const int len = found[2];
  const int seg_start = it.seg_starts[item];
  const int64_t row0 = int64_t(it.row_starts[item]) + m0;
  for (int m = threadIdx.x; m < BM; m += C::kThreads) {
    int64_t off = -1;
    if (m0 + m < len) {
      const int64_t pos = int64_t(seg_start) + m0 + m;
      off = (it.perm != nullptr ? it.perm[pos] : pos) * p.x_stride;
    }
    p_off[m] = off;
  }
  __syncthreads();

  const int k_span = (p.k + p.split_k * BK - 1) / (p.split_k * BK) * BK;
  const int k_begin = blockIdx.z * k_span;
  const int k_end = min(p.k, k_begin + k_span);
  const uint16_t* q_base = static_cast<const uint16_t*>(p.a) + int64_t(slot) * p.a_stride_slot +
                           int64_t(n0) * p.a_stride_row;
  gemm_tile<T, C>(static_cast<const uint16_t*>(p.x), p_off, q_base, p.a_stride_row, min(width - n0, BN), k_begin,
                  k_end, p.vec_loads != 0, smem);

  const float* sc = reinterpret_cast<const float*>(smem);
  const int rows = min(BM, len - m0);
  const int cols = min(BN, p.n_max - n0);  // zeros (masked A rows) between S*r and n_max
  T* out = static_cast<T*>(p.out);
  if (p.split_k == 1) {
    for (int g = threadIdx.x; g < BM * (BN / 8); g += C::kThreads) {
      const int m = g / (BN / 8), n = (g % (BN / 8)) * 8;
      if (m < rows && n < cols)
        store8<T>(out + (row0 + m) * p.out_stride + n0 + n, 1, sc + m * LDC + n, cols - n, p.vec_out != 0);
    }
    return;
  }
  // Split-K: store this split's fp32 partial; the last split of the tile to arrive sums
  // the partials in split order (deterministic), stores the result and re-arms the
  // tile's counter for the next launch.
  float* part = p.partials + int64_t(blockIdx.z) * p.part_stride_split;
  for (int e = threadIdx.x; e < BM * BN; e += C::kThreads) {
    const int m = e / BN, n = e % BN;
    if (m < rows && n < cols) part[(row0 + m) * p.part_stride_row + n0 + n] = sc[m * LDC + n];
  }
  __threadfence();
  __syncthreads();
  const int64_t tile_id = int64_t(blockIdx.y) * gridDim.x + blockIdx.x;
  if (threadIdx.x == 0) is_last = atomicAdd(p.counters + tile_id, 1) == p.split_k - 1;
  __syncthreads();
  if (!is_last) return;
  __threadfence();
  for (int e = threadIdx.x; e < BM * BN; e += C::kThreads) {
    const int m = e / BN, n = e % BN;
    if (m < rows && n < cols) {
      const int64_t idx = (row0 + m) * p.part_stride_row + n0 + n;
      float v = 0.0f;
      for (int s = 0; s < p.split_k; ++s) v += __ldcg(p.partials + s * p.part_stride_split + idx);
      out[(row0 + m) * p.out_stride + n0 + n] = from_float<T>(v);
    }
  }
  if (threadIdx.x == 0) atomicExch(p.counters + tile_id, 0);
}

// ---- expand ----------------------------------------------------------------------------

template <typename T, class C>
__global__ void __launch_bounds__(C::kThreads, 1) expand_kernel(const ExpandParams p, const Items it) {
  constexpr int BM = C::kBM, BN = C::kBN, LDC = C::kLdc;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = align128(smem_raw);
  __shared__ int found[3];
  __shared__ int64_t p_off[BM];
  __shared__ int64_t tok[BM];

  find_tile(it, blockIdx.y, BM, p.layer, found);
  const int item = found[0];
  if (item < 0) return;
  const int s = blockIdx.z;
  // (selects, not p.offsets[s]: a run-time index into the parameters copies them to the stack)
  const int lo = s == 0 ? p.offsets[0] : (s == 1 ? p.offsets[1] : p.offsets[2]);
  const int hi = s == 0 ? p.offsets[1] : (s == 1 ? p.offsets[2] : p.offsets[3]);
  const int width = hi - lo;
  const int n0 = blockIdx.x * BN;
  if (n0 >= width) return;
  const int slot = it.slots[item];
  const int rank = it.ranks[slot];
  if (rank <= 0) return;
  const float scale = it.scales[item];
  const int m0 = found[1] * BM;
  const int len = found[2];
  const int seg_start = it.seg_starts[item];
  const int64_t row0 = int64_t(it.row_starts[item]) + m0;
  for (int m = threadIdx.x; m < BM; m += C::kThreads) {
    int64_t off = -1, t = -1;
    if (m0 + m < len) {
      const int64_t pos = int64_t(seg_start) + m0 + m;
      t = it.perm != nullptr ? it.perm[pos] : pos;
      off = (row0 + m) * p.inter_stride + int64_t(s) * rank;
    }
    p_off[m] = off;
    tok[m] = t;
  }
  __syncthreads();

  const uint16_t* q_base = static_cast<const uint16_t*>(p.b) + int64_t(slot) * p.b_stride_slot +
                           int64_t(lo + n0) * p.b_stride_row;
  const int cols = min(BN, width - n0);
  gemm_tile<T, C>(static_cast<const uint16_t*>(p.inter), p_off, q_base, p.b_stride_row, cols, 0, rank,
                  p.vec_loads != 0 && rank % 8 == 0, smem);

  // out[tok, lo + n0 + n] += scale * tile: items of one layer own disjoint tokens, so
  // no other block touches these elements during this launch.
  const float* sc = reinterpret_cast<const float*>(smem);
  const int rows = min(BM, len - m0);
  T* out = static_cast<T*>(p.out);
  const bool vec = p.vec_out != 0;
  for (int g = threadIdx.x; g < BM * (BN / 8); g += C::kThreads) {
    const int m = g / (BN / 8), n = (g % (BN / 8)) * 8;
    if (m >= rows || n >= cols) continue;
    T* dst = out + tok[m] * p.out_stride_row + int64_t(lo + n0 + n) * p.out_stride_col;
    const float* src = sc + m * LDC + n;
    if (vec && cols - n >= 8) {
      const uint4 old = *reinterpret_cast<const uint4*>(dst);
      const float2 o0 = unpack2<T>(old.x), o1 = unpack2<T>(old.y), o2 = unpack2<T>(old.z), o3 = unpack2<T>(old.w);
      *reinterpret_cast<uint4*>(dst) = make_uint4(
          pack2<T>(o0.x + scale * src[0], o0.y + scale * src[1]), pack2<T>(o1.x + scale * src[2], o1.y + scale * src[3]),
          pack2<T>(o2.x + scale * src[4], o2.y + scale * src[5]), pack2<T>(o3.x + scale * src[6], o3.y + scale * src[7]));
    } else {
      for (int j = 0; j < 8 && n + j < cols; ++j) {
        T* d = dst + j * p.out_stride_col;
        *d = from_float<T>(to_float<T>(*d) + scale * src[j]);
      }
    }
  }
}

// ---- launchers -------------------------------------------------------------------------

constexpr int kMaxGridY = 65535;

// Opt in to more than 48 KB of dynamic shared memory, once per kernel and device.
// Opt a kernel in to more than 48 KiB of dynamic shared memory, once per (kernel, device).
// Every instantiation has the same function-pointer type, so the record is keyed by the
// kernel's address, not kept per template instance.
template <typename Kernel>
cudaError_t allow_smem(Kernel kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  static std::mutex lock;
  static std::set<std::pair<const void*, int>> done;
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  const auto key = std::make_pair(reinterpret_cast<const void*>(kernel), dev);
  std::lock_guard<std::mutex> guard(lock);
  if (done.count(key)) return cudaSuccess;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (err == cudaSuccess) done.insert(key);
  return err;
}

template <typename T, class C>
cudaError_t run_shrink(const ShrinkParams& p, const Items& it, cudaStream_t stream) {
  const dim3 grid((p.n_max + C::kBN - 1) / C::kBN, p.row_tiles, p.split_k);
  if (p.split_k > 1 && (p.partials == nullptr || p.counters == nullptr ||
                        int64_t(grid.x) * grid.y > p.num_counters))
    return cudaErrorInvalidValue;
  const cudaError_t err = allow_smem(shrink_kernel<T, C>, C::kSmemBytes);
  if (err != cudaSuccess) return err;
  shrink_kernel<T, C><<<grid, C::kThreads, C::kSmemBytes, stream>>>(p, it);
  return cudaGetLastError();
}

template <typename T, class C>
cudaError_t run_expand(const ExpandParams& p, const Items& it, cudaStream_t stream) {
  int max_width = 0;
  for (int s = 0; s < p.num_slices; ++s) max_width = max(max_width, p.offsets[s + 1] - p.offsets[s]);
  if (max_width <= 0) return cudaSuccess;
  const dim3 grid((max_width + C::kBN - 1) / C::kBN, p.row_tiles, p.num_slices);
  const cudaError_t err = allow_smem(expand_kernel<T, C>, C::kSmemBytes);
  if (err != cudaSuccess) return err;
  expand_kernel<T, C><<<grid, C::kThreads, C::kSmemBytes, stream>>>(p, it);
  return cudaGetLastError();
}

bool matches(const TileConfig& c, int bm, int bn, int bk, int warps, int stages) {
  return c.block_m == bm && c.block_n == bn && c.block_k == bk && c.num_warps == warps && c.num_stages == stages;
}

}  // namespace

cudaError_t launch_shrink(DType dtype, const TileConfig& cfg, const ShrinkParams& p, const Items& items,
                          cudaStream_t stream) {
  if (p.split_k < 1 || p.row_tiles > kMaxGridY || p.num_slices < 1) return cudaErrorInvalidValue;
  if (items.n_items <= 0 || p.row_tiles <= 0 || p.n_max <= 0) return cudaSuccess;
#define ATMM_TRY_SHRINK(BM, BN, BK, WM, WN, WK, ST)                                         \
  if (matches(cfg, BM, BN, BK, WM * WN * WK, ST)) {                                         \
    using C = Tile<BM, BN, BK, WM, WN, WK, ST>;                                             \
    return dtype == DType::kBF16 ? run_shrink<__nv_bfloat16, C>(p, items, stream)           \
                                 : run_shrink<__half, C>(p, items, stream);                 \
  }
  ATMM_SHRINK_TILES(ATMM_TRY_SHRINK)
#undef ATMM_TRY_SHRINK
  return cudaErrorInvalidValue;
}

cudaError_t launch_expand(DType dtype, const TileConfig& cfg, const ExpandParams& p, const Items& items,
                          cudaStream_t stream) {
  if (p.num_slices < 1 || p.num_slices > 3 || p.row_tiles > kMaxGridY) return cudaErrorInvalidValue;
  if (items.n_items <= 0 || p.row_tiles <= 0) return cudaSuccess;
#define ATMM_TRY_EXPAND(BM, BN, BK, WM, WN, WK, ST)                                         \
  if (matches(cfg, BM, BN, BK, WM * WN * WK, ST)) {                                         \
    using C = Tile<BM, BN, BK, WM, WN, WK, ST>;                                             \
    return dtype == DType::kBF16 ? run_expand<__nv_bfloat16, C>(p, items, stream)           \
                                 : run_expand<__half, C>(p, items, stream);                 \
  }
  ATMM_EXPAND_TILES(ATMM_TRY_EXPAND)
#undef ATMM_TRY_EXPAND
  return cudaErrorInvalidValue;
}

namespace {
#define ATMM_ROW(BM, BN, BK, WM, WN, WK, ST) {BM, BN, BK, WM, WN, WK, ST},
constexpr int kShrinkTiles[][7] = {ATMM_SHRINK_TILES(ATMM_ROW)};
constexpr int kExpandTiles[][7] = {ATMM_EXPAND_TILES(ATMM_ROW)};
#undef ATMM_ROW
}  // namespace

int num_tiles(Op op) {
  return op == Op::kShrink ? int(sizeof(kShrinkTiles) / sizeof(kShrinkTiles[0]))
                           : int(sizeof(kExpandTiles) / sizeof(kExpandTiles[0]));
}

void tile_at(Op op, int index, int out[7]) {
  const int(*rows)[7] = op == Op::kShrink ? kShrinkTiles : kExpandTiles;
  for (int j = 0; j < 7; ++j) out[j] = rows[index][j];
}

}  // namespace atmm
