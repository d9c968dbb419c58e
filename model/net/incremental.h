// The incremental (serving) form of Transformer-XL. Each session keeps the
// projected keys and values of every layer for its last mem_len - 1
// positions; a step advances a batch of sessions, each by 0..n new tokens.
//
// Semantics (docs/MODEL.md, "The model, and why serving it incrementally is exact"): every token attends to itself and
// the tokens before it, at most mem_len keys in all (the original same_length mask). Hidden states are therefore a pure
// function of the token history, and any chunking or batching gives the same results up to float rounding.
#ifndef TXL_MODEL_NET_INCREMENTAL_H_
#define TXL_MODEL_NET_INCREMENTAL_H_

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "model/kernels/decode_kernels.h"
#include "model/kernels/prefill_attention.h"
#include "model/kernels/skinny_product.h"
#include "model/model_config.h"
#include "model/net/cuda_graph.h"
#include "model/net/decode_buckets.h"
#include "model/net/gemv_calibration.h"
#include "model/net/huge_pages.h"
#include "model/net/session_memory.h"
#include "model/net/shared_slot_pools.h"
#include "model/net/slot_pool.h"
#include "model/net/weights.h"
#include "model/precision.h"
#include "model/step.h"

namespace txl {

// Whether this libtorch has at::scaled_dot_product_attention (2.x; Debian
// 12's 1.13 has not): Precision::sdpa_pass_attention needs it.
bool TorchHasSdpa();

// Owns the weights on one device and the relative-position key table.
// Not thread-safe: one thread (the engine's) drives it.
class IncrementalModel {
 public:
  // How the model computes. float32 everywhere is exact; see precision.h.
  struct Precision {
    WeightDtype dtype = WeightDtype::kFloat32;
    KvDtype kv_dtype = KvDtype::kFloat32;
    // The decode kernels' instruction set (tests force the narrower ones).
    KernelIsa isa = KernelIsa::kBest;
    // Prefill products of bfloat16 / int8 weights run as bfloat16 matrix
    // products (oneDNN: AMX tiles or AVX-512-BF16) where the CPU has them,
    // and so do the several-session decode products of bfloat16 weights
    // (vdpbf16ps), and int8 weights' as int8 products (VPDPBUSD, where the
    // CPU runs CpuRunsInt8Dot); false, or a CPU without them, widens the
    // weights to float32 per pass and keeps the activations float32.
    bool bf16_products = true;
    // kGeneric: libtorch's ops, as on a GPU, on a CPU too (precision.h).
    Kernels kernels = Kernels::kAuto;
    // Decode steps (one token per session, every memory in the pool) padded
    // to a DecodeBucket and, on a GPU, captured once per bucket as a CUDA
    // graph and replayed. On a CPU with kGeneric the same padded passes run
    // eagerly (the tests' view of the graphs); ignored on the CPU kernels.
    bool decode_graphs = false;
    // With decode_graphs, small multi-token passes padded and captured too
    // (docs/MODEL.md, "Small multi-token passes, padded too"); false keeps
    // them unpadded (tests of the decode graphs alone).
    bool pass_graphs = true;
    // The generic path's decode passes (one token per session, every memory
    // in the pool) attend through SplitDecodeAttention (model/kernels/
    // split_decode_attention.h): the CUDA kernels on a GPU, their CPU run
    // with kGeneric. false: the tensor ops of every other pass.
    bool split_decode_attention = true;
    // A session feeding at most kDecodeFeedTokens tokens feeds them a pass
    // of one token at a time, beside the step's decoders (decode passes on
    // the CPU kernels, padded graph passes on the generic path with decode
    // graphs), and only sessions feeding more go through Pass. false: any
    // session feeding several tokens takes the whole step through Pass.
    bool decode_short_feeds = true;
    // The generic path with bfloat16 weights (a GPU's): every product takes
    // and gives bfloat16, with its bias in the same kernel, and the
    // attention's keys, values and the split attention's query and result
    // are bfloat16 (docs/MODEL.md, "bfloat16 activations on the generic
    // path"). The residual stream, the layer norms, the softmax, the split
    // attention's sums and the readout stay float32. false: float32 between
    // the products, each product converting its input and output.
    bool bf16_activations = true;
    // The generic path's multi-token passes attend through one
    // at::scaled_dot_product_attention, the relative-position scores (scaled,
    // at each key's distance, -inf outside the window) its additive mask: on
    // a GPU a fused kernel reads the scores once, where the tensor ops write
    // and read them about eight times (docs/MODEL.md, "The pass attention as
    // one fused product"). Needs libtorch 2.1 or later (TorchHasSdpa); off by default
    // until measured on a device.
    bool sdpa_pass_attention = false;
    // A post-norm model's residual adds and layer norms on the generic path,
    // LayerNorm(x + sublayer), one kernel each (model/kernels/
    // residual_layer_norm.h) where libtorch launches two: the CUDA kernel on
    // a GPU, its CPU form with kGeneric. Pre-norm models keep the tensor ops.
    // false: at::layer_norm of the add (to measure the one against the other).
    bool fused_add_norm = true;
    // The generic path's products of at most this many rows (decode steps
    // of as many sessions), 0 to kSkinnyMaxRows, by SkinnyProduct
    // (model/kernels/skinny_product.h), float32 weights or bfloat16 in and
    // out, the bias and the ReLU in the same kernel: the CUDA kernel on a
    // GPU, its CPU form with kGeneric. More rows, or 0: libtorch's products
    // (cuBLAS), whose tiles reuse each weight; less than the most only to
    // measure the one against the other.
    int64_t skinny_max_rows = kSkinnyMaxRows;
    // Tests only: on a CPU with kGeneric, launch our CUDA kernels
    // (cuda_launch.h) where their CPU forms would run, with what a GPU's
    // launches take beside them (the split attention's counters), so that a
    // test binary whose launches run the kernels' sources on the block
    // emulator (tests/model/cuda/emulated_device_test.cc) checks the model's
    // arguments to them. Refused on a CUDA device, and in the CUDA build
    // (its launches would queue device kernels over host memory); in a
    // build without CUDA whose launches are the stubs, they throw.
    bool emulate_cuda_kernels = false;
  };
  IncrementalModel(ModelConfig config, TxlWeights weights, at::Device device, Precision precision);
  IncrementalModel(ModelConfig config, TxlWeights weights, at::Device device)
      : IncrementalModel(std::move(config), std::move(weights), device, Precision()) {}
  // Names the kernels in use (LanguageModel::KernelPath).
  std::string KernelPath() const;
  // The CPU kernel family in use (cpu_isa.h; TXL_CPU_ISA caps it); empty off the CPU kernels.
  std::string CpuFamily() const;

  // Advances every input's session (a SessionMemory of this model) by its
  // tokens and returns the last layer's hidden states [sum of token counts,
  // d_model], inputs in order; targets and distributions are the caller's
  // (LanguageModel::Step). Long inputs run in
  // passes of at most kPassTokens tokens (invisible: results are chunk
  // invariant). Memories change only when the whole step succeeds; on an
  // exception (c10::Error) every session is left as it was.
  at::Tensor Step(absl::Span<const StepInput> inputs);
  // What the caller reads from a step's hidden states before the memories
  // commit (LanguageModel::Step: picks, log-probs, rows).
  using Readout = std::function<absl::Status(const at::Tensor& hidden)>;
  // Step, with `readout` run on the hidden states before any memory
  // commits: when it fails (a status, or an exception) every session is
  // left as it was too, and its status is returned.
  absl::Status Step(absl::Span<const StepInput> inputs, const Readout& readout);

  const ModelConfig& config() const { return config_; }
  // The layers' product matrices are of the weight dtype (int8: see
  // decode_); everything else is float32.
  const TxlWeights& weights() const { return weights_; }
  at::ScalarType kv_type() const { return kv_dtype_ == KvDtype::kBfloat16 ? at::kBFloat16 : at::kFloat; }
  const at::Device& device() const { return device_; }
  // The generic path's memory pool (null on the CPU kernels).
  const SlotPool* pool() const { return pool_.get(); }
  // Generic path: makes the pool hold `bytes` of session memory now (plus
  // its padding row); a no-op on the CPU kernels. Throws c10::Error when the
  // device cannot.
  void ReserveSessionMemory(int64_t bytes);
  // Generic path: from now on, this model's sessions take their rows from
  // the pool `pools` holds for its shape (it joins with its own pool where
  // there is none yet); a no-op on the CPU kernels. Call it before the model
  // serves (sessions made before keep the pool they took rows from).
  void JoinSharedPool(SharedSlotPools& pools);

  static constexpr int64_t kPassTokens = 512;
  // A session feeding at most this many tokens feeds them a pass of one
  // token at a time: a decode pass on the CPU kernels, a padded graph pass
  // (or Pass) on the generic path (docs/MODEL.md, "Mixed steps").
  static constexpr int64_t kDecodeFeedTokens = 3;

  // A multi-token pass is padded to a bucket (and on a GPU captured) when
  // its padded tokens and score block are at most these: small passes,
  // whose time is the launches' (a scoring step of 32 sessions' 64-token
  // segments at a window of 640 is one), not large prefills, whose
  // captures would each keep their own score blocks' memory.
  static constexpr int64_t kPassGraphTokens = 2048;
  static constexpr int64_t kPassGraphScores = int64_t{1} << 24;
  // At most this many buckets of multi-token passes are held (each capture
  // keeps its output); a pass of another bucket then runs unpadded.
  static constexpr int64_t kPassGraphBuckets = 32;

  // What the graphs did so far: padded decode passes, and of those how many
  // were captured and how many replayed (the rest ran eagerly); the same for
  // padded multi-token passes.
  struct GraphCounts {
    int64_t padded = 0, captured = 0, replayed = 0;
    int64_t pass_padded = 0, pass_captured = 0, pass_replayed = 0;
  };
  const GraphCounts& graph_counts() const { return graph_counts_; }
  // Buckets with a graph's metadata (and, on a GPU, its capture).
  int64_t graphs_held() const { return static_cast<int64_t>(graphs_.size()); }
  // Why graphs turned themselves off (a capture failed), or empty.
  const std::string& graph_error() const { return graph_error_; }

 private:
  // A session's memory as it evolves during one step; committed at the end.
  // k[l] / v[l] are undefined until a pass replaces the memory (then
  // [length, H, dh], the held positions in order); until then the memory is
  // read from the session's ring.
  struct Pending {
    SessionMemory* memory;
    int64_t length;
    int64_t position;
    std::vector<at::Tensor> k, v;
    bool replaced() const { return !k.empty() && k[0].defined(); }
  };
  // Several tokens per session (incremental_pass.cc), in the parts below.
  at::Tensor Pass(std::vector<Pending*>& batch, const std::vector<std::vector<int64_t>>& tokens);
  struct PassGeometry;  // the pass's shape: per session its tokens, held keys and window
  struct PoolPlan;      // generic path: the pool rows each layer's keys go to and come from
  struct PassMeta;      // the pass's metadata on the device, uploaded in one copy
  PassGeometry Geometry(const std::vector<Pending*>& batch, const std::vector<std::vector<int64_t>>& tokens) const;
  PoolPlan PlanPool(const std::vector<Pending*>& batch, const PassGeometry& g) const;
  PassMeta UploadMeta(const PassGeometry& g, const PoolPlan& plan) const;
  // UploadMeta in its two halves: the host values in one vector, and the
  // device tensors (masks among them) derived from their upload. PackMeta
  // writes MetaCount values straight into `out` (a graph's pinned buffer).
  std::vector<int64_t> PackMeta(const PassGeometry& g, const PoolPlan& plan) const;
  int64_t MetaCount(const PassGeometry& g, const PoolPlan& plan) const;
  std::vector<const std::vector<int64_t>*> MetaParts(const PassGeometry& g, const PoolPlan& plan) const;
  void PackMeta(const PassGeometry& g, const PoolPlan& plan, int64_t* out) const;
  PassMeta DeriveMeta(const PassGeometry& g, const PoolPlan& plan, const at::Tensor& on_device) const;
  // Every layer of a pass, from the embedding to the last hidden states
  // [T, d]; the new memories of sessions not written in place go to new_k/v.
  at::Tensor Layers(const std::vector<Pending*>& batch, const PassGeometry& g, const PoolPlan& plan,
                    const PassMeta& meta, std::vector<std::vector<at::Tensor>>& new_k,
                    std::vector<std::vector<at::Tensor>>& new_v);
  // Decode graphs (incremental_graphs.cc): whether a pass can be padded to a
  // bucket, and the padded pass, replayed from its capture where there is one.
  struct RingBackup;  // below
  // A padded pass writes each session's key into the slot of its next
  // position at once: eligible where that slot held no committed position
  // when the step began, or `backup` kept it.
  bool GraphEligible(const std::vector<Pending*>& batch, const std::vector<std::vector<int64_t>>& tokens,
                     const RingBackup& backup) const;
  at::Tensor GraphDecodePass(std::vector<Pending*>& batch, const std::vector<std::vector<int64_t>>& tokens);
  // The same for a pass of several tokens a session (the most is 2 or more):
  // eligible where the padded pass is within kPassGraphTokens and
  // kPassGraphScores, its bucket is held or there is room for it
  // (kPassGraphBuckets), and every session's overwritten slots are in `backup`.
  bool PassGraphEligible(const std::vector<Pending*>& batch, const std::vector<std::vector<int64_t>>& tokens,
                         const RingBackup& backup) const;
  at::Tensor GraphPass(std::vector<Pending*>& batch, const std::vector<std::vector<int64_t>>& tokens);
  // The geometry and pool plan of `bucket` with every session a padding
  // one: token 0, no memory, its keys written to the pool's discard row.
  static std::pair<PassGeometry, PoolPlan> Padded(const DecodeBucket& bucket);
  // A padded pass of `bucket`: its metadata into the bucket's static
  // buffer, then the capture's replay, a capture, or (on a CPU, or once a
  // capture failed) the pass run eagerly. Returns [T, d] of the padded pass.
  at::Tensor RunPadded(const DecodeBucket& bucket, const PassGeometry& g, const PoolPlan& plan);
  // The held positions of a session in layer l, in order, [length, H, dh] float32.
  at::Tensor Held(const Pending& p, int64_t l, bool key) const;
  // Layer l's new keys and values [T, H, dh] that go in place into their
  // sessions' rings or rows (without the pool plan).
  void WriteInPlace(const std::vector<Pending*>& batch, const PassGeometry& g, int64_t l, const at::Tensor& k,
                    const at::Tensor& v) const;
  // Layer l's keys and values of every session, held then new, padded to
  // [B, Kmax, H, dh] float32.
  std::pair<at::Tensor, at::Tensor> GatherKeys(const std::vector<Pending*>& batch, const PassGeometry& g,
                                               const PoolPlan& plan, const PassMeta& meta, int64_t l,
                                               const at::Tensor& k, const at::Tensor& v,
                                               const at::TensorOptions& fopt) const;
  // Layer l's attention output [T, H * dh] of the queries in qkv [T, 3, H, dh]
  // over the padded keys and values, by one of the three below.
  at::Tensor PassAttention(const PassGeometry& g, const PassMeta& meta, int64_t l, const at::Tensor& qkv,
                           const at::Tensor& Kp, const at::Tensor& Vp, const at::TensorOptions& fopt);
  at::Tensor FusedAttention(const PassGeometry& g, int64_t l, const at::Tensor& qkv, const at::Tensor& Kp,
                            const at::Tensor& Vp, const at::TensorOptions& fopt);
  at::Tensor BlockedAttention(const PassGeometry& g, const at::Tensor& qu, const at::Tensor& Kq, const at::Tensor& Vq,
                              const at::Tensor& bd_all) const;
  at::Tensor TensorOpAttention(const PassMeta& meta, const at::Tensor& qu, const at::Tensor& Kq, const at::Tensor& Vq,
                               const at::Tensor& bd_all) const;
  // The same as one at::scaled_dot_product_attention (sdpa_pass_), whose
  // bd_scaled is bd_all with the score scale folded into its query.
  at::Tensor SdpaAttention(const PassMeta& meta, const at::Tensor& qu, const at::Tensor& Kq, const at::Tensor& Vq,
                           const at::Tensor& bd_scaled) const;
  // Whether a pass attends by SplitDecode: the generic path, one token per
  // session, every new key written into the pool (by SplitDecode's kernel).
  bool SplitDecodeRuns(const PassGeometry& g, const PoolPlan& plan) const;
  // Layer l's new keys and values [T, H, dh] into their pool rows (the pool plan's writes).
  void WritePool(const PoolPlan& plan, const PassMeta& meta, int64_t l, const at::Tensor& k, const at::Tensor& v) const;
  // LayerNorm(x + add) (x float32 [T, d], add float32 or bfloat16), one
  // fused kernel with add_norm_, else the add and at::layer_norm. With
  // bf16_stream_ and the fused kernel, *narrow (where given) is the result
  // rounded to bfloat16 by the same kernel (the next products' input); else
  // undefined.
  at::Tensor AddNorm(const at::Tensor& x, const at::Tensor& add, const at::Tensor& weight, const at::Tensor& bias,
                     at::Tensor* narrow) const;
  // Layer l's attention output [B, H * dh] read from the pool in place,
  // after its kernel has stored each session's new key and value there
  // (SplitDecodeArgs::write_rows).
  at::Tensor SplitDecode(const PassGeometry& g, const PassMeta& meta, int64_t l, const at::Tensor& qkv) const;
  // The last keys and values of layer l that the window needs next, for the
  // sessions whose memory the pass replaces.
  static void KeepWindow(const PassGeometry& g, int64_t l, const at::Tensor& Kp, const at::Tensor& Vp,
                         std::vector<std::vector<at::Tensor>>& new_k, std::vector<std::vector<at::Tensor>>& new_v);
  // The slots that a step writes while they still hold a position committed
  // before it, copied so that a step that throws puts them back. Rings: the
  // later decode passes of Step's `few` sessions (CPU kernels). The pool:
  // every session's passes, which write their new keys in place (the
  // generic path builds no memory aside), all sessions' rows in one copy
  // per layer.
  struct RingBackup {
    struct Saved {
      SessionMemory* memory;
      at::Tensor slots;              // [s] ring slots
      std::vector<at::Tensor> k, v;  // per layer [H, s, dh]
    };
    std::vector<Saved> saved;
    SlotPool* pool = nullptr;                  // where the pooled rows go back to
    at::Tensor pool_rows;                      // [r] on the device
    std::vector<at::Tensor> pk, pv;            // per layer [r, H, dh]
    std::vector<const SessionMemory*> pooled;  // whose rows pool_rows holds
    void Restore();
    bool Holds(const SessionMemory* memory) const;
  };
  RingBackup BackUpOverwritten(absl::Span<const StepInput> inputs, const std::vector<size_t>& few) const;
  // One token per session, memories read and written in place (CPU, float).
  at::Tensor DecodePass(std::vector<Pending*>& batch, const std::vector<std::vector<int64_t>>& tokens);
  void Reserve(SessionMemory* memory, int64_t needed, SlotPool::Admitted use) const;
  // Generic path: moves a memory's rings into the pool (no-op if it is there).
  void Adopt(SessionMemory* memory, SlotPool::Admitted use) const;
  // Positions [first, first + n) of a memory's layer-l keys (or values) as
  // [n, H, dh] of the kv type, from its rings or its pool rows; and writes.
  at::Tensor HeldRows(const SessionMemory& m, int64_t l, bool key, int64_t first, int64_t n) const;
  void WriteRows(SessionMemory& m, int64_t l, bool key, int64_t first, const at::Tensor& rows) const;
  // Pool rows of positions [first, first + n) of a pooled memory, as a
  // vector or into `out`: at most two runs of the ring copied, not a
  // division a row (a decode step of 32 sessions at a window of 800 reads
  // 25,600 of them).
  std::vector<int64_t> PoolRows(const SessionMemory& m, int64_t first, int64_t n) const;
  void PoolRows(const SessionMemory& m, int64_t first, int64_t n, int64_t* out) const;
  // x [T, cols] times layer l's matrix `which` (0 qkv, 1 o, 2 ff1, 3 ff2)
  // transposed, plus bias (may be undefined), in the weight dtype's way.
  at::Tensor Product(const at::Tensor& x, int64_t layer, int which, const at::Tensor& bias) const;
  // x w^T + bias (ReLU'd with relu) by SkinnyProduct, in w's type, where it
  // takes the shapes and types (x of at most skinny_rows_ rows, float32
  // weights or bfloat16 activations); else undefined.
  at::Tensor SkinnyProduct(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, bool relu) const;
  // relu(x W_ff1^T + b_ff1) of layer l: fused where libtorch can.
  at::Tensor ReluProduct(const at::Tensor& x, int64_t l) const;
  // a @ b for a prefill's attention: in bfloat16 (result bfloat16) where
  // the products are, else float32.
  // A prefill's attention products run in bfloat16 (reduced weights on a
  // CPU or device with bfloat16 products).
  bool Bf16Attention() const { return dtype_ != WeightDtype::kFloat32 && bf16_products_; }
  // t in the type AttentionProduct multiplies in (bfloat16 or t itself): an
  // operand used by several products is converted once.
  at::Tensor AttentionOperand(const at::Tensor& t) const;
  at::Tensor AttentionProduct(const at::Tensor& a, const at::Tensor& b) const;
  void EnsureRelTable(int64_t distances);
  // The constructor's second half (incremental_weights.cc): the weights in
  // the form the kernels read, or the generic path's pool.
  void PrepareWeights();

  ModelConfig config_;
  TxlWeights weights_;
  at::Device device_;
  WeightDtype dtype_;
  KvDtype kv_dtype_;
  KernelIsa isa_;
  // libtorch's ops compute the layers (a GPU, or --kernels generic): no
  // decode_, and Pass takes its tensor-op branches.
  bool generic_;
  bool bf16_products_;   // the prefill products run in bfloat16 (Product), and the several-session decode ones
  bool bf16_stream_;     // Precision::bf16_activations in effect: generic, bfloat16 weights and products
  bool sdpa_pass_;       // Precision::sdpa_pass_attention in effect: generic, libtorch 2.1 or later
  bool add_norm_;        // Precision::fused_add_norm in effect: generic, post-norm
  int64_t skinny_rows_;  // Precision::skinny_max_rows in effect: 0 unless generic
  // Our kernels run as CUDA launches (a GPU, or Precision::emulate_cuda_kernels), not as their CPU forms.
  bool cuda_kernels_;
  // The hidden states' type between a pass's products: bfloat16 with
  // bf16_stream_, else float32.
  at::ScalarType StreamType() const { return bf16_stream_ ? at::kBFloat16 : at::kFloat; }
  // Per layer, what the CPU kernels read: each product matrix packed in
  // panels (decode_kernels.h: the several-session products, the prefill's
  // where they run on them, and for float32 and bfloat16 every product), for
  // int8 also row-major (the one-session products and the other prefills),
  // and the attention biases as contiguous [H, dh]. float32 and bfloat16
  // keep no row-major copy: two would hold the weights twice (W5 in
  // docs/PERFORMANCE.md). CPU models only (empty otherwise).
  struct DecodeMatrix {
    at::Tensor rows, packed;  // [n_rows, n_cols] (int8 only, mostly) and PackedSize, of elem
    at::Tensor scale;         // int8: [rows] float
    int64_t n_rows = 0, n_cols = 0;
    int64_t ahead = 0;  // WeightMatrix::ahead (gemv_calibration_)
    Elem elem = Elem::kF32;
    bool bf16_products = false;  // PackedMatrix::bf16_products (bfloat16 with bf16_products_)
    bool int8_products = false;  // PackedMatrix::int8_products (int8 where CpuRunsInt8Dot(isa_))
    // What GemvRows reads: the rows, or for float32 the panels.
    WeightMatrix Gemv() const;
    PackedMatrix Packed() const;
  };
  // Whether Product runs this CPU matrix's products from the panels
  // (PackedProduct).
  bool PanelProducts(const DecodeMatrix& m) const;
  struct DecodeLayer {
    DecodeMatrix m[4];  // qkv, o, ff1, ff2
    at::Tensor u, v;
  };
  std::vector<DecodeLayer> decode_;
  // bfloat16 and int8 on the CPU kernels: how far ahead one session's
  // products fetch rows, timed at load (gemv_calibration.h).
  GemvCalibration gemv_calibration_;
  // The fused prefill attention's operands (prefill_attention.h), reused.
  PrefillAttentionBuffers prefill_buffers_;
  // Generic path: every session's memory (slot_pool.h).
  std::shared_ptr<SlotPool> pool_;
  // Decode graphs: per bucket, the static metadata on the device that each
  // step's values are copied into, and the capture that reads it. They hold
  // the pool's and the position table's addresses: a pool that grew or a
  // table that was rebuilt drops them all.
  bool decode_graphs_;
  bool pass_graphs_;   // multi-token passes padded too: with decode_graphs_, until a capture of one fails
  bool split_decode_;  // Precision::split_decode_attention, on the generic path
  bool short_feeds_;   // Precision::decode_short_feeds
  struct DecodeGraph {
    at::Tensor meta;
    int64_t distances = 0;  // the pass's PassGeometry::D: a shape its capture holds
    std::unique_ptr<CapturedPass> captured;
    bool warm_up_failed = false;  // a pass's: its bucket runs unpadded from then on
  };
  std::map<DecodeBucket, DecodeGraph> graphs_;
  int64_t graphs_pool_generation_ = -1;
  const SlotPool* graphs_pool_ = nullptr;  // the pool the captures were made on
  int64_t graphs_rel_size_ = -1;
  GraphCounts graph_counts_;
  std::string graph_error_;
  std::vector<at::Tensor> rel_k_;   // per layer: r_net(R(d)) for d < rel_size_, [d, H, dh]
  std::vector<at::Tensor> rel_kt_;  // the same, [H, d, dh] contiguous: built only for the decode kernels
  // The same in bfloat16 where reduced weights round the table to it (its
  // values exactly), for the split decode attention: half the bytes.
  std::vector<at::Tensor> rel_k16_;
  int64_t rel_size_ = 0;
};

}  // namespace txl

#endif  // TXL_MODEL_NET_INCREMENTAL_H_
