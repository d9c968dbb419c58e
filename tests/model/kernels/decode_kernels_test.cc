// The decode step's CPU kernels (model/kernels/decode_kernels.h) against libtorch, in
// every instruction set this machine runs; and the build's parallel loops.
#include "model/kernels/decode_kernels.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/kernels/amx_product.h"
#include "model/kernels/prefill_kernels.h"
#include "model/net/language_model.h"

namespace txl {
namespace {

std::vector<KernelIsa> IsasHere() {
  std::vector<KernelIsa> out;
  for (KernelIsa isa : {KernelIsa::kPlain, KernelIsa::kAvx2, KernelIsa::kAvx512}) {
    if (CpuRuns(isa)) out.push_back(isa);
  }
  return out;
}

double MaxAbsDiff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

const char* Name(Elem e) { return e == Elem::kF32 ? "f32" : e == Elem::kBf16 ? "bf16" : "i8"; }

// w [rows, cols] float in the kernel's element type: the stored tensor, its
// per-row scales (int8) and the float32 matrix it stands for exactly (the
// reference the kernels must match up to float32 summation order).
struct Typed {
  at::Tensor stored, scale, exact;
  WeightMatrix Matrix() const {
    WeightMatrix m;
    m.data = stored.data_ptr();
    m.elem = stored.scalar_type() == at::kFloat      ? Elem::kF32
             : stored.scalar_type() == at::kBFloat16 ? Elem::kBf16
                                                     : Elem::kI8;
    m.scale = scale.defined() ? scale.data_ptr<float>() : nullptr;
    m.ld = stored.size(1);
    return m;
  }
};

Typed MakeTyped(const at::Tensor& w, Elem e) {
  Typed t;
  if (e == Elem::kF32) {
    t.stored = w.contiguous();
    t.exact = t.stored;
  } else if (e == Elem::kBf16) {
    t.stored = w.to(at::kBFloat16).contiguous();
    t.exact = t.stored.to(at::kFloat);
  } else {
    t.scale = (w.abs().amax(1) / 127.0).contiguous();
    t.stored = (w / t.scale.clamp_min(1e-30).unsqueeze(1)).round().clamp(-127, 127).to(at::kChar).contiguous();
    t.exact = t.stored.to(at::kFloat) * t.scale.unsqueeze(1);
  }
  return t;
}

const Elem kElems[] = {Elem::kF32, Elem::kBf16, Elem::kI8};

// Shapes around the panel width (64), the vector widths (8, 16) and every
// tile height (1..6 rows and a remainder), with and without a bias, computed
// as two ranges of panels as two threads would; in every element type.
TEST(DecodeKernelsTest, PackedProductMatchesLinear) {
  at::manual_seed(3);
  for (KernelIsa isa : IsasHere()) {
    for (Elem elem : kElems) {
      for (int64_t rows : {1, 63, 64, 65, 200}) {
        for (int64_t cols : {1, 7, 64, 130}) {
          at::Tensor bias = at::randn({rows});
          const Typed w = MakeTyped(at::randn({rows, cols}), elem);
          std::vector<char> packed(PackedSize(rows, cols, elem) * ElemBytes(elem));
          PackPanels(w.Matrix(), rows, cols, packed.data());
          PackedMatrix pm{packed.data(), elem, w.Matrix().scale, rows, cols};
          const int64_t panels = (rows + kPanel - 1) / kPanel;
          for (int64_t batch : {1, 2, 5, 6, 7, 8, 13, 14}) {
            at::Tensor x = at::randn({batch, cols});
            for (int mode = 0; mode < 3; ++mode) {  // no bias; bias; bias and relu
              const bool with_bias = mode > 0, relu = mode == 2;
              at::Tensor y = at::full({batch, rows}, 1e9);  // every entry must be written
              const float* b = with_bias ? bias.data_ptr<float>() : nullptr;
              PackedProduct(pm, x.data_ptr<float>(), batch, b, relu, y.data_ptr<float>(), 0, panels / 2, isa);
              PackedProduct(pm, x.data_ptr<float>(), batch, b, relu, y.data_ptr<float>(), panels / 2, panels, isa);
              at::Tensor want = with_bias ? at::linear(x, w.exact, bias) : at::linear(x, w.exact);
              if (relu) want = at::relu(want);
              EXPECT_LT(MaxAbsDiff(y, want), 1e-4 * (1 + std::sqrt(cols)))
                  << "isa " << static_cast<int>(isa) << " " << Name(elem) << " rows " << rows << " cols " << cols
                  << " batch " << batch << " mode " << mode;
            }
          }
        }
      }
    }
  }
}

// bfloat16 weights with bfloat16 products (PackedMatrix::bf16_products): x
// rounded to bfloat16, exact products summed in float32. The widening paths
// sum in the same order, so they agree bit for bit; AMX and VDPBF16PS
// (kAvx512 where the CPU has them: CpuRunsAmx, CpuRunsBf16Dot) agree to
// summation order. CTest's cpu_avx512 runs this with the widening paths. Shapes cover partial tiles of
// AMX (rows of x beyond 16 and 32, columns not a multiple of 32).
TEST(DecodeKernelsTest, Bf16ProductsRoundTheInputAndAgreeOnEveryPath) {
  at::manual_seed(8);
  if (!CpuRunsAmx()) std::cout << "no AMX on this CPU: the emulated sums only\n";
  for (int64_t rows : {1, 64, 130}) {
    for (int64_t cols : {1, 7, 64, 130}) {
      const Typed w = MakeTyped(at::randn({rows, cols}), Elem::kBf16);
      std::vector<char> packed(PackedSize(rows, cols, Elem::kBf16) * ElemBytes(Elem::kBf16));
      PackPanels(w.Matrix(), rows, cols, packed.data());
      PackedMatrix pm{packed.data(), Elem::kBf16, nullptr, rows, cols};
      pm.bf16_products = true;
      const int64_t panels = (rows + kPanel - 1) / kPanel;
      at::Tensor bias = at::randn({rows});
      for (int64_t batch : {1, 7, 16, 17, 33}) {
        const at::Tensor x = at::randn({batch, cols});
        const at::Tensor want = at::relu(at::linear(x.to(at::kBFloat16).to(at::kFloat), w.exact, bias));
        at::Tensor plain;
        for (KernelIsa isa : IsasHere()) {
          at::Tensor y = at::full({batch, rows}, 1e9);
          PackedProduct(pm, x.data_ptr<float>(), batch, bias.data_ptr<float>(), true, y.data_ptr<float>(), 0,
                        panels / 2, isa);
          PackedProduct(pm, x.data_ptr<float>(), batch, bias.data_ptr<float>(), true, y.data_ptr<float>(), panels / 2,
                        panels, isa);
          const std::string where = "isa " + std::to_string(static_cast<int>(isa)) + " rows " + std::to_string(rows) +
                                    " cols " + std::to_string(cols) + " batch " + std::to_string(batch);
          EXPECT_LT(MaxAbsDiff(y, want), 1e-5 * (1 + std::sqrt(cols))) << where;
          // Without the rounding of x the error is of bfloat16's size.
          if (isa == KernelIsa::kPlain) {
            plain = y;
          } else if (isa == KernelIsa::kAvx2 || (!CpuRunsAmx() && !CpuRunsBf16Dot(isa))) {
            // The widened sums are the plain ones, bit for bit; AMX and
            // VDPBF16PS add a pair's products in their own order.
            EXPECT_TRUE(at::equal(y, plain)) << where;
          }
        }
      }
    }
  }
}

TEST(DecodeKernelsTest, GemvRowsMatchesMv) {
  at::manual_seed(4);
  for (KernelIsa isa : IsasHere()) {
    for (Elem elem : kElems) {
      for (int64_t rows : {1, 3, 4, 9, 130}) {
        for (int64_t cols : {1, 7, 8, 16, 64, 203}) {
          const Typed w = MakeTyped(at::randn({rows, cols}), elem);
          at::Tensor x = at::randn({cols}), bias = at::randn({rows});
          at::Tensor y = at::full({rows}, 1e9);
          const WeightMatrix m = w.Matrix();
          const int64_t mid = rows / 2;  // two ranges, as two threads would
          const double tol = 1e-4 * (1 + std::sqrt(cols));
          for (bool relu : {false, true}) {
            GemvRows(m, x.data_ptr<float>(), bias.data_ptr<float>(), relu, y.data_ptr<float>(), cols, 0, mid, isa);
            GemvRows(m, x.data_ptr<float>(), bias.data_ptr<float>(), relu, y.data_ptr<float>(), cols, mid, rows, isa);
            at::Tensor want = at::addmv(bias, w.exact, x);
            EXPECT_LT(MaxAbsDiff(y, relu ? at::relu(want) : want), tol)
                << "isa " << static_cast<int>(isa) << " " << Name(elem) << " rows " << rows << " cols " << cols
                << " relu " << relu;
          }
          GemvRows(m, x.data_ptr<float>(), nullptr, false, y.data_ptr<float>(), cols, 0, rows, isa);
          EXPECT_LT(MaxAbsDiff(y, at::mv(w.exact, x)), tol);
          // Fetching rows ahead (WeightMatrix::ahead) changes no result.
          WeightMatrix fetching = m;
          fetching.ahead = 3;
          at::Tensor z = at::full({rows}, 1e9);
          GemvRows(fetching, x.data_ptr<float>(), nullptr, false, z.data_ptr<float>(), cols, 0, rows, isa);
          EXPECT_TRUE(at::equal(y, z)) << Name(elem);
          // A block of columns [a, cols) of the same rows (row stride cols).
          const int64_t a = cols / 3;
          GemvRows(m.Block(0, a), x.data_ptr<float>() + a, nullptr, false, y.data_ptr<float>(), cols - a, 0, rows, isa);
          EXPECT_LT(MaxAbsDiff(y, at::mv(w.exact.slice(1, a), x.slice(0, a))), tol) << "block " << Name(elem);
        }
      }
    }
  }
}

// x quantized as int8 products do (PackedMatrix::int8_products): per block
// of 32 columns, scale max|x| / 127, values round(x / scale).
at::Tensor QuantizedInBlocks(const at::Tensor& x) {
  at::Tensor out = x.clone();
  for (int64_t c0 = 0; c0 < x.size(1); c0 += 32) {
    at::Tensor block = x.slice(1, c0, std::min<int64_t>(x.size(1), c0 + 32));
    at::Tensor scale = block.abs().amax(1, true) / 127.0;
    out.slice(1, c0, c0 + block.size(1)).copy_((block / scale.clamp_min(1e-30)).round() * scale);
  }
  return out;
}

// int8 products: quads of weights against x quantized in blocks, the sums
// exact in int32. Within float32 rounding of the product of the quantized x
// and the weights, on the dot product where the CPU has it and on the
// byte-by-byte path (a narrower isa asked for) alike; and a NaN in x makes
// its row's outputs NaN, as float32 sums would.
TEST(DecodeKernelsTest, Int8ProductsSumQuantizedInputsExactly) {
  at::manual_seed(8);
  for (KernelIsa isa : IsasHere()) {
    for (int64_t rows : {1, 64, 65, 200}) {
      for (int64_t cols : {1, 7, 32, 33, 130, 512}) {
        const Typed w = MakeTyped(at::randn({rows, cols}), Elem::kI8);
        std::vector<char> packed(PackedSize(rows, cols, Elem::kI8));
        PackPanels(w.Matrix(), rows, cols, packed.data(), /*int8_products=*/true);
        PackedMatrix pm{packed.data(), Elem::kI8, w.Matrix().scale, rows, cols};
        pm.int8_products = true;
        const int64_t panels = (rows + kPanel - 1) / kPanel;
        const at::Tensor bias = at::randn({rows});
        for (int64_t batch : {1, 5, 7, 8, 14}) {
          at::Tensor x = at::randn({batch, cols}) * 3;
          x.index_put_({0, 0}, 40.0f);  // one large input: its block's scale, not the others'
          at::Tensor y = at::full({batch, rows}, 1e9);
          PackedProduct(pm, x.data_ptr<float>(), batch, bias.data_ptr<float>(), true, y.data_ptr<float>(), 0,
                        panels / 2, isa);
          PackedProduct(pm, x.data_ptr<float>(), batch, bias.data_ptr<float>(), true, y.data_ptr<float>(), panels / 2,
                        panels, isa);
          const at::Tensor want =
              at::relu(at::linear(QuantizedInBlocks(x).to(at::kDouble), w.exact.to(at::kDouble), bias.to(at::kDouble)));
          EXPECT_LT(MaxAbsDiff(y.to(at::kDouble), want), 1e-5 * (1 + want.abs().max().item<double>()))
              << "isa " << static_cast<int>(isa) << " rows " << rows << " cols " << cols << " batch " << batch;
        }
        at::Tensor x = at::randn({2, cols});
        x.index_put_({1, cols - 1}, std::nanf(""));
        at::Tensor y = at::zeros({2, rows});
        PackedProduct(pm, x.data_ptr<float>(), 2, nullptr, false, y.data_ptr<float>(), 0, panels, isa);
        EXPECT_FALSE(y[0].isnan().any().item<bool>());
        EXPECT_TRUE(y[1].isnan().all().item<bool>()) << "a NaN input gave numbers";
      }
    }
  }
}

// float32 and bfloat16 models keep their weights only in panels (incremental.h,
// DecodeMatrix): one session's products read them in row ranges that need
// not be whole panels (a thread's heads) and in blocks of columns (its share
// of the output projection). Each row sums its columns in order, as the
// packed product does: the same bits.
TEST(DecodeKernelsTest, GemvFromPanelsSumsAsThePackedProduct) {
  at::manual_seed(6);
  for (KernelIsa isa : IsasHere()) {
    for (Elem elem : {Elem::kF32, Elem::kBf16}) {
      for (int64_t rows : {1, 5, 64, 130, 200}) {
        for (int64_t cols : {1, 7, 64, 203}) {
          const Typed w = MakeTyped(at::randn({rows, cols}), elem);
          std::vector<char> packed(PackedSize(rows, cols, elem) * ElemBytes(elem));
          PackPanels(w.Matrix(), rows, cols, packed.data());
          WeightMatrix m;
          m.data = packed.data();
          m.elem = elem;
          m.ld = PanelStride(cols, elem);
          m.panels = true;
          PackedMatrix pm{packed.data(), elem, nullptr, rows, cols};  // bfloat16: x stays float32, as here
          at::Tensor x = at::randn({cols}), bias = at::randn({rows});
          const std::string where =
              absl::StrCat("isa ", static_cast<int>(isa), " ", Name(elem), " rows ", rows, " cols ", cols);
          const double tol = 1e-4 * (1 + std::sqrt(cols));
          for (bool relu : {false, true}) {
            at::Tensor y = at::full({rows}, 1e9), want = at::full({rows}, 1e9);
            const int64_t a = rows / 3, b = 2 * rows / 3 + 1;  // three ranges, ends inside panels
            for (auto [r0, r1] :
                 {std::pair<int64_t, int64_t>{0, a}, {a, std::min(b, rows)}, {std::min(b, rows), rows}}) {
              GemvRows(m, x.data_ptr<float>(), bias.data_ptr<float>(), relu, y.data_ptr<float>(), cols, r0, r1, isa);
            }
            PackedProduct(pm, x.data_ptr<float>(), 1, bias.data_ptr<float>(), relu, want.data_ptr<float>(), 0,
                          (rows + kPanel - 1) / kPanel, isa);
            EXPECT_TRUE(at::equal(y, want)) << where << " relu " << relu;
            const at::Tensor exact = at::addmv(bias, w.exact, x);
            EXPECT_LT(MaxAbsDiff(y, relu ? at::relu(exact) : exact), tol) << where;
          }
          // Columns [c, cols) of every row, as a block (a thread's share;
          // bfloat16 blocks start at an even column).
          const int64_t c = cols / 3 / 2 * 2;
          at::Tensor y = at::full({rows}, 1e9);
          GemvRows(m.Block(0, c), x.data_ptr<float>() + c, nullptr, false, y.data_ptr<float>(), cols - c, 0, rows, isa);
          EXPECT_LT(MaxAbsDiff(y, at::mv(w.exact.slice(1, c), x.slice(0, c))), tol) << where;
          // Columns [c, c + width) with an odd width: the block's last
          // column is half of a pair whose other half is not its own.
          if (cols - c >= 3) {
            const int64_t width = (cols - c) % 2 == 1 ? cols - c : cols - c - 1;
            GemvRows(m.Block(0, c), x.data_ptr<float>() + c, nullptr, false, y.data_ptr<float>(), width, 0, rows, isa);
            EXPECT_LT(MaxAbsDiff(y, at::mv(w.exact.slice(1, c, c + width), x.slice(0, c, c + width))), tol) << where;
          }
          if (rows > kPanel) {  // a block from the second panel on
            at::Tensor z = at::full({rows - kPanel}, 1e9);
            GemvRows(m.Block(kPanel, c), x.data_ptr<float>() + c, nullptr, false, z.data_ptr<float>(), cols - c, 0,
                     rows - kPanel, isa);
            EXPECT_LT(MaxAbsDiff(z, at::mv(w.exact.slice(0, kPanel).slice(1, c), x.slice(0, c))), tol) << where;
          }
        }
      }
    }
  }
}

// The family in use is the widest the CPU has, or the one TXL_CPU_ISA names
// (CTest's cpu_* runs set it, only to families this CPU has): every query the
// kernels make follows it.
TEST(CpuFamilyTest, TheWidestTheCpuHasUnlessTxlCpuIsaNamesANarrowerOne) {
  const char* forced = std::getenv("TXL_CPU_ISA");
  if (forced != nullptr && *forced != '\0') {
    EXPECT_STREQ(CpuFamilyName(CpuFamilyInUse()), forced);
  } else {
    CpuFamily widest = CpuFamily::kPlain;
    for (CpuFamily f : {CpuFamily::kAvx2, CpuFamily::kAvx512, CpuFamily::kAvx512Bf16, CpuFamily::kAmx}) {
      if (CpuHasFamily(f)) widest = f;
    }
    EXPECT_EQ(CpuFamilyInUse(), widest);
  }
  const int in_use = static_cast<int>(CpuFamilyInUse());
  EXPECT_EQ(CpuRuns(KernelIsa::kAvx512), in_use >= static_cast<int>(CpuFamily::kAvx512));
  EXPECT_EQ(CpuRuns(KernelIsa::kAvx2), in_use >= static_cast<int>(CpuFamily::kAvx2));
  EXPECT_EQ(CpuHasAmx(), in_use >= static_cast<int>(CpuFamily::kAmx));
  EXPECT_EQ(CpuHasBf16Products(), in_use >= static_cast<int>(CpuFamily::kAvx512Bf16));
  EXPECT_STREQ(IsaName(KernelIsa::kBest), in_use >= static_cast<int>(CpuFamily::kAvx512) ? "avx512"
                                          : in_use == static_cast<int>(CpuFamily::kAvx2) ? "avx2"
                                                                                         : "plain");
}

TEST(DecodeKernelsTest, Bf16RoundsToNearestEvenAsLibtorch) {
  at::manual_seed(6);
  at::Tensor x = at::cat({at::randn({4096}) * 100, at::tensor({0.f, -0.f, 1e-40f, 3.4e38f, -65504.f})});
  at::Tensor want = x.to(at::kBFloat16).to(at::kFloat);
  at::Tensor got = x.clone();
  RoundToBf16(got.data_ptr<float>(), got.numel());
  EXPECT_TRUE(at::equal(got, want));
}

// One attention run over rings of `kv` and a position table of `rel_elem`.
struct AttentionCase {
  int64_t H = 3, mem_len = 11, cap = 11, rel_size = 12, dh;
  std::vector<int64_t> length = {10, 3, 0, 10}, position = {25, 3, 0, 10};
  int64_t B() const { return static_cast<int64_t>(length.size()); }
  std::vector<at::Tensor> k, v;  // float32 values (bfloat16-exact when kv is)
  at::Tensor qkv, u_bias, v_bias, rel;

  explicit AttentionCase(int64_t head) : dh(head) {
    for (int64_t b = 0; b < B(); ++b) {
      k.push_back(at::randn({H, cap, dh}).to(at::kBFloat16).to(at::kFloat));
      v.push_back(at::randn({H, cap, dh}).to(at::kBFloat16).to(at::kFloat));
    }
    qkv = at::randn({B(), 3, H, dh}) * 2;
    u_bias = at::randn({H, dh});
    v_bias = at::randn({H, dh});
    rel = at::randn({H, rel_size, dh}).to(at::kBFloat16).to(at::kFloat);
  }

  // Returns the output; *rings gets the rings after the run (float32).
  at::Tensor Run(KernelIsa isa, Elem kv, Elem rel_elem, std::vector<at::Tensor>* rings = nullptr) const {
    const at::ScalarType kt = kv == Elem::kF32 ? at::kFloat : at::kBFloat16;
    std::vector<at::Tensor> kr, vr;
    std::vector<DecodeSession> sessions;
    for (int64_t b = 0; b < B(); ++b) {
      kr.push_back(k[b].to(kt).contiguous());
      vr.push_back(v[b].to(kt).contiguous());
      sessions.push_back({kr[b].data_ptr(), vr[b].data_ptr(), cap, mem_len, position[b], length[b]});
    }
    at::Tensor q = qkv.clone();
    at::Tensor table = rel.to(rel_elem == Elem::kF32 ? at::kFloat : at::kBFloat16).contiguous();
    DecodeAttentionArgs args{sessions.data(),
                             B(),
                             H,
                             dh,
                             11,
                             q.data_ptr<float>(),
                             u_bias.data_ptr<float>(),
                             v_bias.data_ptr<float>(),
                             table.data_ptr(),
                             rel_size,
                             0.125f,
                             nullptr,
                             kv,
                             rel_elem};
    at::Tensor out = at::full({B(), H, dh}, 1e9);
    args.out = out.data_ptr<float>();
    DecodeAttention(args, 0, B() * H, isa);
    if (rings != nullptr) {
      rings->clear();
      for (int64_t b = 0; b < B(); ++b) {
        rings->push_back(kr[b].to(at::kFloat));
        rings->push_back(vr[b].to(at::kFloat));
      }
    }
    return out;
  }
};

// The engine's tests check the widest variant against the one-pass model;
// the others must compute the same attention. Sessions of different lengths,
// wrapped rings and head sizes 64 (register path), 48 and 24.
TEST(DecodeKernelsTest, AttentionVariantsAgree) {
  at::manual_seed(5);
  for (int64_t dh : {64, 48, 24}) {  // 64 and 48 read bfloat16 split on some ISAs (AttendBody kPairs)
    AttentionCase t(dh);
    std::vector<at::Tensor> outs;
    for (KernelIsa isa : IsasHere()) outs.push_back(t.Run(isa, Elem::kF32, Elem::kF32));
    for (size_t i = 1; i < outs.size(); ++i) EXPECT_LT(MaxAbsDiff(outs[i], outs[0]), 1e-5) << "dh " << dh;
    EXPECT_LT(outs[0].abs().max().item<double>(), 1e3);  // every output written
  }
}

// bfloat16 rings and tables hold values float32 holds exactly, so the narrow
// kernels must compute the float32 attention of those values, with the new
// key and value rounded first, and leave them rounded in the ring.
TEST(DecodeKernelsTest, Bf16AttentionIsFloat32OfTheRoundedValues) {
  at::manual_seed(7);
  for (int64_t dh : {64, 48, 24}) {  // 64 and 48 read bfloat16 split on some ISAs (AttendBody kPairs)
    AttentionCase t(dh);
    AttentionCase rounded = t;
    for (int which = 1; which < 3; ++which) {
      rounded.qkv.select(1, which).copy_(t.qkv.select(1, which).to(at::kBFloat16).to(at::kFloat));
    }
    std::vector<at::Tensor> want_rings, got_rings;
    const at::Tensor want = rounded.Run(KernelIsa::kBest, Elem::kF32, Elem::kF32, &want_rings);
    for (KernelIsa isa : IsasHere()) {
      for (auto [kv, rel] : {std::pair{Elem::kBf16, Elem::kBf16}, std::pair{Elem::kBf16, Elem::kF32}}) {
        const at::Tensor got = t.Run(isa, kv, rel, &got_rings);
        EXPECT_LT(MaxAbsDiff(got, want), 1e-5) << "dh " << dh << " isa " << static_cast<int>(isa);
        for (size_t i = 0; i < want_rings.size(); ++i) EXPECT_TRUE(at::equal(got_rings[i], want_rings[i])) << i;
      }
      // Float32 rings with a bfloat16 table: the new key stays float32.
      const at::Tensor mixed = t.Run(isa, Elem::kF32, Elem::kBf16);
      EXPECT_LT(MaxAbsDiff(mixed, t.Run(KernelIsa::kBest, Elem::kF32, Elem::kF32)), 1e-5);
    }
  }
}

// The prefill's fused softmax against the tensor operations it replaces
// (gather, add, scale, mask, softmax), for sessions of different history,
// window and length (padding rows), in each element type and each path.
TEST(DecodeKernelsTest, ScoreSoftmaxMatchesTensorOps) {
  at::manual_seed(8);
  const int64_t H = 2, N = 13, K = 40, D = 40;
  const std::vector<int64_t> m = {20, 0, 27}, n = {13, 5, 13}, M = {16, 64, 30};
  const int64_t B = static_cast<int64_t>(m.size());
  const at::Tensor ac = at::randn({B, H, N, K}) * 3, bd = at::randn({B, H, N, D}) * 3;
  // The reference, as IncrementalModel::Pass computed it before the kernel.
  const auto lopt = at::TensorOptions().dtype(at::kLong);
  const at::Tensor mt = at::tensor(m, lopt).view({B, 1, 1}), nt = at::tensor(n, lopt).view({B, 1, 1}),
                   Mt = at::tensor(M, lopt).view({B, 1, 1});
  const at::Tensor qi = at::arange(N, lopt).view({1, N, 1}), kj = at::arange(K, lopt).view({1, 1, K});
  const at::Tensor dist = mt + qi - kj;
  const at::Tensor masked = (((kj >= mt + nt) | (dist < 0) | (dist >= Mt)) & (qi < nt)).unsqueeze(1);
  const at::Tensor idx = dist.clamp(0, D - 1).unsqueeze(1).expand({B, H, N, K});
  for (at::ScalarType type : {at::kFloat, at::kBFloat16}) {
    const at::Tensor a = ac.to(type).contiguous(), d = bd.to(type).contiguous();
    at::Tensor want =
        at::softmax((a.to(at::kFloat) + d.to(at::kFloat).gather(3, idx)).mul(0.3).masked_fill(masked, -INFINITY), -1);
    want = want * (qi < nt).unsqueeze(1);  // padding rows: zeros
    for (KernelIsa isa : IsasHere()) {
      at::Tensor got = at::full({B, H, N, K}, 7.0, type);
      ScoreSoftmaxArgs args;
      args.ac = a.data_ptr();
      args.bd = d.data_ptr();
      args.elem = type == at::kFloat ? Elem::kF32 : Elem::kBf16;
      args.heads = H;
      args.N = N;
      args.K = K;
      args.D = D;
      args.held = m.data();
      args.fed = n.data();
      args.window = M.data();
      args.scale = 0.3f;
      args.prob = got.data_ptr();
      args.prob_elem = args.elem;
      ScoreSoftmax(args, 0, 7, isa);
      ScoreSoftmax(args, 7, B * H * N, isa);
      EXPECT_LT(MaxAbsDiff(got.to(at::kFloat), want), type == at::kFloat ? 1e-6 : 4e-3)
          << "bf16 " << (type != at::kFloat) << " isa " << static_cast<int>(isa);
      if (type == at::kBFloat16) {
        // bfloat16 probabilities are the float32 ones rounded to nearest
        // even, as libtorch rounds (the tolerance above would pass truncation).
        at::Tensor wide = at::full({B, H, N, K}, 7.0);
        args.prob = wide.data_ptr();
        args.prob_elem = Elem::kF32;
        ScoreSoftmax(args, 0, B * H * N, isa);
        EXPECT_TRUE(at::equal(got, wide.to(at::kBFloat16))) << "isa " << static_cast<int>(isa);
      }
    }
  }
}

// Regression: at::parallel_for is a header template, so model/ must itself be
// compiled with OpenMP; without it every decode kernel ran on one thread.
// The clang (sanitizer) builds cannot share libtorch's OpenMP runtime and
// stay serial by design (model/CMakeLists.txt).
TEST(DecodeKernelsTest, ParallelLoopsUseTheIntraOpThreads) {
  const int before = at::get_num_threads();
  SetThreads(2);
#if defined(__GNUC__) && !defined(__clang__)
  EXPECT_EQ(ParallelLoopThreads(), 2);
#else
  EXPECT_EQ(ParallelLoopThreads(), 1);
#endif
  SetThreads(before);
}

}  // namespace
}  // namespace txl
