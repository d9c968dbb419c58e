#include "model/net/archive.h"

#include <torch/script.h>
#include <unistd.h>

#include <filesystem>
#include <functional>

#include "absl/strings/str_cat.h"

namespace txl {
namespace {

torch::jit::Module NewModule(const std::shared_ptr<torch::jit::CompilationUnit>& cu) {
  // Mangled names keep the per-submodule class types distinct in one unit.
  return torch::jit::Module(c10::QualifiedName("__torch__.txl.Module"), cu, /*shouldMangle=*/true);
}

}  // namespace

absl::Status WriteArchive(const std::string& path, const std::vector<ArchiveTensor>& tensors,
                          const std::map<std::string, std::string>& extra_files) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  try {
    auto cu = std::make_shared<torch::jit::CompilationUnit>();
    torch::jit::Module root = NewModule(cu);
    std::map<std::string, torch::jit::Module> modules;  // dotted path -> module
    std::function<torch::jit::Module(const std::string&)> module_at =
        [&](const std::string& prefix) -> torch::jit::Module {
      if (prefix.empty()) return root;
      auto it = modules.find(prefix);
      if (it != modules.end()) return it->second;
      const size_t dot = prefix.rfind('.');
      torch::jit::Module parent = module_at(dot == std::string::npos ? "" : prefix.substr(0, dot));
      torch::jit::Module child = NewModule(cu);
      parent.register_module(dot == std::string::npos ? prefix : prefix.substr(dot + 1), child);
      modules.emplace(prefix, child);
      return child;
    };
    for (const ArchiveTensor& t : tensors) {
      const size_t dot = t.name.rfind('.');
      torch::jit::Module m = module_at(dot == std::string::npos ? "" : t.name.substr(0, dot));
      const std::string leaf = dot == std::string::npos ? t.name : t.name.substr(dot + 1);
      at::Tensor value = t.tensor.detach().to(at::kCPU);
      if (t.is_buffer) {
        m.register_buffer(leaf, value);
      } else {
        m.register_parameter(leaf, value, /*is_buffer=*/false);
      }
    }
    torch::jit::ExtraFilesMap extra(extra_files.begin(), extra_files.end());
    root.save(tmp, extra);
  } catch (const c10::Error& e) {
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
    std::string msg = e.what_without_backtrace();
    return absl::InternalError(absl::StrCat("writing ", path, ": ", msg.substr(0, msg.find('\n'))));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return absl::InternalError(absl::StrCat("cannot move the new archive into place at ", path));
  }
  return absl::OkStatus();
}

}  // namespace txl
