// The unary calls on models: GetModelInfo, ListModels, LoadModel,
// UnloadModel. A load or an unload answers once the repository's thread has
// run it (ServiceCore::LoadModel).
#include <memory>

#include "absl/strings/str_cat.h"
#include "base/model_repository_layout.h"
#include "base/status_macros.h"
#include "server/grpc/call_context.h"
#include "server/grpc/service.h"

namespace txl {
namespace {

void FillModels(const ServiceCore& core, v1::ListModelsResponse* out) {
  for (const VersionStatus& v : core.ListModels()) {
    v1::ModelVersionStatus* m = out->add_models();
    m->set_name(v.model);
    m->set_version(v.version);
    m->set_state(VersionStateName(v.state));
    m->set_reason(v.reason);
  }
}

// A load or unload of `name`: answered with the repository's list after it.
grpc::ServerUnaryReactor* ModelControl(const ServiceContext* c, grpc::CallbackServerContext* ctx, const char* method,
                                       const std::string& name, bool load, v1::ListModelsResponse* r) {
  return UnaryCall(c, ctx, method, [&](grpc::ServerUnaryReactor* reactor) -> absl::Status {
    RETURN_IF_ERROR(c->Principal(ctx).status());
    if (name.empty()) return absl::InvalidArgumentError("name: required");
    if (!IsModelName(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("name: \"", name, "\" is not a model name (", kModelNameRule, ")"));
    }
    auto done = [c, reactor, method, r](absl::Status s) {
      if (s.ok()) FillModels(*c, r);
      c->Answer(reactor, method, s);
    };
    if (load) {
      c->LoadModel(name, done);
    } else {
      c->UnloadModel(name, done);
    }
    return absl::OkStatus();
  });
}

}  // namespace

grpc::ServerUnaryReactor* TxlService::GetModelInfo(grpc::CallbackServerContext* ctx, const v1::GetModelInfoRequest* req,
                                                   v1::ModelInfo* r) {
  const ServiceContext* c = ctx_.get();
  return UnaryCall(c, ctx, "GetModelInfo", [&](grpc::ServerUnaryReactor* reactor) -> absl::Status {
    RETURN_IF_ERROR(c->Principal(ctx).status());
    ASSIGN_OR_RETURN(std::shared_ptr<ServedModel> m, c->Model(req->model()));
    FillModelInfo(*c, *m, r);
    c->Answer(reactor, "GetModelInfo", absl::OkStatus());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* TxlService::ListModels(grpc::CallbackServerContext* ctx, const v1::ListModelsRequest*,
                                                 v1::ListModelsResponse* r) {
  const ServiceContext* c = ctx_.get();
  return UnaryCall(c, ctx, "ListModels", [&](grpc::ServerUnaryReactor* reactor) -> absl::Status {
    RETURN_IF_ERROR(c->Principal(ctx).status());
    FillModels(*c, r);
    c->Answer(reactor, "ListModels", absl::OkStatus());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* TxlService::LoadModel(grpc::CallbackServerContext* ctx, const v1::LoadModelRequest* req,
                                                v1::ListModelsResponse* r) {
  return ModelControl(ctx_.get(), ctx, "LoadModel", req->name(), /*load=*/true, r);
}

grpc::ServerUnaryReactor* TxlService::UnloadModel(grpc::CallbackServerContext* ctx, const v1::UnloadModelRequest* req,
                                                  v1::ListModelsResponse* r) {
  return ModelControl(ctx_.get(), ctx, "UnloadModel", req->name(), /*load=*/false, r);
}

}  // namespace txl
