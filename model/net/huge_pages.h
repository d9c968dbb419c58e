// Tensors in transparent huge pages. A decode step streams its weights,
// position tables and session memories; with 4 KiB pages it paid a TLB miss
// every 4 KiB (measured: 3-5% of a one-session step).
#ifndef TXL_MODEL_NET_HUGE_PAGES_H_
#define TXL_MODEL_NET_HUGE_PAGES_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace txl {

// Tensors of these shapes and type, uninitialised, sharing one arena of
// huge pages (ordinary tensors if the arena cannot be had).
std::vector<at::Tensor> HugePageTensors(const std::vector<std::vector<int64_t>>& shapes,
                                        at::ScalarType type = at::kFloat);
// Moves the tensors (all of one type) into one arena.
void InHugePages(const std::vector<at::Tensor*>& tensors);

// `count` rings of `shape` ([H, capacity, dh]) with `options`, contents
// undefined. On the CPU (float32 or bfloat16) they share one arena when
// rounding it up to whole 2 MiB pages costs under 2%. Every session memory
// is allocated here (growth, fork, restore).
std::vector<at::Tensor> NewRings(int64_t count, const std::vector<int64_t>& shape, const at::TensorOptions& options);

}  // namespace txl

#endif  // TXL_MODEL_NET_HUGE_PAGES_H_
