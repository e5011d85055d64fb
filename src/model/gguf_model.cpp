// Model::load_gguf: a llama.cpp GGUF file (architecture llama or qwen3) -> ModelConfig + ModelWeights, projection
// matrices in Q8_0/Q4_0/Q4_1 kept as the file's blocks (read in place by src/model/linear.cpp), others widened to fp32.
//
// Differences from the HF checkpoint that the loader undoes:
//   - llama.cpp's converter permutes the rows of Llama's q/k projections so that each head's rotary pairs are
//     adjacent (ggml's "normal" RoPE rotates (x[2i], x[2i+1])); our forward uses HF rotate_half, which rotates
//     (x[i], x[i + hd/2]). Converter: GGUF row h*hd + 2*i + j = HF row h*hd + j*hd/2 + i (i < hd/2, j in {0,1}).
//     Qwen3 is converted without that permutation (it runs with NeoX-style RoPE in llama.cpp).
//   - llama3 rope scaling is not metadata: the converter writes a `rope_freqs` tensor of per-frequency divisors
//     (ggml divides each frequency by it), so inv_freq = theta^(-2i/hd) / rope_freqs[i].
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "elastic/gguf.h"
#include "elastic/model.h"
#include "model/ops.h"

namespace elastic {
namespace {

using gguf::File;
using gguf::TensorInfo;

// A positive size of at most `max` (config_limits: the same bounds as config.json's).
int meta_int(const File& f, const std::string& key, bool required, int dflt, long long max = config_limits::kMaxInt) {
  if (!f.find(key)) {
    if (required) f.fail("missing metadata '" + key + "'");
    return dflt;
  }
  const int64_t v = f.get_int(key);
  if (v <= 0 || v > max)
    f.fail("metadata '" + key + "' out of range: " + std::to_string(v) + " (1 to " + std::to_string(max) + ")");
  return static_cast<int>(v);
}

// A finite float in [lo, hi]: the narrowing to float of a larger double is undefined, and NaN passes `<= 0` tests.
double meta_float(const File& f, const std::string& key, double dflt, double lo, double hi) {
  if (!f.find(key)) return dflt;
  const double v = f.get_float(key);
  if (!(std::isfinite(v) && v >= lo && v <= hi))
    f.fail("metadata '" + key + "' out of range: " + std::to_string(v) + " (" + std::to_string(lo) + " to " +
           std::to_string(hi) + ")");
  return v;
}

const TensorInfo& checked(const File& f, const std::string& name, const std::vector<int64_t>& dims) {
  const TensorInfo& t = f.tensor(name);
  if (t.dims != dims) {
    auto fmt = [](const std::vector<int64_t>& d) {
      std::string s = "[";
      for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
      return s + "]";
    };
    f.fail("tensor '" + name + "' has dims " + fmt(t.dims) + ", expected " + fmt(dims) +
           " (ne0 first) for this config");
  }
  return t;
}

// Dequantized tensor with its shape checked against the expected dims (innermost first).
std::vector<float> take(const File& f, const std::string& name, std::vector<int64_t> dims) {
  const TensorInfo& t = checked(f, name, dims);
  std::vector<float> w = f.dequantize(t);
  f.release(t);  // the file's pages leave memory as their copy arrives: a lower peak
  return w;
}

// A matrix with dims {cols, rows}: kept in its blocks when the CPU kernels read that format, else widened to fp32.
WeightMatrix take_matrix(const File& f, const std::string& name, int64_t cols, int64_t rows) {
  const TensorInfo& t = checked(f, name, {cols, rows});
  WeightFormat kept = WeightFormat::F32;
  if (t.type == gguf::GgmlType::Q8_0) kept = WeightFormat::Q8_0;
  if (t.type == gguf::GgmlType::Q4_0) kept = WeightFormat::Q4_0;
  if (t.type == gguf::GgmlType::Q4_1) kept = WeightFormat::Q4_1;
  if (kept == WeightFormat::F32) return WeightMatrix::from_f32(take(f, name, {cols, rows}), rows, cols);
  std::vector<uint8_t> bytes(t.data, t.data + t.n_bytes);
  f.release(t);
  return WeightMatrix::from_blocks(kept, std::move(bytes), rows, cols);
}

// Row order that undoes the converter's permutation over `heads` blocks of hd rows: result row h*hd + j*hd/2 + i is
// file row h*hd + 2i + j.
std::vector<int64_t> unpermuted_order(int heads, int hd) {
  std::vector<int64_t> src(static_cast<size_t>(heads) * hd);
  const int half = hd / 2;
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < half; ++i)
      for (int j = 0; j < 2; ++j) src[static_cast<size_t>(h) * hd + j * half + i] = int64_t{h} * hd + 2 * i + j;
  return src;
}

std::vector<float> reordered(const std::vector<float>& v, const std::vector<int64_t>& src) {
  std::vector<float> out(src.size());
  for (size_t i = 0; i < src.size(); ++i) out[i] = v[static_cast<size_t>(src[i])];
  return out;
}

ModelConfig read_config(const File& f) {
  ModelConfig c;
  const std::string arch = f.get_string("general.architecture");
  if (arch == "llama") {
    c.arch = Arch::Llama;
  } else if (arch == "qwen3") {
    c.arch = Arch::Qwen3;
    c.qk_norm = true;
  } else {
    f.fail("unsupported general.architecture '" + arch + "' (supported: llama, qwen3)");
  }
  const std::string p = arch + ".";
  using namespace config_limits;
  c.hidden = meta_int(f, p + "embedding_length", true, 0, kMaxWidth);
  c.n_layers = meta_int(f, p + "block_count", true, 0, kMaxLayers);
  c.n_heads = meta_int(f, p + "attention.head_count", true, 0, kMaxHeads);
  c.n_kv_heads = meta_int(f, p + "attention.head_count_kv", false, c.n_heads, kMaxHeads);
  c.intermediate = meta_int(f, p + "feed_forward_length", true, 0, kMaxWidth);
  c.max_positions = meta_int(f, p + "context_length", false, 32768);
  if (c.hidden % c.n_heads && !f.find(p + "attention.key_length"))
    f.fail(p + "embedding_length not divisible by head_count and no attention.key_length");
  c.head_dim = meta_int(f, p + "attention.key_length", false, c.hidden / c.n_heads, kMaxHeads);
  if (meta_int(f, p + "attention.value_length", false, c.head_dim) != c.head_dim)
    f.fail(p + "attention.value_length differs from key_length (unsupported)");
  if (c.head_dim % 2) f.fail("head_dim must be even for RoPE, got " + std::to_string(c.head_dim));
  if (c.n_heads % c.n_kv_heads)
    f.fail(p + "attention.head_count (" + std::to_string(c.n_heads) + ") not a multiple of head_count_kv (" +
           std::to_string(c.n_kv_heads) + ")");
  if (meta_int(f, p + "rope.dimension_count", false, c.head_dim) != c.head_dim)
    f.fail(p + "rope.dimension_count differs from head_dim (partial rotary is unsupported)");
  c.rms_eps = static_cast<float>(meta_float(f, p + "attention.layer_norm_rms_epsilon", 1e-6, 0.0, 1.0));
  c.rope.theta = meta_float(f, p + "rope.freq_base", 10000.0, 1e-30, 1e30);
  if (f.find(p + "rope.scaling.type")) {
    const std::string st = f.get_string(p + "rope.scaling.type");
    if (st != "none") f.fail("unsupported " + p + "rope.scaling.type '" + st + "' (supported: none; llama3 via rope_freqs)");
  }
  // Vocabulary: metadata when present, else the embedding's row count.
  const TensorInfo& emb = f.tensor("token_embd.weight");
  if (emb.dims.size() != 2) f.fail("tensor 'token_embd.weight' must be 2-D");
  if (emb.dims[1] <= 0 || emb.dims[1] > kMaxVocab)
    f.fail("tensor 'token_embd.weight' has " + std::to_string(emb.dims[1]) + " rows (1 to " +
           std::to_string(kMaxVocab) + ")");
  c.vocab = f.find(p + "vocab_size") ? meta_int(f, p + "vocab_size", true, 0, kMaxVocab) : static_cast<int>(emb.dims[1]);
  c.tie_embeddings = f.find_tensor("output.weight") == nullptr;
  c.attention_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;
  for (const char* k : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"})
    if (f.find(k)) {
      const int64_t id64 = f.get_int(k);
      if (id64 < 0 || id64 > kMaxInt) f.fail("metadata '" + std::string(k) + "' out of range: " + std::to_string(id64));
      const int id = static_cast<int>(id64);
      bool seen = false;
      for (int e : c.eos_ids) seen |= e == id;
      if (!seen) c.eos_ids.push_back(id);
    }
  return c;
}

}  // namespace

Model Model::load_gguf(const std::string& gguf_path) {
  const File f = File::open(gguf_path);
  Model m;
  m.config = read_config(f);
  const ModelConfig& c = m.config;
  const int64_t D = c.hidden, hd = c.head_dim, Hq = c.n_heads, Hkv = c.n_kv_heads, F = c.intermediate, V = c.vocab;
  const bool permuted = c.arch == Arch::Llama;
  ModelWeights& w = m.weights;
  w.embed = take_matrix(f, "token_embd.weight", D, V);
  w.final_norm = take(f, "output_norm.weight", {D});
  if (!c.tie_embeddings) w.lm_head = take_matrix(f, "output.weight", D, V);
  w.layers.resize(c.n_layers);
  for (int l = 0; l < c.n_layers; ++l) {
    LayerWeights& L = w.layers[l];
    const std::string b = "blk." + std::to_string(l) + ".";
    L.attn_norm = take(f, b + "attn_norm.weight", {D});
    L.wq = take_matrix(f, b + "attn_q.weight", D, Hq * hd);
    L.wk = take_matrix(f, b + "attn_k.weight", D, Hkv * hd);
    L.wv = take_matrix(f, b + "attn_v.weight", D, Hkv * hd);
    L.wo = take_matrix(f, b + "attn_output.weight", Hq * hd, D);
    if (c.attention_bias) {
      L.bq = take(f, b + "attn_q.bias", {Hq * hd});
      L.bk = take(f, b + "attn_k.bias", {Hkv * hd});
      L.bv = take(f, b + "attn_v.bias", {Hkv * hd});
    }
    if (permuted) {
      L.wq.permute_rows(unpermuted_order(static_cast<int>(Hq), static_cast<int>(hd)));
      L.wk.permute_rows(unpermuted_order(static_cast<int>(Hkv), static_cast<int>(hd)));
      if (c.attention_bias) {
        L.bq = reordered(L.bq, unpermuted_order(static_cast<int>(Hq), static_cast<int>(hd)));
        L.bk = reordered(L.bk, unpermuted_order(static_cast<int>(Hkv), static_cast<int>(hd)));
      }
    }
    if (c.qk_norm) {
      L.q_norm = take(f, b + "attn_q_norm.weight", {hd});
      L.k_norm = take(f, b + "attn_k_norm.weight", {hd});
    }
    L.mlp_norm = take(f, b + "ffn_norm.weight", {D});
    L.w_gate = take_matrix(f, b + "ffn_gate.weight", D, F);
    L.w_up = take_matrix(f, b + "ffn_up.weight", D, F);
    L.w_down = take_matrix(f, b + "ffn_down.weight", F, D);
  }
  m.rope_inv_freq = compute_rope_inv_freq(c);
  if (f.find_tensor("rope_freqs.weight")) {
    const std::vector<float> div = take(f, "rope_freqs.weight", {hd / 2});
    for (int64_t i = 0; i < hd / 2; ++i) {
      if (!(div[i] > 0) || !std::isfinite(div[i]))
        f.fail("tensor 'rope_freqs.weight' element " + std::to_string(i) + " is not a positive number");
      m.rope_inv_freq[i] /= div[i];
    }
  }
  return m;
}

}  // namespace elastic
