// ServedModel: one loaded version of a model as the server serves it: its
// engine, config and tokenizer, under the repository's model name and
// version, and the grammars its requests sent (GrammarCache). Torch-free (the engine is behind Engine); model_loader.h
// makes them from checkpoints. Whoever holds one (a session bound to the version) keeps it loaded: ModelRepository
// unloads a retiring version when its last holder lets go.
#ifndef TXL_SERVER_ENGINE_SERVED_MODEL_H_
#define TXL_SERVER_ENGINE_SERVED_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "model/model_config.h"
#include "model/tokenizer.h"
#include "server/engine/engine.h"
#include "server/engine/model_limits.h"
#include "server/engine/model_repository.h"
#include "server/sampling/grammar_cache.h"

namespace txl {

class ServedModel : public ServedVersion {
 public:
  // `path`: the checkpoint it was loaded from ("" when it has none);
  // `limits`: its model's limits.json (none: the server's flags).
  ServedModel(std::string name, int64_t version, std::unique_ptr<Engine> engine, ModelConfig config,
              Tokenizer tokenizer, std::string path = "", ModelLimits limits = {})
      : name_(std::move(name)),
        version_(version),
        engine_(std::move(engine)),
        config_(std::move(config)),
        tokenizer_(std::move(tokenizer)),
        path_(std::move(path)),
        limits_(limits),
        ref_(name_ + "@" + std::to_string(version_)) {}

  const std::string& name() const { return name_; }
  int64_t version() const { return version_; }
  // "NAME@VERSION", the form a request pins a version with (model_source.h).
  const std::string& ref() const { return ref_; }
  Engine* engine() const { return engine_.get(); }
  const ModelConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  const std::string& path() const { return path_; }
  const ModelLimits& limits() const { return limits_; }
  // The grammars its requests sent last, with their masks for its vocabulary.
  GrammarCache& grammars() const { return grammars_; }

 private:
  const std::string name_;
  const int64_t version_;
  const std::unique_ptr<Engine> engine_;
  const ModelConfig config_;
  const Tokenizer tokenizer_;
  const std::string path_;
  const ModelLimits limits_;
  const std::string ref_;
  mutable GrammarCache grammars_{tokenizer_};
};

}  // namespace txl

#endif  // TXL_SERVER_ENGINE_SERVED_MODEL_H_
