#include "elastic/chat_template.h"

#include "elastic/gguf.h"

#include <ctime>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "elastic/json_file.h"
#include "elastic/tokenizer.h"
#include "io/trim.h"

namespace elastic {

namespace fs = std::filesystem;

const char* chat_family_name(ChatFamily f) {
  switch (f) {
    case ChatFamily::None: return "none";
    case ChatFamily::ChatML: return "chatml";
    case ChatFamily::Qwen3: return "qwen3";
    case ChatFamily::Llama3: return "llama3";
    case ChatFamily::Unknown: return "unknown";
  }
  return "?";
}

namespace {

bool has(const std::string& s, const char* marker) { return s.find(marker) != std::string::npos; }

std::string lstrip(const std::string& s, const char* chars) {
  const size_t a = s.find_first_not_of(chars);
  return a == std::string::npos ? "" : s.substr(a);
}
std::string rstrip(const std::string& s, const char* chars) {
  const size_t b = s.find_last_not_of(chars);
  return b == std::string::npos ? "" : s.substr(0, b + 1);
}

// A special-token field is a string or {"content": "..."} (AddedToken); null/absent = "".
std::string token_field(const nlohmann::json& j, const char* key, const std::string& src) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) return (*it)["content"];
  throw std::runtime_error(src + ": \"" + key + "\" must be a string or an object with a \"content\" string");
}

void check_roles(const std::vector<ChatMessage>& msgs) {
  if (msgs.empty()) throw ChatTemplateError("messages must not be empty");
  for (size_t i = 0; i < msgs.size(); ++i)
    if (msgs[i].role != "system" && msgs[i].role != "user" && msgs[i].role != "assistant")
      throw ChatTemplateError("messages[" + std::to_string(i) + "]: role '" + msgs[i].role +
                              "' is not supported (expected system, user or assistant)");
}

// Appends rendered pieces, merging neighbours of the same kind.
struct Out {
  std::vector<ChatSegment> segs;
  void add(const std::string& text, bool marker) {
    if (text.empty()) return;
    if (!segs.empty() && segs.back().marker == marker) segs.back().text += text;
    else segs.push_back({text, marker});
  }
  void text(const std::string& t) { add(t, false); }
  void mark(const std::string& t) { add(t, true); }
};

void im(Out& o, const std::string& role, const std::string& content) {
  o.mark("<|im_start|>");
  o.text(role + "\n" + content);
  o.mark("<|im_end|>");
  o.text("\n");
}

}  // namespace

ChatTemplate ChatTemplate::from_string(const std::string& t, const std::string& bos, const std::string& source) {
  ChatTemplate c;
  c.source_ = source;
  c.bos_ = bos;
  if (t.empty()) return c;
  if (has(t, "<|im_start|>")) {
    // Qwen3's template splits reasoning out of assistant turns; Qwen2/2.5's is plain ChatML.
    c.family_ = has(t, "</think>") ? ChatFamily::Qwen3 : ChatFamily::ChatML;
    if (c.family_ == ChatFamily::ChatML) {
      // Qwen2 / Qwen2.5 insert a fixed system prompt when the chat has none.
      for (const char* d : {"You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
                            "You are a helpful assistant."})
        if (has(t, (std::string("<|im_start|>system\\n") + d).c_str()) ||
            has(t, (std::string("<|im_start|>system\n") + d).c_str())) {
          c.default_system_ = d;
          break;
        }
    }
  } else if (has(t, "<|start_header_id|>") && has(t, "<|eot_id|>")) {
    c.family_ = ChatFamily::Llama3;
    c.llama_dated_ = has(t, "Cutting Knowledge Date");
    c.llama_today_ = has(t, "strftime_now");
  } else {
    c.family_ = ChatFamily::Unknown;
  }
  return c;
}

ChatTemplate ChatTemplate::from_model_dir(const std::string& dir) {
  // A GGUF file carries its template in the metadata.
  if (fs::is_regular_file(dir) && fs::path(dir).extension() == ".gguf") {
    gguf::File f = gguf::File::open(dir);
    if (!f.find("tokenizer.chat_template")) {
      ChatTemplate c;
      c.source_ = dir;
      return c;
    }
    return from_string(f.get_string("tokenizer.chat_template"), "", dir + ": tokenizer.chat_template");
  }
  const fs::path p = fs::path(dir) / "tokenizer_config.json";
  if (!fs::exists(p)) {
    ChatTemplate c;
    c.source_ = dir;
    return c;
  }
  const std::string src = p.string();
  const nlohmann::json j = read_json_file(src, "tokenizer config");
  if (!j.is_object()) throw std::runtime_error(src + ": must be a JSON object");
  std::string text;
  if (auto it = j.find("chat_template"); it != j.end() && !it->is_null()) {
    if (it->is_string()) {
      text = it->get<std::string>();
    } else if (it->is_array()) {  // [{"name": "default", "template": "..."}, ...]
      for (const auto& e : *it) {
        if (!e.is_object() || !e.contains("name") || !e.contains("template") || !e["name"].is_string() ||
            !e["template"].is_string())
          throw std::runtime_error(src + ": \"chat_template\" list entries need \"name\" and \"template\" strings");
        if (e["name"] == "default") text = e["template"];
      }
      if (text.empty()) throw std::runtime_error(src + ": \"chat_template\" list has no \"default\" entry");
    } else {
      throw std::runtime_error(src + ": \"chat_template\" must be a string or a list of named templates");
    }
  }
  ChatTemplate c = from_string(text, token_field(j, "bos_token", src), src);
  c.eos_token_ = token_field(j, "eos_token", src);
  return c;
}

std::string ChatTemplate::apply(const std::vector<ChatMessage>& msgs, bool gen) const {
  std::string out;
  for (const ChatSegment& s : render(msgs, gen)) out += s.text;
  return out;
}

std::vector<int32_t> ChatTemplate::encode(const Tokenizer& tok, const std::vector<ChatMessage>& msgs, bool gen,
                                          bool special_in_content) const {
  if (special_in_content) return tok.encode(apply(msgs, gen), Tokenizer::Special::Parse);
  std::vector<int32_t> ids;
  for (const ChatSegment& s : render(msgs, gen)) {
    const std::vector<int32_t> part =
        tok.encode(s.text, s.marker ? Tokenizer::Special::Parse : Tokenizer::Special::AsText);
    ids.insert(ids.end(), part.begin(), part.end());
  }
  return ids;
}

std::vector<ChatSegment> ChatTemplate::render(const std::vector<ChatMessage>& msgs, bool gen) const {
  if (family_ == ChatFamily::None)
    throw ChatTemplateError("the model has no chat template (no \"chat_template\" in " + source_ +
                            "/tokenizer_config.json); use /v1/completions");
  if (family_ == ChatFamily::Unknown)
    throw ChatTemplateError(source_ +
                            ": the chat template is not one this server can render (supported: ChatML / Qwen, "
                            "Llama-3); use /v1/completions");
  check_roles(msgs);
  Out out;
  if (family_ == ChatFamily::ChatML) {
    if (msgs[0].role != "system" && !default_system_.empty()) im(out, "system", default_system_);
    for (const ChatMessage& m : msgs) im(out, m.role, m.content);
    if (gen) {
      out.mark("<|im_start|>");
      out.text("assistant\n");
    }
  } else if (family_ == ChatFamily::Qwen3) {
    // Assistant turns after the last user turn keep their reasoning (the last one always gets a <think> block);
    // earlier ones are rendered with the reasoning cut off.
    int last_query = static_cast<int>(msgs.size()) - 1;
    for (int i = static_cast<int>(msgs.size()) - 1; i >= 0; --i)
      if (msgs[i].role == "user") {
        last_query = i;
        break;
      }
    for (size_t i = 0; i < msgs.size(); ++i) {
      const ChatMessage& m = msgs[i];
      if (m.role != "assistant") {
        im(out, m.role, m.content);
        continue;
      }
      std::string content = m.content, reasoning;
      if (const size_t e = content.find("</think>"); e != std::string::npos) {
        content = lstrip(content.substr(content.rfind("</think>") + 8), "\n");
        std::string before = rstrip(m.content.substr(0, e), "\n");
        if (const size_t s = before.rfind("<think>"); s != std::string::npos) before = before.substr(s + 7);
        reasoning = lstrip(before, "\n");
      }
      const bool last = i + 1 == msgs.size();
      out.mark("<|im_start|>");
      if (static_cast<int>(i) > last_query && (last || !reasoning.empty())) {
        out.text("assistant\n");
        out.mark("<think>");
        out.text("\n" + trim(reasoning, "\n") + "\n");
        out.mark("</think>");
        out.text("\n\n" + lstrip(content, "\n"));
      } else {
        out.text("assistant\n" + content);
      }
      out.mark("<|im_end|>");
      out.text("\n");
    }
    if (gen) {
      out.mark("<|im_start|>");
      out.text("assistant\n");
    }
  } else {  // Llama3
    auto turn = [&out](const std::string& role, const std::string& content) {
      out.mark("<|start_header_id|>");
      out.text(role);
      out.mark("<|end_header_id|>");
      out.text("\n\n" + trim(content));
      out.mark("<|eot_id|>");
    };
    out.mark(bos_);
    size_t first = 0;
    if (llama_dated_) {
      // 3.1+: the system turn always exists and carries the knowledge / today dates.
      std::string sys;
      if (msgs[0].role == "system") {
        sys = trim(msgs[0].content);
        first = 1;
      }
      std::string date = "26 Jul 2024";
      if (llama_today_) {
        char buf[32];
        const std::time_t now = std::time(nullptr);
        std::tm tm{};
        localtime_r(&now, &tm);
        std::strftime(buf, sizeof buf, "%d %b %Y", &tm);
        date = buf;
      }
      out.mark("<|start_header_id|>");
      out.text("system");
      out.mark("<|end_header_id|>");
      out.text("\n\nCutting Knowledge Date: December 2023\nToday Date: " + date + "\n\n" + sys);
      out.mark("<|eot_id|>");
    }
    for (size_t i = first; i < msgs.size(); ++i) turn(msgs[i].role, msgs[i].content);
    if (gen) {
      out.mark("<|start_header_id|>");
      out.text("assistant");
      out.mark("<|end_header_id|>");
      out.text("\n\n");
    }
  }
  return std::move(out.segs);
}

}  // namespace elastic
