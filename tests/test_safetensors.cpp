#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "elastic/safetensors.h"
#include "st_writer.h"

using namespace elastic;
using namespace elastic::testing;

static void expect_error(const std::string& path, const std::string& needle) {
  try {
    SafeTensors::open(path);
    FAIL() << "expected an error containing '" << needle << "'";
  } catch (const std::runtime_error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_NE(msg.find(path.substr(0, path.find_last_of('/'))), std::string::npos) << "message must name the file: " << msg;
  }
}

TEST(SafeTensors, ReadsAllDtypes) {
  auto d = temp_dir("st_ok");
  StTensor bf{"b", "BF16", {2}, {0x80, 0x3f, 0x00, 0xc0}};  // 1.0, -2.0
  StTensor hf{"h", "F16", {2}, {0x00, 0x3c, 0x01, 0x00}};   // 1.0, smallest subnormal
  write_safetensors(d + "/model.safetensors", {f32_tensor("a", {2, 3}, 0.5f), bf, hf});
  auto st = SafeTensors::open(d);
  EXPECT_EQ(st.tensors().size(), 3u);
  auto a = to_f32(st.require("a", {2, 3}));
  EXPECT_EQ(a, std::vector<float>(6, 0.5f));
  auto b = to_f32(*st.find("b"));
  EXPECT_EQ(b[0], 1.0f);
  EXPECT_EQ(b[1], -2.0f);
  auto h = to_f32(*st.find("h"));
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_FLOAT_EQ(h[1], 5.9604645e-08f);
}

TEST(SafeTensors, Sharded) {
  auto d = temp_dir("st_shard");
  write_safetensors(d + "/s1.safetensors", {f32_tensor("x", {4}, 1.f)});
  write_safetensors(d + "/s2.safetensors", {f32_tensor("y", {4}, 2.f)});
  std::ofstream(d + "/model.safetensors.index.json")
      << R"({"metadata":{},"weight_map":{"x":"s1.safetensors","y":"s2.safetensors"}})";
  auto st = SafeTensors::open(d);
  EXPECT_EQ(to_f32(*st.find("y"))[3], 2.f);
  std::ofstream(d + "/model.safetensors.index.json")
      << R"({"metadata":{},"weight_map":{"x":"s1.safetensors","z":"s2.safetensors"}})";
  expect_error(d, "'z'");
}

TEST(SafeTensors, Truncated) {
  auto d = temp_dir("st_trunc");
  write_safetensors(d + "/a.safetensors", {f32_tensor("x", {4}, 1.f)}, "", 5);
  expect_error(d + "/a.safetensors", "truncated");
  write_safetensors(d + "/b.safetensors", {f32_tensor("x", {4}, 1.f)}, "", 40);
  expect_error(d + "/b.safetensors", "");
}

TEST(SafeTensors, HeaderPastEnd) {
  auto d = temp_dir("st_past");
  write_safetensors(d + "/a.safetensors", {f32_tensor("x", {4}, 1.f)},
                    R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,1600]}})");
  expect_error(d + "/a.safetensors", "outside the data section");
}

TEST(SafeTensors, WrongDtypeAndSize) {
  auto d = temp_dir("st_dtype");
  write_safetensors(d + "/a.safetensors", {f32_tensor("x", {4}, 1.f)},
                    R"({"x":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})");
  expect_error(d + "/a.safetensors", "unsupported dtype 'I64'");
  write_safetensors(d + "/b.safetensors", {f32_tensor("x", {4}, 1.f)},
                    R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})");
  expect_error(d + "/b.safetensors", "does not match shape");
}

TEST(SafeTensors, OverlapAndBadJson) {
  auto d = temp_dir("st_overlap");
  write_safetensors(d + "/a.safetensors", {f32_tensor("x", {4}, 1.f), f32_tensor("y", {4}, 1.f)},
                    R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"y":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})");
  expect_error(d + "/a.safetensors", "overlap");
  write_safetensors(d + "/b.safetensors", {f32_tensor("x", {4}, 1.f)}, R"({"x": {"dtype": )");
  expect_error(d + "/b.safetensors", "malformed");
}

TEST(SafeTensors, RequireNamesTensor) {
  auto d = temp_dir("st_req");
  write_safetensors(d + "/model.safetensors", {f32_tensor("x", {4}, 1.f)});
  auto st = SafeTensors::open(d);
  try {
    st.require("x", {2, 2});
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("'x' has shape [4]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(st.require("missing.weight", {4}), std::runtime_error);
  expect_error(temp_dir("st_empty") + "/nothing", "");
}

// Hostile headers (issue 25).
TEST(SafeTensors, ShapeWhoseElementCountOverflowsIsRefused) {
  auto d = temp_dir("st_overflow");
  // 2^62 x 4 elements wrapped to 0 in int64 (UBSan: signed overflow) and matched an empty byte range.
  write_safetensors(d + "/a.safetensors", {f32_tensor("x", {4}, 1.f)},
                    R"({"x":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})");
  expect_error(d + "/a.safetensors", "makes more elements than the 16-byte data section holds");
  // Above 2^63 an entry read as a negative int64.
  write_safetensors(d + "/b.safetensors", {f32_tensor("x", {4}, 1.f)},
                    R"({"x":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,16]}})");
  expect_error(d + "/b.safetensors", "shape entry 18446744073709551615");
  write_safetensors(d + "/c.safetensors", {f32_tensor("x", {4}, 1.f)},
                    R"({"x":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})");
  expect_error(d + "/c.safetensors", "shape entry -4 is not a non-negative integer");
  // A zero dimension is a valid empty tensor whatever the others are.
  write_safetensors(d + "/e.safetensors", {f32_tensor("x", {4}, 1.f)},
                    R"({"x":{"dtype":"F32","shape":[0,4611686018427387904],"data_offsets":[0,0]}})");
  EXPECT_EQ(SafeTensors::open(d + "/e.safetensors").find("x")->numel(), 0);
}

TEST(SafeTensors, DeepHeaderAndDirectoriesAndForeignShards) {
  auto d = temp_dir("st_hostile");
  // 100,000 nested '[' overflowed the stack inside nlohmann's parser.
  write_safetensors(d + "/deep.safetensors", {f32_tensor("x", {4}, 1.f)},
                    R"({"x":)" + std::string(100000, '[') + std::string(100000, ']') + "}");
  expect_error(d + "/deep.safetensors", "nested deeper than 128 levels");
  // A model folder whose model.safetensors is a directory: "mmap failed" before.
  std::filesystem::create_directories(d + "/m/model.safetensors");
  expect_error(d + "/m", "is a directory");
  // An index may only name shards inside its folder.
  std::filesystem::create_directories(d + "/idx");
  write_safetensors(d + "/outside.safetensors", {f32_tensor("x", {4}, 1.f)});
  std::ofstream(d + "/idx/model.safetensors.index.json") << R"({"weight_map": {"x": "../outside.safetensors"}})";
  expect_error(d + "/idx", "is not a file inside the model folder");
}

TEST(SafeTensors, HeaderOverTheFormatLimitIsRefusedUnread) {
  // A header length of 150 MB in a (sparse) 160 MB file: refused by the limit, not parsed.
  auto d = temp_dir("st_biglen");
  const std::string p = d + "/a.safetensors";
  {
    std::ofstream f(p, std::ios::binary);
    const uint64_t hlen = 150'000'000;
    f.write(reinterpret_cast<const char*>(&hlen), 8);
  }
  std::filesystem::resize_file(p, 160'000'000);
  expect_error(p, "over the format's limit of 100000000 bytes");
}
