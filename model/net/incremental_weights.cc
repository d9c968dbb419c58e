// IncrementalModel's weights as its kernels read them (PrepareWeights):
// converted to the weight dtype (bfloat16, or int8 with per-row scales),
// packed in panels, in huge pages; and the products whose form depends on the
// precision.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "model/kernels/amx_product.h"
#include "model/kernels/decode_kernels.h"
#include "model/kernels/skinny_product.h"
#include "model/net/huge_pages.h"
#include "model/net/incremental.h"

namespace txl {
namespace {

at::ScalarType TypeOf(Elem e) { return e == Elem::kF32 ? at::kFloat : e == Elem::kBf16 ? at::kBFloat16 : at::kChar; }

// Symmetric int8 with one scale per row: q = round(w / s), s = max|w| / 127
// (a zero row keeps s = 0 and q = 0).
std::pair<at::Tensor, at::Tensor> QuantizeRows(const at::Tensor& w) {
  at::Tensor scale = w.abs().amax(1) / 127.0;
  at::Tensor q = (w / scale.clamp_min(1e-30).unsqueeze(1)).round().clamp(-127, 127).to(at::kChar);
  return {q, scale.contiguous()};
}

}  // namespace

WeightMatrix IncrementalModel::DecodeMatrix::Gemv() const {
  WeightMatrix w;
  w.panels = !rows.defined();
  w.data = w.panels ? packed.data_ptr() : rows.data_ptr();
  w.elem = elem;
  w.scale = scale.defined() ? scale.data_ptr<float>() : nullptr;
  w.ld = w.panels ? PanelStride(n_cols, elem) : n_cols;
  w.ahead = ahead;
  return w;
}

PackedMatrix IncrementalModel::DecodeMatrix::Packed() const {
  PackedMatrix p;
  p.data = packed.data_ptr();
  p.elem = elem;
  p.scale = scale.defined() ? scale.data_ptr<float>() : nullptr;
  p.rows = n_rows;
  p.cols = n_cols;
  p.bf16_products = bf16_products;
  p.int8_products = int8_products;
  return p;
}

namespace {
// Layer matrix `which`: 0 qkv, 1 o, 2 ff1, 3 ff2 (const or not).
template <typename Layer>
auto* MatrixOf(Layer& L, int which) {
  switch (which) {
    case 0: return &L.qkv_w;
    case 1: return &L.o_w;
    case 2: return &L.ff1_w;
    default: return &L.ff2_w;
  }
}
}  // namespace

void IncrementalModel::PrepareWeights() {
  const Elem elem = dtype_ == WeightDtype::kBfloat16 ? Elem::kBf16
                    : dtype_ == WeightDtype::kInt8   ? Elem::kI8
                                                     : Elem::kF32;
  TORCH_CHECK(!(generic_ && elem == Elem::kI8), "int8 weights run on the CPU kernels only");
  if (generic_) {
    // libtorch's own products: bfloat16 weights where asked (int8 is the
    // CPU kernels' only: LanguageModel::Create refuses it here).
    if (elem == Elem::kBf16) {
      for (LayerWeights& L : weights_.layers) {
        for (int which = 0; which < 4; ++which) *MatrixOf(L, which) = MatrixOf(L, which)->to(at::kBFloat16);
        // With bfloat16 activations a product adds its bias in bfloat16,
        // in the same kernel.
        if (bf16_stream_) {
          for (at::Tensor* t : {&L.ff1_b, &L.ff2_b}) {
            if (t->defined()) *t = t->to(at::kBFloat16);
          }
        }
      }
    }
    pool_ = std::make_shared<SlotPool>(config_.n_layer, config_.n_head, config_.d_head,
                                       at::TensorOptions().dtype(kv_type()).device(device_));
    return;
  }
  // The product matrices in the weight dtype (the float32 originals are
  // dropped), then the biases; each group in one huge-page arena. float32
  // and bfloat16 matrices are only packed (one session's products read the
  // panels too): they stay where the checkpoint put them until then. A
  // bfloat16 model whose heads or inner layer have an odd width keeps its
  // rows, since one session's products split those at columns that must
  // start a column pair.
  const bool panels_only =
      elem == Elem::kF32 || (elem == Elem::kBf16 && config_.d_head % 2 == 0 && config_.d_inner % 2 == 0);
  std::vector<at::Tensor> scales;
  for (LayerWeights& L : weights_.layers) {
    for (int which = 0; which < 4; ++which) {
      at::Tensor* w = MatrixOf(L, which);
      if (elem == Elem::kBf16 && !panels_only) {
        *w = w->to(at::kBFloat16);
      } else if (elem == Elem::kI8) {
        auto [q, scale] = QuantizeRows(*w);
        *w = q;
        scales.push_back(scale);
      }
    }
  }
  std::vector<at::Tensor*> matrices, biases;
  for (LayerWeights& L : weights_.layers) {
    for (int which = 0; which < 4; ++which) matrices.push_back(MatrixOf(L, which));
    for (at::Tensor* t : {&L.ff1_b, &L.ff2_b}) biases.push_back(t);
  }
  if (!panels_only) {
    InHugePages(matrices);  // contiguous from here on: the kernels read them as arrays
  } else {
    for (at::Tensor* w : matrices) *w = w->contiguous();
  }
  InHugePages(biases);
  std::vector<std::vector<int64_t>> packed_shapes;
  for (const at::Tensor* w : matrices) packed_shapes.push_back({PackedSize(w->size(0), w->size(1), elem)});
  std::vector<at::Tensor> packed = HugePageTensors(packed_shapes, TypeOf(elem));
  for (int64_t l = 0; l < config_.n_layer; ++l) {
    DecodeLayer layer;
    for (int which = 0; which < 4; ++which) {
      DecodeMatrix& m = layer.m[which];
      at::Tensor& w = *matrices[4 * l + which];
      // Panels only: each matrix narrowed just before it is packed, so that
      // no more than one narrowed copy is alive at a time.
      m.rows = w.scalar_type() == TypeOf(elem) ? w : w.to(TypeOf(elem)).contiguous();
      m.n_rows = w.size(0);
      m.n_cols = w.size(1);
      m.packed = packed[4 * l + which];
      m.elem = elem;
      m.bf16_products = elem == Elem::kBf16 && bf16_products_;
      m.int8_products = elem == Elem::kI8 && bf16_products_ && CpuRunsInt8Dot(isa_);
      if (elem == Elem::kI8) m.scale = scales[4 * l + which];
      PackPanels(m.Gemv(), m.n_rows, m.n_cols, m.packed.data_ptr(), m.int8_products);
      if (panels_only) m.rows = w = at::Tensor();  // the panels are the only copy
    }
    layer.u = weights_.u(config_, l).contiguous();
    layer.v = weights_.v(config_, l).contiguous();
    decode_.push_back(std::move(layer));
  }
  if (!panels_only) {  // panels stream in order: nothing to choose
    std::vector<GemvMatrix> all;
    for (const DecodeLayer& layer : decode_) {
      for (const DecodeMatrix& m : layer.m) all.push_back({m.Gemv(), m.n_rows, m.n_cols});
    }
    gemv_calibration_ = CalibrateGemvAhead(all, isa_);
    for (DecodeLayer& layer : decode_) {
      for (DecodeMatrix& m : layer.m) m.ahead = gemv_calibration_.ahead;
    }
  }
}

std::string IncrementalModel::CpuFamily() const {
  return device_.is_cpu() && !generic_ ? CpuFamilyName(CpuFamilyInUse()) : "";
}

std::string IncrementalModel::KernelPath() const {
  std::string path = absl::StrCat(device_.str(), ": weights ", DtypeName(dtype_), ", memories ", DtypeName(kv_dtype_));
  if (generic_) {
    absl::StrAppend(&path, "; generic: libtorch ops", device_.is_cpu() ? " (--kernels generic)" : "");
    if (bf16_stream_) absl::StrAppend(&path, "; products bfloat16 in and out, their biases fused");
    if (sdpa_pass_) absl::StrAppend(&path, "; pass attention fused (scaled_dot_product_attention)");
    if (add_norm_) absl::StrAppend(&path, "; residual adds fused with their layer norms");
    if (skinny_rows_ > 0) absl::StrAppend(&path, "; products of up to ", skinny_rows_, " rows by SkinnyProduct");
    if (cuda_kernels_ && device_.is_cpu()) absl::StrAppend(&path, "; CUDA kernels launched on the CPU (tests)");
    if (split_decode_) {
      absl::StrAppend(&path, "; decode attention split over key chunks",
                      cuda_kernels_ ? " (CUDA kernels)" : " (its CPU form)");
    }
    if (decode_graphs_) {
      absl::StrAppend(
          &path,
          pass_graphs_ ? "; decode steps and small passes padded to buckets" : "; decode steps padded to buckets",
          CapturedPass::Capturable(device_) ? ", captured as CUDA graphs" : " (run eagerly: no CUDA)");
    }
    if (!graph_error_.empty()) {
      absl::StrAppend(&path, decode_graphs_ ? "; pass graphs" : "; graphs",
                      " off after a failed capture: ", graph_error_);
    }
    return path;
  }
  absl::StrAppend(&path, "; decode kernels ", CpuFamily());
  if (dtype_ == WeightDtype::kFloat32)
    return absl::StrCat(path, "; weights packed in panels (one copy), every product float32");
  const bool rows = !decode_.empty() && decode_[0].m[0].rows.defined();
  const bool panels = !decode_.empty() && PanelProducts(decode_[0].m[0]);
  absl::StrAppend(&path, " (", DtypeName(dtype_), " widened in registers; ");
  if (rows) {
    absl::StrAppend(&path, "one session's rows fetched ", gemv_calibration_.ahead, " ahead, timed at load in ",
                    static_cast<int>(gemv_calibration_.total_seconds * 1000 + 0.5), " ms)");
  } else {
    absl::StrAppend(&path, "weights packed in panels (one copy))");
  }
  if (!decode_.empty() && decode_[0].m[0].int8_products) {
    absl::StrAppend(&path,
                    "; several-session and prefill products int8 with VPDPBUSD (inputs quantized in blocks of 32)");
  }
  if (!bf16_products_) {
    return absl::StrCat(path, panels ? "; prefill products from the panels, widened to float32 (no AVX-512-BF16/AMX)"
                                     : "; prefill products float32 (weights widened per pass: no AVX-512-BF16/AMX)");
  }
  const bool amx = CpuRunsAmx() && isa_ == KernelIsa::kBest;
  if (dtype_ == WeightDtype::kBfloat16) {
    absl::StrAppend(&path, amx ? "; several-session and prefill products bfloat16 on AMX tiles"
                           : CpuRunsBf16Dot(isa_)
                               ? "; several-session and prefill products bfloat16 with VDPBF16PS (AVX-512-BF16)"
                               : "; several-session and prefill products bfloat16 inputs, float32 sums");
  } else if (!panels) {
    absl::StrAppend(&path, "; prefill products bfloat16 (oneDNN", CpuHasAmx() ? ", AMX)" : ", AVX-512-BF16)");
  }
  absl::StrAppend(&path, "; prefill attention ",
                  amx && PrefillAttentionRuns(config_.d_head) ? "fused on AMX tiles" : "bfloat16 products (oneDNN)");
  return path;
}

at::Tensor IncrementalModel::AttentionOperand(const at::Tensor& t) const {
  // With reduced weights on a CPU with bfloat16 products, a prefill's score
  // and value products run in bfloat16 too (AMX): in float32 they took most
  // of a long pass once the layers' products were bfloat16.
  return Bf16Attention() ? t.to(at::kBFloat16) : t;
}

at::Tensor IncrementalModel::AttentionProduct(const at::Tensor& a, const at::Tensor& b) const {
  return at::matmul(AttentionOperand(a), AttentionOperand(b));
}

bool IncrementalModel::PanelProducts(const DecodeMatrix& m) const {
  if (!m.rows.defined()) return true;  // the panels are all there is
  const Elem elem = m.elem;
  // float32: the panels are the only copy, and on the AMD EPYC they beat
  // libtorch's product at every length measured (OPTIMISATIONS step 17).
  // bfloat16: on AMX tiles or with VDPBF16PS, float32 in and out, the bias
  // added in the same pass, where oneDNN's product needed conversions on
  // both sides. int8: with VPDPBUSD, where oneDNN needed the weights widened
  // on every pass (a 64-token prefill of the base model: 35 -> 18-22 ms).
  return elem == Elem::kF32 || m.int8_products ||
         (elem == Elem::kBf16 && bf16_products_ && isa_ == KernelIsa::kBest && (CpuRunsAmx() || CpuRunsBf16Dot(isa_)));
}

at::Tensor IncrementalModel::Product(const at::Tensor& x, int64_t layer, int which, const at::Tensor& bias) const {
  if (!generic_ && PanelProducts(decode_[layer].m[which])) {
    // Each thread a range of x's rows against every panel.
    const PackedMatrix pm = decode_[layer].m[which].Packed();
    const at::Tensor in = x.contiguous();
    const int64_t T = in.size(0), panels = (pm.rows + kPanel - 1) / kPanel;
    at::Tensor y = at::empty({T, pm.rows}, in.options());
    const float* xp = in.data_ptr<float>();
    const float* b = bias.defined() ? bias.data_ptr<float>() : nullptr;
    float* yp = y.data_ptr<float>();
    at::parallel_for(0, (T + 15) / 16, 1, [&](int64_t begin, int64_t end) {
      const int64_t r0 = begin * 16, r1 = std::min(T, end * 16);
      PackedProduct(pm, xp + r0 * pm.cols, r1 - r0, b, false, yp + r0 * pm.rows, 0, panels, isa_);
    });
    return y;
  }
  const at::Tensor& w = *MatrixOf(weights_.layers[layer], which);
  if (at::Tensor y = SkinnyProduct(x, w, bias, false); y.defined()) return y;
  // float32, or bfloat16 activations: one kernel, the bias in it.
  if (w.scalar_type() == at::kFloat) return at::linear(x, w, bias);
  if (bf16_stream_) return at::linear(x.to(at::kBFloat16), w, bias);
  at::Tensor y;
  if (w.scalar_type() == at::kBFloat16) {
    y = bf16_products_ ? at::linear(x.to(at::kBFloat16), w).to(at::kFloat) : at::linear(x, w.to(at::kFloat));
  } else {  // int8: widened with its scales
    at::Tensor wf = w.to(at::kFloat) * decode_[layer].m[which].scale.unsqueeze(1);
    y = bf16_products_ ? at::linear(x.to(at::kBFloat16), wf.to(at::kBFloat16)).to(at::kFloat) : at::linear(x, wf);
  }
  return bias.defined() ? y.add_(bias) : y;
}

}  // namespace txl
