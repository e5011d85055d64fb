#include "cli_common.h"

#include "elastic/sparse_pattern.h"
#include "elastic/chat_template.h"

#include "elastic/router.h"
#include "elastic/tokenizer.h"

#include <omp.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace fs = std::filesystem;

namespace elastic::cli {

namespace {

std::string fmt_bound(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.10g", v);
  return b;
}

// The flag's text as a number: the whole text, finite (strtod reads "nan", "inf" and "1e400" = inf as numbers).
bool finite_number(const std::string& text, double& v) {
  char* end = nullptr;
  errno = 0;
  v = std::strtod(text.c_str(), &end);
  return !text.empty() && end && *end == '\0' && errno != ERANGE && std::isfinite(v);
}

CLI::Validator finite_check(double lo, double hi, bool lo_open) {
  const std::string range = std::string(lo_open ? "(" : "[") + fmt_bound(lo) + ", " + fmt_bound(hi) + "]";
  return CLI::Validator(
      [lo, hi, lo_open, range](std::string& text) -> std::string {
        double v = 0;
        if (!finite_number(text, v)) return "'" + text + "' is not a finite number in " + range;
        if (lo_open ? !(v > lo) : !(v >= lo)) return text + " is not in " + range;
        if (!(v <= hi)) return text + " is not in " + range;
        return {};
      },
      "in " + range);
}

}  // namespace

CLI::Validator in_range(double lo, double hi) { return finite_check(lo, hi, false); }
CLI::Validator seed_check() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        const bool digits = !text.empty() && text.size() <= 20 &&
                            std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
        errno = 0;
        if (digits) (void)std::strtoull(text.c_str(), nullptr, 10);
        if (!digits || errno == ERANGE) return "'" + text + "' is not a seed (an integer in [0, 18446744073709551615])";
        return {};
      },
      "seed");
}
CLI::Validator positive_up_to(double hi) { return finite_check(0, hi, true); }

void add_threads_option(CLI::App* sub, int& threads) {
  sub->add_option("-t,--threads", threads, "CPU threads (0 = one per core, at most " + std::to_string(kMaxThreads) + ")")
      ->check(in_range(0, kMaxThreads));
}

void add_model_option(CLI::App* sub, std::string& model) {
  sub->add_option("-m,--model", model,
                  std::string("Hugging Face model folder or .gguf file (default: ") + kDefaultModel + ", which "
                  "scripts/setup.sh fetches)");
}

void resolve_model(std::string& model, const char* cmd) {
  if (!model.empty()) return;
  std::vector<fs::path> where = {fs::path(kDefaultModel)};
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) where.push_back(exe.parent_path().parent_path() / kDefaultModel);
  for (const fs::path& p : where)
    if (fs::is_regular_file(p, ec)) {
      model = p.lexically_normal().string();
      std::fprintf(stderr, "%s: no -m given: using the default model %s\n", cmd, model.c_str());
      return;
    }
  throw std::runtime_error(std::string(cmd) + ": no -m given and the default model " + kDefaultModel +
                           " is not here or beside the build folder (bash scripts/get_smollm2.sh fetches it)");
}

void add_sparse_options(CLI::App* sub, SparseSettings& s, const std::string& what) {
  sub->add_option("--block", s.block, "Sparse block size (64 or 128)" + what)->check(CLI::IsMember({64, 128}));
  sub->add_option("--sink", s.sink, "Streaming sink tokens" + what)->check(in_range(0, kMaxSparseWindow));
  sub->add_option("--local", s.local, "Streaming local window tokens" + what)->check(in_range(1, kMaxSparseWindow));
  // XAttention's two knobs: tau sets how much softmax mass a query block keeps, so it sets the density (and the
  // speed); the stride sets the estimate's cost (1/S of the score product).
  sub->add_option("--xattn-tau", s.xattn.tau, "XAttention: softmax mass each query block keeps, in (0, 1]" + what)
      ->check(positive_up_to(1));
  sub->add_option("--xattn-stride", s.xattn.stride, "XAttention: antidiagonal stride (8 or 16)" + what)
      ->check(CLI::IsMember({8, 16}));
}

std::string ids_json(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s + "]";
}

std::unique_ptr<Tokenizer> load_model_tokenizer(const std::string& model, const std::string& override_path,
                                                bool required) {
  const std::string p = model_tokenizer_path(model, override_path);
  if (!p.empty()) return std::make_unique<Tokenizer>(Tokenizer::from_file(p));
  if (required)
    throw std::runtime_error(model + ": no tokenizer.json in the model folder and none in a GGUF's metadata (pass "
                             "--tokenizer or use --ids)");
  return nullptr;
}

RoutePolicy route_policy(const ModelConfig& c, const std::string& routing_file, const std::string& mode,
                         const std::string& router) {
  if (!routing_file.empty() + !mode.empty() + !router.empty() > 1)
    throw std::runtime_error("give one of --routing, --mode and --router");
  if (!router.empty()) return RoutePolicy::routed(std::make_shared<Router>(Router::load(router, c)));
  if (!mode.empty()) return RoutePolicy::fixed(RoutingTable::uniform(c.n_layers, c.n_kv_heads, parse_head_mode(mode)));
  if (routing_file.empty()) return RoutePolicy::all_full(c);
  RoutePolicy p = RoutePolicy::fixed(load_routing(routing_file, c.n_layers, c.n_kv_heads));
  const SparseSettings& s = p.table.sparse;
  // A routing file written for another model can ask for a window longer than this one's context.
  if (p.table.msr() > 0 && int64_t{s.sink} + s.local > c.max_positions)
    throw std::runtime_error(routing_file + ": streaming sink + local (" + std::to_string(s.sink) + " + " +
                             std::to_string(s.local) + ") exceeds the model's context " +
                             std::to_string(c.max_positions) + " tokens");
  return p;
}

void add_routing_options(CLI::App* sub, std::string& routing, std::string& mode, std::string& router, int& chunk) {
  sub->add_option("--chunk", chunk, "Prefill chunk size in tokens")->check(in_range(1, kMaxTokens));
  sub->add_option("--routing", routing, "Routing JSON: mode per layer per KV head plus sparse settings");
  sub->add_option("--mode", mode, "Route every head to one mode")->check(CLI::IsMember(sparse_pattern_names()));
  sub->add_option("--router", router, "Trained router (.safetensors): routes each prompt at prefill");
}

void print_metrics(const RoutingTable& r, const AttentionStats& st, int n_pos) {
  const int64_t kept = kept_kv_positions(r, n_pos), all = int64_t(n_pos) * int64_t(r.mode.size());
  std::fprintf(stderr,
               "routing: Omega_MSR %.3f | Omega_ESR %.3f | attention FLOPs %.3f of full | KV kept %.3f of full (%lld of "
               "%lld positions at %d)\n",
               r.msr(), st.esr(), st.flops_ratio(), kept_kv_share(r, n_pos),
               static_cast<long long>(kept), static_cast<long long>(all), n_pos);
}

void set_threads(int t) {
  // The flag's check already bounds -t; this guards callers that set it from elsewhere.
  if (t < 0 || t > kMaxThreads)
    throw std::invalid_argument("-t/--threads " + std::to_string(t) + " is not in [0, " + std::to_string(kMaxThreads) +
                                "]");
  if (t > 0) omp_set_num_threads(t);
}

std::function<std::string(const std::string&)> model_chat_format(const std::string& model, bool have_tokenizer,
                                                                 bool no_chat, const char* who, const char* off_hint) {
  if (!have_tokenizer || no_chat) return {};
  ChatTemplate ct = ChatTemplate::from_model_dir(model);
  if (ct.family() == ChatFamily::Unknown) {
    std::fprintf(stderr, "%s: the model's chat template is not a known family: raw prompts\n", who);
    return {};
  }
  if (ct.family() == ChatFamily::None) return {};
  std::fprintf(stderr, "%s: chat template %s applied (%s to turn off)\n", who, chat_family_name(ct.family()), off_hint);
  return [ct](const std::string& user) { return ct.apply({{"user", user}}, true); };
}

void no_cuda_backend(const char* cmd, const char* flag) {
  throw std::runtime_error(std::string(cmd) + ": this build has no CUDA backend (" + flag +
                           "); rebuild with the CUDA toolkit installed (cmake -DELASTIC_CUDA=ON)");
}

std::string beside_markdown(const std::string& md_path, const std::string& suffix) {
  std::string p = md_path;
  if (p.size() > 3 && p.compare(p.size() - 3, 3, ".md") == 0) p.resize(p.size() - 3);
  return p + suffix;
}

size_t available_memory_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  size_t kib = 0;
  std::string unit;
  while (f >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

}  // namespace elastic::cli
