// The core's results as the API's messages (txl.v1): the one conversion both
// transports use (the HTTP routes render these messages as OpenAI's JSON).
#ifndef TXL_SERVER_CORE_RESPONSES_H_
#define TXL_SERVER_CORE_RESPONSES_H_

#include <cstdint>
#include <vector>

#include "model/tokenizer.h"
#include "proto/txl/v1/txl.pb.h"
#include "server/core/service_core.h"
#include "server/jobs/job.h"
#include "server/sessions/session_table.h"

namespace txl {

// Generated tokens, with the session's position after them. An alternative's
// text is sent only when it is whole UTF-8 (it may be part of a character).
v1::GenerateResponse TokensResponse(const std::vector<GeneratedTokenEvent>& events, int64_t position,
                                    const Tokenizer& tokenizer);
// A generation's last response: trailing text, finish reason, usage.
v1::GenerateResponse FinalResponse(const GenerateResult& result, const Tokenizer& tokenizer);
// Its last responses: FinalResponse's one, or with several choices one per
// choice not sent as it ended (ChoiceEnd::sent), the call's usage in the last.
std::vector<v1::GenerateResponse> FinalResponses(const GenerateResult& result, const Tokenizer& tokenizer);
// One choice's end: its index, trailing text, position and finish reason.
v1::GenerateResponse ChoiceEndResponse(const ChoiceEnd& end);
// A score's per-token log-probs and their total.
void FillScore(const ScoreResult& result, const Tokenizer& tokenizer, v1::ScoreResponse* out);
void FillSession(const SessionInfo& info, v1::Session* out);
// A version the server serves, and its limits (GetModelInfo, /v1/models).
void FillModelInfo(const ServiceCore& core, const ServedModel& served, v1::ModelInfo* out);

}  // namespace txl

#endif  // TXL_SERVER_CORE_RESPONSES_H_
