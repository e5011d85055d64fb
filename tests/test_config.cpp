#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>

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
  // String fields of another type (found by elastic_fuzz's type swaps): named, not a library type_error.
  j = qwen3();
  j["hidden_act"] = 5;
  EXPECT_NE(error_of(j).find("cfg.json: field 'hidden_act' must be a string, got 5"), std::string::npos)
      << error_of(j);
  j = qwen3();
  j["rope_scaling"] = {{"rope_type", json::array()}, {"factor", 4.0}};
  EXPECT_NE(error_of(j).find("field 'rope_type' must be a string"), std::string::npos) << error_of(j);
  EXPECT_THROW(load_config("/nonexistent/config.json"), std::runtime_error);
}

// Hostile configs (issue 25): sizes the loader would allocate for before any checkpoint shape can contradict them.
TEST(Config, AbsurdSizesAndNumbersAreRefusedByName) {
  auto j = qwen3();
  j["num_hidden_layers"] = 2000000000;  // resized a vector of 2e9 layers (bad_alloc)
  EXPECT_NE(error_of(j).find("field 'num_hidden_layers' out of range: 2000000000 (1 to 4096)"), std::string::npos)
      << error_of(j);
  j = qwen3();
  j["vocab_size"] = 18446744073709551615ULL;  // above 2^63: was read as -1
  EXPECT_NE(error_of(j).find("field 'vocab_size' out of range: 18446744073709551615"), std::string::npos)
      << error_of(j);
  j = qwen3();
  j["eos_token_id"] = 4294967301LL;  // get<int> wrapped it to 5
  EXPECT_NE(error_of(j).find("eos_token_id 4294967301 is out of range"), std::string::npos) << error_of(j);
  j = qwen3();
  j["eos_token_id"] = {1, -2};
  EXPECT_NE(error_of(j).find("eos_token_id -2 is out of range"), std::string::npos) << error_of(j);
  j = qwen3();
  j["rms_norm_eps"] = 1e300;  // beyond float: the narrowing was undefined
  EXPECT_NE(error_of(j).find("rms_norm_eps must be in [0, 1]"), std::string::npos) << error_of(j);
  j = qwen3();
  j["rope_theta"] = std::numeric_limits<double>::infinity();  // was accepted (inf > 0)
  EXPECT_NE(error_of(j).find("field 'rope_theta' must be a finite number"), std::string::npos) << error_of(j);
}

TEST(Config, DirectoryAndDeepJsonAreNamed) {
  const std::string d = ::testing::TempDir() + "config_hostile";
  std::filesystem::create_directories(d + "/config.json");
  try {
    load_config(d + "/config.json");
    FAIL();
  } catch (const std::runtime_error& e) {
    // Was "basic_filebuf::underflow error reading the file: Is a directory", naming no path.
    EXPECT_NE(std::string(e.what()).find(d + "/config.json: is a directory, not a config file"), std::string::npos)
        << e.what();
  }
  std::ofstream(d + "/deep.json") << std::string(100000, '[') << std::string(100000, ']');
  try {
    load_config(d + "/deep.json");
    FAIL();
  } catch (const std::runtime_error& e) {  // was a SIGSEGV inside the JSON parser
    EXPECT_NE(std::string(e.what()).find(d + "/deep.json: JSON nested deeper than 128 levels"), std::string::npos)
        << e.what();
  }
  std::ofstream(d + "/overflow.json") << R"({"rope_theta": 1e400})";
  try {
    load_config(d + "/overflow.json");
    FAIL();
  } catch (const std::runtime_error& e) {  // nlohmann's out_of_range escaped unwrapped, naming no file
    EXPECT_NE(std::string(e.what()).find(d + "/overflow.json: malformed JSON"), std::string::npos) << e.what();
  }
}

// One rule for "past the model's positions" (bench rows, logits prompts, route features, the server's context).
TEST(Config, RunsPastTheModelsPositionsAreRefused) {
  elastic::ModelConfig c;
  c.max_positions = 128;
  EXPECT_NO_THROW(elastic::check_within_context(c, 128, "x"));
  try {
    elastic::check_within_context(c, 129, "bench: -c 129");
    FAIL() << "129 positions on a 128-position model passed";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "bench: -c 129 exceeds the model's context of 128 tokens");
  }
  c.max_positions = 0;  // not known: nothing to check against
  EXPECT_NO_THROW(elastic::check_within_context(c, int64_t{1} << 40, "x"));
}
