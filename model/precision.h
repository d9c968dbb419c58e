// The number formats a model may run in: its weights (--dtype) and its
// sessions' layer memories (--kv_dtype). Torch-free, so the mains and the
// server can name and report them. float32 is the default and the only
// exact one (parity with the original code); the others trade bounded error
// for fewer bytes per token (docs/PERFORMANCE.md "Reduced precision").
#ifndef TXL_MODEL_PRECISION_H_
#define TXL_MODEL_PRECISION_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace txl {

// Weights of the layers' products. bfloat16: rounded to nearest even.
// int8: symmetric, one float scale per output row (max |w| / 127), made at
// load from the float32 checkpoint. The embedding, the adaptive softmax,
// the layer norms and the biases stay float32 in every mode.
enum class WeightDtype { kFloat32, kBfloat16, kInt8 };
// Keys and values a session keeps (memory_bytes, budgets, images, journal).
enum class KvDtype { kFloat32, kBfloat16 };

// Which code computes the layers (--kernels). kAuto: the CPU's own kernels
// (decode_kernels.h, prefill_kernels.h) on a CPU, libtorch's ops on a GPU.
// kGeneric: libtorch's ops on every device, the code a GPU runs, so that the
// CPU tests prove it (docs/MODEL.md "The generic path"). Same results to
// float rounding; the CPU kernels are the fast ones on a CPU.
enum class Kernels { kAuto, kGeneric };

// Decode steps as CUDA graphs (--cuda_graphs; docs/MODEL.md "Decode graphs").
// kAuto: on a GPU, not on a CPU. kOn: on a GPU; on a CPU with the generic
// kernels the same padded steps run eagerly (for tests); the CPU kernels
// refuse it. kOff: never.
enum class DecodeGraphs { kAuto, kOn, kOff };

absl::StatusOr<WeightDtype> ParseWeightDtype(absl::string_view name);    // "float32", "bfloat16", "int8"
absl::StatusOr<KvDtype> ParseKvDtype(absl::string_view name);            // "float32", "bfloat16"
absl::StatusOr<Kernels> ParseKernels(absl::string_view name);            // "auto", "generic"
absl::StatusOr<DecodeGraphs> ParseDecodeGraphs(absl::string_view name);  // "auto", "on", "off"
std::string DtypeName(WeightDtype dtype);
std::string DtypeName(KvDtype dtype);
std::string KernelsName(Kernels kernels);
std::string DecodeGraphsName(DecodeGraphs graphs);

}  // namespace txl

#endif  // TXL_MODEL_PRECISION_H_
