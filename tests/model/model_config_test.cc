#include "model/model_config.h"

#include <gtest/gtest.h>

namespace txl {
namespace {

TEST(ModelConfigTest, JsonRoundTripKeepsEveryField) {
  ModelConfig c;
  c.n_token = 100;
  c.n_layer = 4;
  c.d_embed = 48;
  c.div_val = 2;
  c.cutoffs = {10, 50};
  c.tie_projs = {false, true, false};
  c.pre_lnorm = true;
  c.untie_r = true;
  c.clamp_len = 9;
  c.same_length = false;
  c.dropout = 0.1;
  c.dropatt = 0.05;
  c.tail_cluster_order = TailClusterOrder::kSequential;
  ASSERT_TRUE(c.Validate().ok());
  absl::StatusOr<ModelConfig> back = ModelConfig::FromJson(c.ToJson());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ToJson(), c.ToJson());
  EXPECT_EQ(back->cutoff_ends(), (std::vector<int64_t>{0, 10, 50, 100}));
  EXPECT_EQ(back->bin_dim(2), 12);
}

TEST(ModelConfigTest, MissingKeysKeepDefaults) {
  absl::StatusOr<ModelConfig> c = ModelConfig::FromJson(R"({"n_token": 7})");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->n_token, 7);
  EXPECT_EQ(c->n_layer, ModelConfig().n_layer);
  EXPECT_EQ(c->embed_dim(), c->d_model);
}

TEST(ModelConfigTest, RejectsUnknownKeysAndWrongTypes) {
  auto unknown = ModelConfig::FromJson(R"({"n_layers": 3})");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("n_layers"), std::string::npos);
  auto type = ModelConfig::FromJson(R"({"n_head": "four"})");
  ASSERT_FALSE(type.ok());
  EXPECT_NE(type.status().message().find("n_head"), std::string::npos);
  EXPECT_FALSE(ModelConfig::FromJson("{not json").ok());
  auto order = ModelConfig::FromJson(R"({"tail_cluster_order": "sideways"})");
  ASSERT_FALSE(order.ok());
  EXPECT_NE(order.status().message().find("tail_cluster_order"), std::string::npos);
}

struct BadCase {
  const char* field;
  void (*mutate)(ModelConfig&);
};

TEST(ModelConfigTest, ValidateNamesTheBadField) {
  const BadCase cases[] = {
      {"n_token", [](ModelConfig& c) { c.n_token = 0; }},
      {"n_layer", [](ModelConfig& c) { c.n_layer = 0; }},
      {"d_model", [](ModelConfig& c) { c.d_model = 33; }},
      {"d_embed", [](ModelConfig& c) { c.d_embed = 0; }},
      {"div_val", [](ModelConfig& c) { c.div_val = 0; }},
      {"cutoffs",
       [](ModelConfig& c) {
         c.cutoffs = {20, 10};
       }},
      {"cutoffs", [](ModelConfig& c) { c.cutoffs = {100}; }},
      {"div_val",
       [](ModelConfig& c) {
         c.cutoffs = {10, 20, 30};
         c.div_val = 64;
       }},
      {"tie_projs",
       [](ModelConfig& c) {
         c.tie_projs = {true};
         c.cutoffs = {10};
       }},
      {"mem_len", [](ModelConfig& c) { c.mem_len = -1; }},
      {"dropout", [](ModelConfig& c) { c.dropout = 1.0; }},
      {"dropatt", [](ModelConfig& c) { c.dropatt = -0.1; }},
  };
  for (const BadCase& bad : cases) {
    ModelConfig c;
    c.n_token = 100;
    bad.mutate(c);
    absl::Status s = c.Validate();
    ASSERT_FALSE(s.ok()) << bad.field;
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(bad.field), std::string::npos) << s.message();
  }
}

}  // namespace
}  // namespace txl
