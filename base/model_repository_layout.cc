#include "base/model_repository_layout.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace txl {

namespace {

absl::Status Errno(const std::string& what, int err) {
  return absl::ErrnoToStatus(err, absl::StrCat(what, ": ", std::strerror(err)));
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The names in `dir`, NOT_FOUND when it is not a directory.
absl::StatusOr<std::vector<std::string>> Entries(const std::string& dir) {
  if (!IsDirectory(dir)) return absl::NotFoundError(absl::StrCat(dir, ": no such directory"));
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return Errno(absl::StrCat(dir, ": cannot list"), errno);
  std::vector<std::string> names;
  while (const dirent* e = readdir(d)) names.emplace_back(e->d_name);
  closedir(d);
  return names;
}

absl::Status SyncPath(const std::string& path, int flags) {
  const int fd = open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return Errno(absl::StrCat(path, ": cannot open"), errno);
  const int rc = fsync(fd);
  const int err = errno;
  close(fd);
  return rc == 0 ? absl::OkStatus() : Errno(absl::StrCat(path, ": fsync"), err);
}

}  // namespace

bool IsModelName(absl::string_view name) {
  if (name.empty() || name.size() > 64 || name[0] == '.') return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return absl::ascii_isalnum(c) || c == '_' || c == '.' || c == '-'; });
}

int64_t VersionOf(absl::string_view entry) {
  if (entry.empty() || entry.size() > 18 || entry[0] == '0') return 0;
  if (!std::all_of(entry.begin(), entry.end(), [](char c) { return absl::ascii_isdigit(c); })) return 0;
  int64_t v = 0;
  return absl::SimpleAtoi(entry, &v) ? v : 0;
}

absl::StatusOr<std::vector<RepositoryVersion>> ListVersions(const std::string& model_dir) {
  auto names = Entries(model_dir);
  if (!names.ok()) return names.status();
  std::vector<RepositoryVersion> out;
  for (const std::string& name : *names) {
    const int64_t v = VersionOf(name);
    const std::string dir = absl::StrCat(model_dir, "/", name);
    if (v == 0 || !IsDirectory(dir)) continue;
    RepositoryVersion rv;
    rv.version = v;
    rv.path = absl::StrCat(dir, "/", kModelFileName);
    struct stat st;
    rv.complete = stat(rv.path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
    out.push_back(std::move(rv));
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.version < b.version; });
  return out;
}

absl::StatusOr<std::map<std::string, std::vector<RepositoryVersion>>> ScanRepository(const std::string& dir) {
  auto names = Entries(dir);
  if (!names.ok()) return names.status();
  std::map<std::string, std::vector<RepositoryVersion>> out;
  for (const std::string& name : *names) {
    if (!IsModelName(name) || !IsDirectory(absl::StrCat(dir, "/", name))) continue;
    auto versions = ListVersions(absl::StrCat(dir, "/", name));
    if (versions.ok()) out[name] = std::move(*versions);  // removed since listed: skipped
  }
  return out;
}

absl::StatusOr<int64_t> PublishCheckpoint(const std::string& checkpoint, const std::string& model_dir) {
  const std::string name = std::filesystem::path(model_dir).lexically_normal().filename().string();
  if (!IsModelName(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("publish: \"", name, "\" (the last part of ", model_dir,
                     ") is not a model name: 1-64 of letters, digits, '_', '.' and '-', not starting with '.'"));
  }
  std::error_code ec;
  std::filesystem::create_directories(model_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat(model_dir, ": cannot create: ", ec.message()));
  // Written whole in a hidden directory that readers skip.
  static std::atomic<int64_t> publishes{0};
  const std::string staging = absl::StrCat(model_dir, "/.publishing-", getpid(), "-", publishes.fetch_add(1));
  std::filesystem::remove_all(staging, ec);
  if (mkdir(staging.c_str(), 0755) != 0) return Errno(absl::StrCat(staging, ": cannot create"), errno);
  const std::string staged = absl::StrCat(staging, "/", kModelFileName);
  auto fail = [&](absl::Status s) {
    std::filesystem::remove_all(staging, ec);
    return s;
  };
  std::filesystem::copy_file(checkpoint, staged, ec);
  if (ec) return fail(absl::NotFoundError(absl::StrCat(checkpoint, ": cannot copy to ", staged, ": ", ec.message())));
  if (auto s = SyncPath(staged, O_RDONLY); !s.ok()) return fail(s);
  if (auto s = SyncPath(staging, O_RDONLY | O_DIRECTORY); !s.ok()) return fail(s);
  // Renamed to the next free version; never over one that exists (another
  // publisher may take a number between the listing and the rename: then
  // list again). Adding the attempt to the number instead left gaps, as a
  // listing during another's rename can miss that entry.
  for (int attempt = 0; attempt < 100; ++attempt) {
    auto versions = ListVersions(model_dir);
    if (!versions.ok()) return fail(versions.status());
    const int64_t next = versions->empty() ? 1 : versions->back().version + 1;
    const std::string target = absl::StrCat(model_dir, "/", next);
    if (renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, target.c_str(), RENAME_NOREPLACE) == 0) {
      if (auto s = SyncPath(model_dir, O_RDONLY | O_DIRECTORY); !s.ok()) return s;
      return next;
    }
    if (errno != EEXIST) return fail(Errno(absl::StrCat("publish: cannot rename ", staging, " to ", target), errno));
  }
  return fail(absl::AbortedError(absl::StrCat("publish: no free version in ", model_dir, " after 100 tries")));
}

}  // namespace txl
