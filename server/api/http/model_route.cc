#include "server/api/http/routes.h"

#include "absl/strings/str_cat.h"

namespace txl {

using json = nlohmann::json;

// GET /v1/models (and /v1/models/ID): the one model, with what GetModelInfo
// says of it. Going through the service also applies its bearer tokens.
void ModelsRoute(const GatewayContext* s, std::shared_ptr<HttpExchange> x, const std::string& id) {
  struct Call {
    grpc::ClientContext ctx;
    v1::GetModelInfoRequest req;
    v1::ModelInfo info;
  };
  auto call = std::make_shared<Call>();
  CopyAuth(x->request(), &call->ctx);
  s->stub->async()->GetModelInfo(&call->ctx, &call->req, &call->info, [s, x, call, id](grpc::Status status) {
    const std::string route = "/v1/models";
    if (!status.ok()) {
      const HttpError e = FromGrpc(status);
      s->Answer(*x, route, e.status, ErrorBody(e));
      return;
    }
    const v1::ModelInfo& m = call->info;
    json model{{"id", s->config.model_name},
               {"object", "model"},
               {"created", 0},
               {"owned_by", "txl-serve"},
               {"txl", json{{"n_layer", m.n_layer()},
                            {"d_model", m.d_model()},
                            {"vocab_size", m.vocab_size()},
                            {"tokenizer", m.tokenizer()},
                            {"default_mem_len", m.default_mem_len()},
                            {"max_mem_len", m.max_mem_len()},
                            {"device", m.device()},
                            {"dtype", m.dtype()},
                            {"kv_dtype", m.kv_dtype()},
                            {"fingerprint", m.fingerprint()}}}};
    if (!id.empty()) {
      if (id != s->config.model_name) {
        s->Answer(*x, route, 404,
                  ErrorBody({404, absl::StrCat("model '", id, "' is not served here"), "model", "model_not_found"}));
        return;
      }
      s->Answer(*x, route, 200, JsonText(model));
      return;
    }
    s->Answer(*x, route, 200, JsonText(json{{"object", "list"}, {"data", json::array({model})}}));
  });
}

}  // namespace txl
