#include "server/api/service.h"

#include "server/api/call_context.h"

namespace txl {

TxlService::TxlService(const ServiceConfig& config, const ModelConfig& model, const Tokenizer& tokenizer,
                       Engine* engine, SessionTable* table, Scheduler* scheduler, ServiceMetrics* metrics,
                       const BearerTokens* tokens, SessionJournal* journal)
    : ctx_(new ServiceContext{
          config, model, tokenizer, engine, table, scheduler, metrics, tokens,
          RequestValidator(RequestLimits{model.n_token, config.default_mem_len, config.max_mem_len,
                                         config.max_new_tokens, config.max_input_tokens, config.max_top_logprobs},
                           tokenizer),
          journal}) {}

TxlService::~TxlService() = default;

}  // namespace txl
