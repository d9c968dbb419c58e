// CapturedPass: one pass of the network recorded as a CUDA graph and
// replayed, so that a decode step costs one launch instead of a few hundred
// (docs/MODEL.md, "Decode graphs"). Only a build against a CUDA libtorch
// captures (cuda_graph.cc); elsewhere (cuda_graph_stub.cc) Capturable() is
// false and IncrementalModel runs the same bucketed passes eagerly, which is
// how the CPU tests check everything but the capture itself.
//
// Threading: the engine thread's, like the model.
#ifndef TXL_MODEL_NET_CUDA_GRAPH_H_
#define TXL_MODEL_NET_CUDA_GRAPH_H_

#include <ATen/ATen.h>

#include <functional>
#include <memory>

namespace txl {

class CapturedPass {
 public:
  // Whether passes on `device` can be captured in this build.
  static bool Capturable(const at::Device& device);
  // Runs `body` once on a side stream (the warm-up, whose result comes back
  // in *eager, complete and safe to read on the current stream, even when
  // the capture then throws), then captures it. `share` (may be null) is an earlier capture whose private
  // memory pool this one shares: safe because passes never run concurrently
  // and each replay's output is copied before the next. Throws c10::Error.
  static std::unique_ptr<CapturedPass> Capture(const std::function<at::Tensor()>& body, at::Tensor* eager,
                                               const CapturedPass* share);
  CapturedPass(const CapturedPass&) = delete;
  CapturedPass& operator=(const CapturedPass&) = delete;
  ~CapturedPass();

  // Replays on the current stream; returns the captured output, which the
  // next replay of any capture may overwrite.
  at::Tensor Replay();

 private:
  struct Impl;
  explicit CapturedPass(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace txl

#endif  // TXL_MODEL_NET_CUDA_GRAPH_H_
