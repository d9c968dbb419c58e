#include "model/precision.h"

#include "absl/strings/str_cat.h"

namespace txl {

absl::StatusOr<WeightDtype> ParseWeightDtype(absl::string_view name) {
  if (name == "float32") return WeightDtype::kFloat32;
  if (name == "bfloat16") return WeightDtype::kBfloat16;
  if (name == "int8") return WeightDtype::kInt8;
  return absl::InvalidArgumentError(absl::StrCat("dtype: unknown '", name, "' (use float32, bfloat16 or int8)"));
}

absl::StatusOr<KvDtype> ParseKvDtype(absl::string_view name) {
  if (name == "float32") return KvDtype::kFloat32;
  if (name == "bfloat16") return KvDtype::kBfloat16;
  return absl::InvalidArgumentError(absl::StrCat("kv_dtype: unknown '", name, "' (use float32 or bfloat16)"));
}

absl::StatusOr<Kernels> ParseKernels(absl::string_view name) {
  if (name == "auto") return Kernels::kAuto;
  if (name == "generic") return Kernels::kGeneric;
  return absl::InvalidArgumentError(absl::StrCat("kernels: unknown '", name, "' (use auto or generic)"));
}

absl::StatusOr<DecodeGraphs> ParseDecodeGraphs(absl::string_view name) {
  if (name == "auto") return DecodeGraphs::kAuto;
  if (name == "on") return DecodeGraphs::kOn;
  if (name == "off") return DecodeGraphs::kOff;
  return absl::InvalidArgumentError(absl::StrCat("cuda_graphs: unknown '", name, "' (use auto, on or off)"));
}

std::string DecodeGraphsName(DecodeGraphs graphs) {
  switch (graphs) {
    case DecodeGraphs::kOn: return "on";
    case DecodeGraphs::kOff: return "off";
    default: return "auto";
  }
}

std::string DtypeName(WeightDtype dtype) {
  switch (dtype) {
    case WeightDtype::kBfloat16: return "bfloat16";
    case WeightDtype::kInt8: return "int8";
    default: return "float32";
  }
}

std::string DtypeName(KvDtype dtype) { return dtype == KvDtype::kBfloat16 ? "bfloat16" : "float32"; }

std::string KernelsName(Kernels kernels) { return kernels == Kernels::kGeneric ? "generic" : "auto"; }

}  // namespace txl
