#include "server/http/routes.h"

#include "absl/strings/str_cat.h"
#include "server/core/responses.h"

namespace txl {

using json = nlohmann::json;

// GET /v1/models (and /v1/models/ID): the one model, with what GetModelInfo
// says of it (FillModelInfo), for a caller the bearer tokens admit.
void ModelsRoute(const GatewayContext* s, std::shared_ptr<HttpExchange> x, const std::string& id) {
  const std::string route = "/v1/models";
  if (auto principal = s->Principal(x->request()); !principal.ok()) return s->Fail(*x, route, principal.status());
  v1::ModelInfo m;
  FillModelInfo(*s->core, &m);
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
                          {"cpu_family", m.cpu_family()},
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
}

}  // namespace txl
