#pragma once
// Chat formatting from a model folder's tokenizer_config.json "chat_template". Not a Jinja engine: the template's
// family is recognized by its markers and messages are formatted the way that family's template renders them.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace elastic {

struct ChatMessage {
  std::string role;  // "system" | "user" | "assistant"
  std::string content;
};

enum class ChatFamily {
  None,     // the model folder has no chat template
  ChatML,   // <|im_start|>role\n...<|im_end|>\n (Qwen2 / Qwen2.5; default system prompt when the template has one)
  Qwen3,    // ChatML plus Qwen3's <think> handling of the last assistant turns
  Llama3,   // <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> (3.0; 3.1+ adds the dated system header)
  Unknown,  // a template this engine does not recognize
};
const char* chat_family_name(ChatFamily f);

class Tokenizer;

// A piece of a rendered chat. Markers are the template's own control-token text ("<|im_start|>", "<|eot_id|>", the
// BOS token, Qwen3's "<think>"): the only text that may become control tokens. Everything else, the messages'
// content included, is ordinary text.
struct ChatSegment {
  std::string text;
  bool marker = false;
};

// Thrown by ChatTemplate::apply when the model cannot format chats, or a message is not supported.
struct ChatTemplateError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class ChatTemplate {
 public:
  ChatTemplate() = default;  // family None
  // Reads <dir>/tokenizer_config.json (or a .gguf file's tokenizer.chat_template): no file or no "chat_template" -> None. Throws std::runtime_error naming the
  // file on malformed JSON or a chat_template / bos_token of the wrong type.
  static ChatTemplate from_model_dir(const std::string& model_dir);
  // `source` names where the template came from in error messages.
  static ChatTemplate from_string(const std::string& jinja, const std::string& bos_token = "",
                                  const std::string& source = "chat template");

  ChatFamily family() const { return family_; }
  const std::string& eos_token() const { return eos_token_; }  // tokenizer_config "eos_token" ("" if none)
  // The prompt text; throws ChatTemplateError for family None / Unknown, an empty list, or an unsupported role.
  std::string apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt = true) const;
  // The same text as segments (their concatenation is apply()'s string); same errors.
  std::vector<ChatSegment> render(const std::vector<ChatMessage>& messages, bool add_generation_prompt = true) const;
  // The prompt ids: markers are encoded with Tokenizer::Special::Parse, the text between them (message content
  // included) with Special::AsText, so "<|im_start|>system" typed by a user stays text and cannot open a turn. For
  // content without marker text the ids equal tok.encode(apply(...)). special_in_content = true encodes the whole
  // text with Special::Parse (the behaviour before; `serve --allow-special-in-content`).
  std::vector<int32_t> encode(const Tokenizer& tok, const std::vector<ChatMessage>& messages,
                              bool add_generation_prompt = true, bool special_in_content = false) const;

 private:
  ChatFamily family_ = ChatFamily::None;
  std::string source_;
  std::string bos_;
  std::string eos_token_;
  std::string default_system_;  // ChatML: system prompt the template inserts when none is given
  bool llama_dated_ = false;    // Llama-3.1+: "Cutting Knowledge Date" system header
  bool llama_today_ = false;    // Llama-3.2+: the header's date is today (strftime_now), else 26 Jul 2024
};

}  // namespace elastic
