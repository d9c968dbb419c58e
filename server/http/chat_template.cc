#include "server/http/chat_template.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "base/read_file.h"

namespace txl {

absl::StatusOr<ChatTemplate> ChatTemplate::Load(const std::string& path) {
  ChatTemplate t;
  if (path.empty()) return t;
  auto text = ReadFile(path);
  if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat("--chat_template: ", text.status().message()));
  nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("--chat_template: ", path, " is not a JSON object"));
  }
  for (auto [name, field] :
       {std::pair{"system", &t.system}, std::pair{"user", &t.user}, std::pair{"assistant", &t.assistant},
        std::pair{"generation_prompt", &t.generation_prompt}}) {
    if (!j.contains(name)) continue;
    if (!j[name].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("--chat_template: ", path, ": '", name, "' must be a string"));
    }
    *field = j[name].get<std::string>();
    const size_t at = field->find("{content}");
    if (std::string(name) != "generation_prompt" &&
        (at == std::string::npos || field->find("{content}", at + 1) != std::string::npos)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--chat_template: ", path, ": '", name, "' must hold {content} exactly once"));
    }
  }
  if (j.contains("stop")) {
    if (!j["stop"].is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--chat_template: ", path, ": 'stop' must be an array of strings"));
    }
    t.stop.clear();
    for (const auto& s : j["stop"]) {
      if (!s.is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--chat_template: ", path, ": 'stop' must be an array of strings"));
      }
      t.stop.push_back(s.get<std::string>());
    }
  }
  return t;
}

std::string ChatTemplate::Render(const ChatMessage& m) const {
  const std::string& pattern = m.role == "system" ? system : m.role == "assistant" ? assistant : user;
  const size_t at = pattern.find("{content}");
  return absl::StrCat(pattern.substr(0, at), m.content, pattern.substr(at + 9));
}

std::string ChatTemplate::AssistantSuffix() const { return assistant.substr(assistant.find("{content}") + 9); }

}  // namespace txl
