// pybind11 binding of the ATMM CUDA kernels: checks torch tensors, derives pointers,
// strides and alignment flags, and calls the raw-pointer launchers of atmm_kernels.cu
// on the current CUDA stream. Built on first use by sglang_vlora/atmm/cuda_ext.py.

#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "atmm_kernels.cuh"

namespace {

atmm::DType dtype_of(const at::Tensor& t, const char* name) {
  if (t.scalar_type() == at::kBFloat16) return atmm::DType::kBF16;
  if (t.scalar_type() == at::kHalf) return atmm::DType::kF16;
  TORCH_CHECK(false, "atmm: ", name, " must be bfloat16 or float16, got ", t.scalar_type());
}

void check_device(const at::Tensor& t, const at::Tensor& ref, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.device() == ref.device(), "atmm: ", name, " must be on ", ref.device());
}

const int32_t* int_ptr(const at::Tensor& t, const at::Tensor& ref, const char* name) {
  check_device(t, ref, name);
  TORCH_CHECK(t.scalar_type() == at::kInt && t.is_contiguous(), "atmm: ", name, " must be contiguous int32");
  return t.data_ptr<int32_t>();
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

atmm::TileConfig tile_config(const std::vector<int64_t>& c, size_t expected) {
  TORCH_CHECK(c.size() == expected, "atmm: tile config needs ", expected, " values");
  // shrink: (block_m, block_n, block_k, split_k, num_warps, num_stages)
  // expand: (block_m, block_n, block_k, num_warps, num_stages)
  const size_t w = expected == 6 ? 4 : 3;
  return {int(c[0]), int(c[1]), int(c[2]), int(c[w]), int(c[w + 1])};
}

// Fills the item pointers; returns the int64 permutation it points to (kept alive by
// the caller until the launch is queued).
at::Tensor fill_items(atmm::Items& items, const at::Tensor& ref, const at::Tensor& seg_starts,
                      const at::Tensor& seg_lens, const at::Tensor& slots, const at::Tensor& row_starts,
                      const at::Tensor& ranks, const std::optional<at::Tensor>& scales,
                      const std::optional<at::Tensor>& layers, const std::optional<at::Tensor>& perm) {
  const int64_t n = seg_lens.numel();
  TORCH_CHECK(seg_starts.numel() == n && slots.numel() == n && row_starts.numel() == n,
              "atmm: seg_starts, seg_lens, slots and row_starts need one entry per item");
  items.seg_starts = int_ptr(seg_starts, ref, "seg_starts");
  items.seg_lens = int_ptr(seg_lens, ref, "seg_lens");
  items.slots = int_ptr(slots, ref, "slots");
  items.row_starts = int_ptr(row_starts, ref, "row_starts");
  items.ranks = int_ptr(ranks, ref, "ranks");
  items.scales = nullptr;
  if (scales.has_value()) {
    check_device(*scales, ref, "scales");
    TORCH_CHECK(scales->scalar_type() == at::kFloat && scales->is_contiguous() && scales->numel() == n,
                "atmm: scales must be contiguous float32, one per item");
    items.scales = scales->data_ptr<float>();
  }
  items.layers = nullptr;
  if (layers.has_value()) {
    TORCH_CHECK(layers->numel() == n, "atmm: layers needs one entry per item");
    items.layers = int_ptr(*layers, ref, "layers");
  }
  items.n_items = int(n);
  at::Tensor p;
  items.perm = nullptr;
  if (perm.has_value()) {
    check_device(*perm, ref, "permutation");
    p = perm->scalar_type() == at::kLong ? perm->contiguous() : perm->to(at::kLong).contiguous();
    items.perm = p.data_ptr<int64_t>();
  }
  return p;
}

void check_launch(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, "atmm ", what, " launch failed: ", cudaGetErrorString(err),
              err == cudaErrorInvalidValue ? " (tile config not instantiated, or a bad argument)" : "");
}

void shrink(at::Tensor x, const at::Tensor& a, const at::Tensor& out, const at::Tensor& seg_starts,
            const at::Tensor& seg_lens, const at::Tensor& slots, const at::Tensor& row_starts,
            const at::Tensor& ranks, const std::optional<at::Tensor>& perm, int64_t num_slices, int64_t row_tiles,
            const std::vector<int64_t>& config, const std::optional<at::Tensor>& partials,
            const std::optional<at::Tensor>& counters) {
  TORCH_CHECK(x.is_cuda() && x.dim() == 2, "atmm shrink: x must be a 2-D CUDA tensor");
  const c10::cuda::CUDAGuard guard(x.device());
  const atmm::DType dtype = dtype_of(x, "x");
  if (x.stride(1) != 1) x = x.contiguous();
  check_device(a, x, "A");
  check_device(out, x, "out");
  TORCH_CHECK(a.dim() == 3 && a.size(2) == x.size(1) && a.stride(2) == 1 && a.scalar_type() == x.scalar_type(),
              "atmm shrink: A must be [slots, S*max_rank, d_in] of x's dtype with unit inner stride");
  TORCH_CHECK(out.dim() == 2 && out.size(1) == a.size(1) && out.stride(1) == 1 &&
                  out.scalar_type() == x.scalar_type(),
              "atmm shrink: out must be [rows, S*max_rank] of x's dtype with contiguous rows");
  const atmm::TileConfig cfg = tile_config(config, 6);
  const int64_t split_k = config[3];
  atmm::Items items{};
  const at::Tensor perm64 = fill_items(items, x, seg_starts, seg_lens, slots, row_starts, ranks, std::nullopt,
                                       std::nullopt, perm);
  atmm::ShrinkParams p{};
  p.x = x.data_ptr();
  p.x_stride = x.stride(0);
  p.a = a.data_ptr();
  p.a_stride_slot = a.stride(0);
  p.a_stride_row = a.stride(1);
  p.out = out.data_ptr();
  p.out_stride = out.stride(0);
  p.k = int(x.size(1));
  p.n_max = int(a.size(1));
  p.num_slices = int(num_slices);
  p.row_tiles = int(row_tiles);
  p.split_k = int(split_k);
  p.vec_loads = aligned16(p.x) && aligned16(p.a) && p.x_stride % 8 == 0 && p.a_stride_slot % 8 == 0 &&
                p.a_stride_row % 8 == 0;
  p.vec_out = aligned16(p.out) && p.out_stride % 8 == 0;
  if (split_k > 1) {
    TORCH_CHECK(partials.has_value() && counters.has_value(), "atmm shrink: split-K needs partials and counters");
    check_device(*partials, x, "partials");
    TORCH_CHECK(partials->scalar_type() == at::kFloat && partials->dim() == 3 && partials->size(0) >= split_k &&
                    partials->size(1) >= out.size(0) && partials->size(2) == out.size(1) &&
                    partials->stride(2) == 1,
                "atmm shrink: partials must be float32 [split_k, rows, S*max_rank]");
    p.partials = partials->data_ptr<float>();
    p.part_stride_split = partials->stride(0);
    p.part_stride_row = partials->stride(1);
    p.counters = const_cast<int32_t*>(int_ptr(*counters, x, "counters"));
    p.num_counters = counters->numel();
  }
  check_launch(atmm::launch_shrink(dtype, cfg, p, items, c10::cuda::getCurrentCUDAStream()), "shrink");
}

void expand(const at::Tensor& inter, const at::Tensor& b, const at::Tensor& out, const at::Tensor& seg_starts,
            const at::Tensor& seg_lens, const at::Tensor& slots, const at::Tensor& scales,
            const at::Tensor& row_starts, const std::optional<at::Tensor>& layers, int64_t num_layers,
            const at::Tensor& ranks, const std::optional<at::Tensor>& perm, const std::vector<int64_t>& offsets,
            int64_t row_tiles, const std::vector<int64_t>& config) {
  TORCH_CHECK(out.is_cuda() && out.dim() == 2, "atmm expand: output must be a 2-D CUDA tensor");
  const c10::cuda::CUDAGuard guard(out.device());
  const atmm::DType dtype = dtype_of(out, "output");
  check_device(inter, out, "intermediate");
  check_device(b, out, "B");
  TORCH_CHECK(inter.dim() == 2 && inter.stride(1) == 1 && inter.scalar_type() == out.scalar_type(),
              "atmm expand: intermediate must be 2-D of the output's dtype with unit inner stride");
  TORCH_CHECK(b.dim() == 3 && b.stride(2) == 1 && b.scalar_type() == out.scalar_type(),
              "atmm expand: B must be [slots, d_out, max_rank] of the output's dtype with unit inner stride");
  const int64_t num_slices = int64_t(offsets.size()) - 1;
  TORCH_CHECK(num_slices >= 1 && num_slices <= 3, "atmm expand: 1 to 3 slices are supported");
  TORCH_CHECK(offsets.back() <= out.size(1) && offsets.back() <= b.size(1), "atmm expand: slice offsets too large");
  const atmm::TileConfig cfg = tile_config(config, 5);
  atmm::Items items{};
  const at::Tensor perm64 =
      fill_items(items, out, seg_starts, seg_lens, slots, row_starts, ranks, scales, layers, perm);
  atmm::ExpandParams p{};
  p.inter = inter.data_ptr();
  p.inter_stride = inter.stride(0);
  p.b = b.data_ptr();
  p.b_stride_slot = b.stride(0);
  p.b_stride_row = b.stride(1);
  p.out = out.data_ptr();
  p.out_stride_row = out.stride(0);
  p.out_stride_col = out.stride(1);
  bool offsets_aligned = true;
  for (int s = 0; s < 4; ++s) {
    p.offsets[s] = int(offsets[std::min<size_t>(s, offsets.size() - 1)]);
    offsets_aligned = offsets_aligned && p.offsets[s] % 8 == 0;
  }
  p.num_slices = int(num_slices);
  p.row_tiles = int(row_tiles);
  p.vec_loads = aligned16(p.inter) && aligned16(p.b) && p.inter_stride % 8 == 0 && p.b_stride_slot % 8 == 0 &&
                p.b_stride_row % 8 == 0;
  p.vec_out = aligned16(p.out) && p.out_stride_col == 1 && p.out_stride_row % 8 == 0 && offsets_aligned;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  // One launch per overlap layer, in order: items that share tokens are in different
  // layers, so no two blocks of a launch update the same output element.
  const bool by_layer = layers.has_value() && num_layers > 1;
  for (int64_t layer = 0; layer < (by_layer ? num_layers : 1); ++layer) {
    p.layer = by_layer ? int(layer) : -1;
    check_launch(atmm::launch_expand(dtype, cfg, p, items, stream), "expand");
  }
}

std::vector<std::vector<int64_t>> tiles(const std::string& op) {
  TORCH_CHECK(op == "shrink" || op == "expand", "atmm: op must be 'shrink' or 'expand'");
  const atmm::Op which = op == "shrink" ? atmm::Op::kShrink : atmm::Op::kExpand;
  std::vector<std::vector<int64_t>> rows;
  for (int i = 0; i < atmm::num_tiles(which); ++i) {
    int t[7];
    atmm::tile_at(which, i, t);
    rows.emplace_back(t, t + 7);
  }
  return rows;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "ATMM CUDA C++ kernels (LoRA shrink / expand over work items)";
  m.def("shrink", &shrink, "x A^T per work item into the stacked-rank intermediate", py::arg("x"), py::arg("a"),
        py::arg("out"), py::arg("seg_starts"), py::arg("seg_lens"), py::arg("slots"), py::arg("row_starts"),
        py::arg("ranks"), py::arg("perm"), py::arg("num_slices"), py::arg("row_tiles"), py::arg("config"),
        py::arg("partials"), py::arg("counters"));
  m.def("expand", &expand, "output += scale * intermediate B^T per work item and slice", py::arg("inter"),
        py::arg("b"), py::arg("out"), py::arg("seg_starts"), py::arg("seg_lens"), py::arg("slots"),
        py::arg("scales"), py::arg("row_starts"), py::arg("layers"), py::arg("num_layers"), py::arg("ranks"),
        py::arg("perm"), py::arg("offsets"), py::arg("row_tiles"), py::arg("config"));
  m.def("tiles", &tiles, "instantiated tiles (BM, BN, BK, WARPS_M, WARPS_N, WARPS_K, STAGES)", py::arg("op"));
}
