// CompletionCall: one completion (text or chat) as a generation on the
// service core, answered whole or as server-sent events. The flow control
// and disconnect handling of docs/API_LAYER.md, "The HTTP front end" live here.
#ifndef TXL_SERVER_HTTP_COMPLETION_CALL_H_
#define TXL_SERVER_HTTP_COMPLETION_CALL_H_

#include <functional>
#include <memory>

#include "server/http/gateway_context.h"

namespace txl {

// Starts the call and returns; `chat` picks the chat shapes. `on_success`
// runs with the whole result once the call has succeeded, before the client
// is answered (the chat route records the conversation there).
void StartCompletion(const GatewayContext* c, std::shared_ptr<HttpExchange> x, CompletionParams p, bool chat,
                     std::function<void(const CompletionResult&)> on_success = nullptr);

}  // namespace txl

#endif  // TXL_SERVER_HTTP_COMPLETION_CALL_H_
