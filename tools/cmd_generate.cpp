// elastic generate: prefill a prompt and decode a continuation (llama.cpp-style flags).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <memory>

#include "cli_common.h"
#include "elastic/engine.h"
#include "elastic/generate.h"
#include "elastic/npy.h"
#include "elastic/tokenizer.h"
#ifdef ELASTIC_HAVE_CUDA
#include "elastic/gpu_model.h"
#endif

namespace fs = std::filesystem;

namespace elastic::cli {

void add_generate_command(CLI::App& app, Commands& cmds) {
  struct Opts {
    std::string model, prompt, ids, tok, routing, mode, router, device = "cpu";
    int n = 32, ctx = 0, threads = 0, topk = 0, chunk = kDefaultPrefillChunk;
    float temp = 0.f, topp = 1.f;
    uint64_t seed = 0;
    bool print_ids = false, ignore_eos = false, chat = false;
  };
  auto o = std::make_shared<Opts>();
  auto* sub = app.add_subcommand("generate", "Generate a continuation of a prompt");
  add_model_option(sub, o->model);
  auto* opt_p = sub->add_option("-p,--prompt", o->prompt, "Prompt text");
  auto* opt_ids = sub->add_option("--ids", o->ids, "Prompt as a 1-D int32 .npy of token ids");
  opt_p->excludes(opt_ids);
  // A completion by default, like llama.cpp's raw mode: -p is continued as written. --chat asks an instruct model a
  // question the way serve's /v1/chat/completions does.
  sub->add_flag("--chat", o->chat, "Send -p as a user message through the model's chat template")->needs(opt_p);
  sub->add_option("--tokenizer", o->tok, "tokenizer.json (default: the model folder's)");
  // -n and -c are checked against the model's context once it is loaded (generation_capacity).
  sub->add_option("-n,--n-predict", o->n, "Tokens to generate")->check(in_range(0, kMaxTokens));
  sub->add_option("-c,--ctx-size", o->ctx, "Context size (default: prompt + n)")->check(in_range(0, kMaxTokens));
  add_threads_option(sub, o->threads);
  sub->add_option("--temp", o->temp, "Temperature (0 = greedy)")->check(in_range(0, 100));
  sub->add_option("--top-k", o->topk, "Top-k (0 = off)")->check(in_range(0, std::numeric_limits<int>::max()));
  sub->add_option("--top-p", o->topp, "Top-p (1 = off)")->check(in_range(0, 1));
  sub->add_option("--seed", o->seed, "Sampling seed")->check(seed_check());
  sub->add_flag("--print-ids", o->print_ids, "Print the new ids as a JSON array instead of text");
  sub->add_flag("--ignore-eos", o->ignore_eos, "Do not stop at end-of-sequence tokens");
  sub->add_option("--device", o->device, "cpu, or cuda (bf16 GPU backend)")->check(CLI::IsMember({"cpu", "cuda"}));
  add_routing_options(sub, o->routing, o->mode, o->router, o->chunk);
  cmds.push_back({sub, [o] {
    resolve_model(o->model, "generate");
    set_threads(o->threads);
    if (o->prompt.empty() && o->ids.empty()) throw std::runtime_error("generate: give -p TEXT or --ids IDS.npy");
    Model m = Model::load(o->model);
    const RoutePolicy policy = route_policy(m.config, o->routing, o->mode, o->router);
    std::unique_ptr<Tokenizer> t;
    std::vector<int32_t> prompt;
    if (!o->ids.empty()) {
      prompt = read_npy_ids(o->ids);
    } else {
      t = load_model_tokenizer(o->model, o->tok, true);
      std::string text = o->prompt;
      if (o->chat) {
        const auto format = model_chat_format(o->model, true, false, "generate", "leave out --chat");
        if (!format)
          throw std::runtime_error("generate --chat: " + o->model + " has no chat template of a known family");
        text = format(text);
      }
      prompt = t->encode(text);
    }
    if (!o->print_ids && !t) t = load_model_tokenizer(o->model, o->tok);
    // Before any allocation: -n 100000000 is an error naming -n and the context, not a bad_alloc.
    [[maybe_unused]] const int capacity = generation_capacity(static_cast<int64_t>(prompt.size()), o->n, o->ctx, m.config.max_positions);
    SamplerParams sp{o->temp, o->topk, o->topp, o->seed};
    GenerateStats st;
    auto stream = [&](int32_t id) {
      if (!o->print_ids && t) std::cout << t->decode({id}) << std::flush;
    };
    std::vector<int32_t> out;
    if (o->device == "cuda") {
#ifdef ELASTIC_HAVE_CUDA
      cuda::GpuOptions go;
      go.max_ctx = o->ctx > 0 ? o->ctx : capacity;
      go.chunk = o->chunk;
      auto g = cuda::GpuModel::upload(m, go);
      std::fprintf(stderr, "%s\n", g->plan().describe().c_str());
      const auto be = cuda::gpu_sequence_backend(*g);
      out = generate(*be, m.config, prompt, o->n, policy.fixed_table(), policy.prompt_router(), sp, !o->ignore_eos, &st,
                     stream);
#else
      no_cuda_backend("generate");
#endif
    } else {
      out = generate(m, policy, prompt, o->n, o->ctx, sp, !o->ignore_eos, &st, stream, o->chunk);
    }
    if (o->print_ids || !t) std::cout << ids_json(out);
    std::cout << std::endl;
    std::fprintf(stderr, "prompt: %d tokens in %.3f s (%.1f tok/s) | decode: %d tokens in %.3f s (%.1f tok/s)\n",
                 st.prompt_tokens, st.prefill_s, st.prompt_tokens / std::max(st.prefill_s, 1e-9), st.new_tokens,
                 st.decode_s, st.new_tokens > 1 ? (st.new_tokens - 1) / std::max(st.decode_s, 1e-9) : 0.0);
    // The last token is returned, never fed: the sequence holds the prompt and every earlier new token.
    print_metrics(st.routing, st.attn, st.prompt_tokens + std::max(0, st.new_tokens - 1));
    std::fprintf(stderr, "kv cache: %.2f MiB (%s)\n", st.kv_bytes / 1048576.0,
                 o->device == "cuda" ? "bf16 pages held" : "fp32, allocated for the run's capacity");
  }});
}

}  // namespace elastic::cli
