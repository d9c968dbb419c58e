// Writing a TorchScript archive whose module tree carries named tensors
// ("layers.0.dec_attn.qkv_net.weight" becomes nested submodules), plus extra
// files. The checkpoint writer, importers and tests build on it.
#ifndef TXL_MODEL_NET_ARCHIVE_H_
#define TXL_MODEL_NET_ARCHIVE_H_

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace txl {

struct ArchiveTensor {
  std::string name;  // dotted path
  at::Tensor tensor;
  bool is_buffer = false;
};

// Writes atomically: a temporary file beside `path`, then rename.
absl::Status WriteArchive(const std::string& path, const std::vector<ArchiveTensor>& tensors,
                          const std::map<std::string, std::string>& extra_files);

}  // namespace txl

#endif  // TXL_MODEL_NET_ARCHIVE_H_
