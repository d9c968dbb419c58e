// CapturedPass without CUDA (the Debian build's libtorch has none): nothing
// is capturable, and the bucketed passes run eagerly.
#include <c10/util/Exception.h>

#include "model/net/cuda_graph.h"

namespace txl {

struct CapturedPass::Impl {};

bool CapturedPass::Capturable(const at::Device&) { return false; }

std::unique_ptr<CapturedPass> CapturedPass::Capture(const std::function<at::Tensor()>&, at::Tensor*,
                                                    const CapturedPass*) {
  TORCH_CHECK(false, "CUDA graphs need a build against a CUDA libtorch (scripts/cuda_build.sh)");
}

CapturedPass::CapturedPass(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CapturedPass::~CapturedPass() = default;

at::Tensor CapturedPass::Replay() { TORCH_CHECK(false, "no CUDA graph in this build"); }

}  // namespace txl
