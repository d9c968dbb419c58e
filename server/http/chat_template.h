// ChatTemplate: how /v1/chat/completions turns messages into the text the
// model is fed. A language model of plain text has no chat format of its
// own, so the server's is documented (docs/HTTP.md) and replaceable with
// --chat_template FILE, a JSON object:
//   {"system": "...{content}...", "user": "...", "assistant": "...",
//    "generation_prompt": "...", "stop": ["..."]}
// Each message renders as its role's pattern with {content} replaced; the
// call then appends generation_prompt, and generation stops at `stop` (the
// text that would begin the next user turn) unless the request names its own.
#ifndef TXL_SERVER_HTTP_CHAT_TEMPLATE_H_
#define TXL_SERVER_HTTP_CHAT_TEMPLATE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/http/openai_json.h"

namespace txl {

struct ChatTemplate {
  std::string system = "{content}\n\n";
  std::string user = "USER: {content}\n";
  std::string assistant = "ASSISTANT:{content}\n";
  std::string generation_prompt = "ASSISTANT:";
  std::vector<std::string> stop = {"\nUSER:"};

  // The built-in template above, or FILE's (every field optional; each
  // role's pattern must hold {content} once).
  static absl::StatusOr<ChatTemplate> Load(const std::string& path);
  std::string Render(const ChatMessage& m) const;
  // The text after an assistant reply that the session already holds: the
  // assistant pattern's part after {content}.
  std::string AssistantSuffix() const;
};

}  // namespace txl

#endif  // TXL_SERVER_HTTP_CHAT_TEMPLATE_H_
