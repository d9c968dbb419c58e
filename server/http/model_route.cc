#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/model_repository_layout.h"
#include "server/core/responses.h"
#include "server/http/routes.h"

namespace txl {

using json = nlohmann::json;

namespace {

// One version as /v1/models lists it: `id` is what a request's "model" names.
json ModelJson(const GatewayContext* s, const ServedModel& served, const std::string& id) {
  v1::ModelInfo m;
  FillModelInfo(*s->core, served, &m);
  return json{{"id", id},
              {"object", "model"},
              {"created", 0},
              {"owned_by", "txl-serve"},
              {"txl", json{{"name", m.name()},
                           {"version", m.version()},
                           {"n_layer", m.n_layer()},
                           {"d_model", m.d_model()},
                           {"vocab_size", m.vocab_size()},
                           {"tokenizer", m.tokenizer()},
                           {"default_mem_len", m.default_mem_len()},
                           {"max_mem_len", m.max_mem_len()},
                           {"max_new_tokens", m.max_new_tokens()},
                           {"max_input_tokens", m.max_input_tokens()},
                           {"max_sessions", m.max_sessions()},
                           {"device", m.device()},
                           {"dtype", m.dtype()},
                           {"kv_dtype", m.kv_dtype()},
                           {"cpu_family", m.cpu_family()},
                           {"fingerprint", m.fingerprint()}}}};
}

json VersionsJson(const ServiceCore& core) {
  json out = json::array();
  for (const VersionStatus& v : core.ListModels()) {
    out.push_back(json{{"name", v.model},
                       {"version", std::to_string(v.version)},
                       {"state", VersionStateName(v.state)},
                       {"reason", v.reason}});
  }
  return out;
}

}  // namespace

// GET /v1/models (and /v1/models/ID): every ready version, for a caller the
// bearer tokens admit. A model's newest ready version is listed as NAME, and
// its older ready ones as NAME@VERSION: each id is what a request may name.
void ModelsRoute(const GatewayContext* s, std::shared_ptr<HttpExchange> x, const std::string& id) {
  const std::string route = "/v1/models";
  if (auto principal = s->Principal(x->request()); !principal.ok()) return s->Fail(*x, route, principal.status());
  if (!id.empty()) {
    auto found = s->core->Model(id);
    if (!found.ok()) return s->Fail(*x, route, found.status());
    return s->Answer(*x, route, 200, JsonText(ModelJson(s, **found, id)));
  }
  const std::vector<std::shared_ptr<ServedModel>> ready = s->core->models->Ready();  // by name, then version
  json data = json::array();
  for (size_t i = 0; i < ready.size(); ++i) {
    const bool newest = i + 1 == ready.size() || ready[i + 1]->name() != ready[i]->name();
    data.push_back(ModelJson(s, *ready[i], newest ? ready[i]->name() : ready[i]->ref()));
  }
  s->Answer(*x, route, 200, JsonText(json{{"object", "list"}, {"data", data}}));
}

// The repository's control, as Triton's HTTP API names it: POST
// /v2/repository/index lists every version with its state and reason; POST
// /v2/repository/models/NAME/load and .../unload run ServiceCore::LoadModel
// and UnloadModel, and answer with the list after.
void RepositoryRoute(const GatewayContext* s, std::shared_ptr<HttpExchange> x, const std::string& rest) {
  const std::string route = "/v2/repository";
  const HttpRequest& req = x->request();
  auto principal = s->Principal(req);
  if (!principal.ok()) return s->Fail(*x, route, principal.status());
  if (req.method != "POST") {
    return s->Answer(*x, route, 405, ErrorBody({405, "use POST", "", "method_not_allowed"}));
  }
  if (rest == "index") return s->Answer(*x, route, 200, JsonText(VersionsJson(*s->core)));
  // models/NAME/load or models/NAME/unload, NAME one path segment.
  const std::vector<std::string> parts = absl::StrSplit(rest, '/');
  if (parts.size() != 3 || parts[0] != "models" || (parts[2] != "load" && parts[2] != "unload")) {
    return s->Answer(*x, "other", 404,
                     ErrorBody({404, absl::StrCat("no route POST /v2/repository/", rest), "", "not_found"}));
  }
  const std::string& name = parts[1];
  const std::string& action = parts[2];
  if (!IsModelName(name)) {
    return s->Answer(*x, route, 400,
                     ErrorBody({400, absl::StrCat("\"", name, "\" is not a model name (", kModelNameRule, ")"), "name",
                                "invalid_argument"}));
  }
  auto done = [s, x, route](absl::Status status) {
    x->Run([s, x, route, status] {
      if (!status.ok()) return s->Fail(*x, route, status);
      s->Answer(*x, route, 200, JsonText(VersionsJson(*s->core)));
    });
  };
  if (action == "load") return s->core->LoadModel(name, done);
  s->core->UnloadModel(name, done);
}

}  // namespace txl
