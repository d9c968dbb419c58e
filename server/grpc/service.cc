#include "server/grpc/service.h"

#include "server/grpc/call_context.h"

namespace txl {

TxlService::TxlService(ServiceParts parts) : ctx_(std::make_unique<ServiceContext>(std::move(parts))) {}

TxlService::~TxlService() = default;

const ServiceCore* TxlService::core() const { return ctx_.get(); }

}  // namespace txl
