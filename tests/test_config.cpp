#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "elastic/config.h"

using namespace elastic;
using nlohmann::json;

static json qwen3() {
  return json::parse(R"({"architectures":["Qwen3ForCausalLM"],"hidden_size":64,"num_hidden_layers":2,
    "num_attention_heads":4,"num_key_value_heads":2,"head_dim":32,"intermediate_size":128,"vocab_size":512,
    "rms_norm_eps":1e-6,"rope_theta":1000000,"tie_word_embeddings":false})");
}

static std::string error_of(const json& j) {
  try {
    parse_config(j, "cfg.json");
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(Config, Qwen3Fields) {
  auto c = parse_config(qwen3(), "cfg.json");
  EXPECT_EQ(c.arch, Arch::Qwen3);
  EXPECT_EQ(c.head_dim, 32);  // read, not hidden / heads
  EXPECT_TRUE(c.qk_norm);
  EXPECT_DOUBLE_EQ(c.rope.theta, 1e6);
  EXPECT_FALSE(c.rope.llama3);
}

TEST(Config, LlamaRopeParameters) {
  auto j = json::parse(R"({"architectures":["LlamaForCausalLM"],"hidden_size":64,"num_hidden_layers":2,
    "num_attention_heads":4,"num_key_value_heads":2,"intermediate_size":160,"vocab_size":512,
    "rope_parameters":{"rope_type":"llama3","rope_theta":500000.0,"factor":8.0,"low_freq_factor":1.0,
    "high_freq_factor":4.0,"original_max_position_embeddings":64},"tie_word_embeddings":true,"eos_token_id":[1,2]})");
  auto c = parse_config(j, "cfg.json");
  EXPECT_EQ(c.arch, Arch::Llama);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_TRUE(c.rope.llama3);
  EXPECT_DOUBLE_EQ(c.rope.theta, 500000.0);
  EXPECT_EQ(c.rope.original_max_positions, 64);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_EQ(c.eos_ids, (std::vector<int>{1, 2}));
  // Older layout: rope_scaling at top level.
  j.erase("rope_parameters");
  j["rope_theta"] = 500000.0;
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  c = parse_config(j, "cfg.json");
  EXPECT_TRUE(c.rope.llama3);
  EXPECT_EQ(c.rope.original_max_positions, 8192);
}

TEST(Config, Errors) {
  auto j = qwen3();
  j["architectures"] = {"MistralForCausalLM"};
  EXPECT_NE(error_of(j).find("unknown architecture 'MistralForCausalLM'"), std::string::npos);
  j = qwen3();
  j.erase("hidden_size");
  EXPECT_NE(error_of(j).find("cfg.json: missing required field 'hidden_size'"), std::string::npos);
  j = qwen3();
  j["num_key_value_heads"] = 3;
  EXPECT_NE(error_of(j).find("not a multiple"), std::string::npos);
  j = qwen3();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  EXPECT_NE(error_of(j).find("unsupported rope_scaling type 'yarn'"), std::string::npos);
  j = qwen3();
  j["hidden_size"] = "64";
  EXPECT_NE(error_of(j).find("'hidden_size' must be an integer"), std::string::npos);
  j = qwen3();
  j["hidden_act"] = "gelu";
  EXPECT_NE(error_of(j).find("hidden_act"), std::string::npos);
  EXPECT_THROW(load_config("/nonexistent/config.json"), std::runtime_error);
}
