#include "cli_common.h"

#include "elastic/chat_template.h"

#include "elastic/router.h"

#include <omp.h>

#include <cstdio>
#include <filesystem>
#include <stdexcept>

namespace fs = std::filesystem;

namespace elastic::cli {

std::string ids_json(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s + "]";
}

std::string tokenizer_path_for(const std::string& model_dir, const std::string& override_path) {
  if (!override_path.empty()) return override_path;
  if (is_gguf(model_dir)) return model_dir;  // a GGUF file carries its tokenizer
  fs::path p = fs::path(model_dir) / "tokenizer.json";
  if (!fs::exists(p))
    throw std::runtime_error(model_dir + ": no tokenizer.json in the model folder (pass --tokenizer or use --ids)");
  return p.string();
}

bool is_gguf(const std::string& model) {
  return fs::is_regular_file(model) && fs::path(model).extension() == ".gguf";
}

bool has_tokenizer(const std::string& model, const std::string& override_path) {
  return !override_path.empty() || is_gguf(model) || fs::exists(fs::path(model) / "tokenizer.json");
}

void apply_routing(Model& m, const std::string& routing_file, const std::string& mode, const std::string& router) {
  if (!routing_file.empty() + !mode.empty() + !router.empty() > 1)
    throw std::runtime_error("give one of --routing, --mode and --router");
  if (!router.empty()) m.router = std::make_shared<Router>(Router::load(router, m.config));
  if (!routing_file.empty()) m.routing = load_routing(routing_file, m.config.n_layers, m.config.n_kv_heads);
  else if (!mode.empty()) m.routing = RoutingTable::uniform(m.config.n_layers, m.config.n_kv_heads, parse_head_mode(mode));
  const SparseSettings& s = m.routing.sparse;
  // A routing file written for another model can ask for a window longer than this one's context.
  if (!routing_file.empty() && m.routing.msr() > 0 && s.sink + s.local > m.config.max_positions)
    throw std::runtime_error(routing_file + ": streaming sink + local (" + std::to_string(s.sink) + " + " +
                             std::to_string(s.local) + ") exceeds the model's context " +
                             std::to_string(m.config.max_positions) + " tokens");
}

void add_routing_options(CLI::App* sub, std::string& routing, std::string& mode, std::string& router, int& chunk) {
  sub->add_option("--chunk", chunk, "Prefill chunk size in tokens")->check(CLI::PositiveNumber);
  sub->add_option("--routing", routing, "Routing JSON: mode per layer per KV head plus sparse settings");
  sub->add_option("--mode", mode, "Route every head to one mode")->check(CLI::IsMember({"full", "ssa", "xattn"}));
  sub->add_option("--router", router, "Trained router (.safetensors): routes each prompt at prefill");
}

void print_metrics(const RoutingTable& r, const AttentionStats& st) {
  std::fprintf(stderr, "routing: Omega_MSR %.3f | Omega_ESR %.3f | attention FLOPs %.3f of full\n", r.msr(), st.esr(),
               st.flops_ratio());
}

void set_threads(int t) {
  if (t > 0) omp_set_num_threads(t);
}

std::function<std::string(const std::string&)> model_chat_format(const std::string& model, bool have_tokenizer,
                                                                 bool no_chat, const char* who) {
  if (!have_tokenizer || no_chat) return {};
  ChatTemplate ct = ChatTemplate::from_model_dir(model);
  if (ct.family() == ChatFamily::Unknown) {
    std::fprintf(stderr, "%s: the model's chat template is not a known family: raw prompts\n", who);
    return {};
  }
  if (ct.family() == ChatFamily::None) return {};
  std::fprintf(stderr, "%s: chat template %s applied (--no-chat to turn off)\n", who, chat_family_name(ct.family()));
  return [ct](const std::string& user) { return ct.apply({{"user", user}}, true); };
}

void no_cuda_backend(const char* cmd, const char* flag) {
  throw std::runtime_error(std::string(cmd) + ": this build has no CUDA backend (" + flag +
                           "); rebuild with the CUDA toolkit installed (cmake -DELASTIC_CUDA=ON)");
}

}  // namespace elastic::cli
