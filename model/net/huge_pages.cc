#include "model/net/huge_pages.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

namespace txl {

namespace {

constexpr int64_t kHugePage = int64_t{2} << 20, kArenaAlign = 64;

int64_t ArenaBytes(const std::vector<int64_t>& shape, int64_t element) {
  int64_t n = element;
  for (int64_t d : shape) n *= d;
  return (n + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
}

}  // namespace

std::vector<at::Tensor> HugePageTensors(const std::vector<std::vector<int64_t>>& shapes, at::ScalarType type) {
  const int64_t element = c10::elementSize(type);
  int64_t total = 0;
  for (const auto& shape : shapes) total += ArenaBytes(shape, element);
  total = std::max(kHugePage, (total + kHugePage - 1) / kHugePage * kHugePage);
  std::vector<at::Tensor> out;
  void* raw = std::aligned_alloc(kHugePage, total);
  if (raw == nullptr) {
    for (const auto& shape : shapes) out.push_back(at::empty(shape, type));
    return out;
  }
  madvise(raw, total, MADV_HUGEPAGE);
  auto arena = std::shared_ptr<void>(raw, [](void* p) { std::free(p); });
  char* at = static_cast<char*>(raw);
  for (const auto& shape : shapes) {
    out.push_back(at::from_blob(
        at, shape, [arena](void*) {}, at::TensorOptions().dtype(type)));
    at += ArenaBytes(shape, element);
  }
  return out;
}

// Moves the tensors (all of one type) into one huge-page arena.
void InHugePages(const std::vector<at::Tensor*>& tensors) {
  if (tensors.empty()) return;
  std::vector<std::vector<int64_t>> shapes;
  for (const at::Tensor* t : tensors) shapes.push_back(t->sizes().vec());
  std::vector<at::Tensor> moved = HugePageTensors(shapes, tensors[0]->scalar_type());
  for (size_t i = 0; i < tensors.size(); ++i) {
    moved[i].copy_(*tensors[i]);
    *tensors[i] = moved[i];
  }
}

std::vector<at::Tensor> NewRings(int64_t count, const std::vector<int64_t>& shape, const at::TensorOptions& options) {
  const at::ScalarType type = c10::typeMetaToScalarType(options.dtype());
  const int64_t bytes = count * ArenaBytes(shape, c10::elementSize(type));
  const int64_t spare = (kHugePage - bytes % kHugePage) % kHugePage;
  if (options.device().is_cpu() && (type == at::kFloat || type == at::kBFloat16) && spare * 50 <= bytes) {
    return HugePageTensors(std::vector<std::vector<int64_t>>(count, shape), type);
  }
  std::vector<at::Tensor> out;
  for (int64_t i = 0; i < count; ++i) out.push_back(at::empty(shape, options));
  return out;
}

}  // namespace txl
