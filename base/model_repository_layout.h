// A model repository on disk: DIR/NAME/VERSION/model.pt, VERSION a positive
// integer written without leading zeros. The trainer publishes into it
// (txl-train --publish DIR/NAME: PublishCheckpoint) and a server reads it
// (ScanRepository). A version appears whole or not at all: it is written in a
// hidden directory and renamed into place, so a reader never meets a
// half-copied model.pt under a version's name. Entries that are not a model
// name or a version (hidden ones, "tmp", "007") are skipped, not errors.
#ifndef TXL_BASE_MODEL_REPOSITORY_LAYOUT_H_
#define TXL_BASE_MODEL_REPOSITORY_LAYOUT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace txl {

inline constexpr char kModelFileName[] = "model.pt";

struct RepositoryVersion {
  int64_t version = 0;
  std::string path;      // DIR/NAME/VERSION/model.pt
  bool complete = true;  // model.pt is there (a version directory without it is listed, not loadable)
};

// Whether `name` can name a model: 1-64 of [A-Za-z0-9_.-], not starting with '.'.
bool IsModelName(absl::string_view name);
// The rule, as refusals state it.
inline constexpr char kModelNameRule[] = "1-64 of letters, digits, _ . -, not starting with .";
// The version a directory entry names, or 0 when it names none.
int64_t VersionOf(absl::string_view entry);

// A model directory's versions, oldest first. NOT_FOUND naming the directory
// when it is missing or not a directory.
absl::StatusOr<std::vector<RepositoryVersion>> ListVersions(const std::string& model_dir);

// Every model of a repository (by name) with its versions. NOT_FOUND naming
// the directory when it is missing or not a directory.
absl::StatusOr<std::map<std::string, std::vector<RepositoryVersion>>> ScanRepository(const std::string& dir);

// Copies `checkpoint` into `model_dir` (created if missing) as its next
// version, durably (file and directories synced) and atomically (renamed
// into place without replacing anything: two publishers get two versions).
// Returns the version. INVALID_ARGUMENT when model_dir's last part is not a
// model name; the file system's errors name the path.
absl::StatusOr<int64_t> PublishCheckpoint(const std::string& checkpoint, const std::string& model_dir);

}  // namespace txl

#endif  // TXL_BASE_MODEL_REPOSITORY_LAYOUT_H_
