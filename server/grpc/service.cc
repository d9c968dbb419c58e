#include "server/grpc/service.h"

#include "server/grpc/call_context.h"

namespace txl {

TxlService::TxlService(const ServiceConfig& config, std::shared_ptr<ServedModel> served, SessionTable* table,
                       Scheduler* scheduler, ServiceMetrics* metrics, const BearerTokens* tokens,
                       SessionJournal* journal)
    : ctx_(std::make_unique<ServiceContext>(
          ServiceParts{config, std::move(served), table, scheduler, metrics, tokens, journal})) {}

TxlService::~TxlService() = default;

const ServiceCore* TxlService::core() const { return ctx_.get(); }

}  // namespace txl
