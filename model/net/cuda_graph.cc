// CapturedPass on a CUDA libtorch (at::cuda::CUDAGraph).
#include "model/net/cuda_graph.h"

#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <utility>

namespace txl {

struct CapturedPass::Impl {
  at::cuda::CUDAGraph graph;
  at::Tensor output;  // in the graph's pool; rewritten by each replay
};

bool CapturedPass::Capturable(const at::Device& device) { return device.is_cuda(); }

std::unique_ptr<CapturedPass> CapturedPass::Capture(const std::function<at::Tensor()>& body, at::Tensor* eager,
                                                    const CapturedPass* share) {
  auto impl = std::make_unique<Impl>();
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream();
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  // The side stream starts after everything queued so far (the static
  // inputs' copy among it).
  at::cuda::CUDAEvent queued;
  queued.record(current);
  queued.block(side);
  at::Tensor warm;
  {
    c10::cuda::CUDAStreamGuard on_side(side);
    // The warm-up also sets up what a capture must not (cuBLAS's workspace
    // for this stream, lazily built kernels).
    try {
      warm = body();
    } catch (...) {
      // What it queued before it threw (pool writes among it) comes before
      // anything the caller does next on the current stream (a restore).
      at::cuda::CUDAEvent failed;
      failed.record(side);
      failed.block(current);
      throw;
    }
  }
  // The warm-up's result, copied on the current stream once the side stream
  // is done, so that its memory belongs to the current stream. Given before
  // the capture, so that a capture that fails still leaves it (a pass that
  // writes keys it reads cannot run twice).
  at::cuda::CUDAEvent done;
  done.record(side);
  done.block(current);
  *eager = warm.clone();
  warm.record_stream(current);
  {
    c10::cuda::CUDAStreamGuard on_side(side);
    // Thread-local: other threads' CUDA calls (none are expected) do not
    // break this capture.
    impl->graph.capture_begin(share != nullptr ? share->impl_->graph.pool() : c10::MempoolId_t{0, 0},
                              cudaStreamCaptureModeThreadLocal);
    try {
      impl->output = body();
    } catch (...) {
      try {
        impl->graph.capture_end();
      } catch (...) {
      }
      throw;
    }
    impl->graph.capture_end();
  }
  return std::unique_ptr<CapturedPass>(new CapturedPass(std::move(impl)));
}

CapturedPass::CapturedPass(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CapturedPass::~CapturedPass() = default;

at::Tensor CapturedPass::Replay() {
  impl_->graph.replay();
  return impl_->output;
}

}  // namespace txl
