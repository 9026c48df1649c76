// Tokenizer::from_gguf: GGUF tokenizer.ggml.* metadata → TokenizerSpec.
//
// llama.cpp's converter stores the HF vocabulary padded to the model's vocab_size: every id
// has a string and a token type (1 normal, 3 control = special added token, 4 user-defined =
// non-special added token, 5 unused = padding hole "[PAD<id>]"); merges as "left right"; the
// pre-tokenizer by name (tokenizer.ggml.pre), which pattern_for_pre turns back into the regex.
#include <string>

#include "core/error.h"
#include "format/gguf.h"
#include "text/tokenizer.h"

namespace qwen36::text {

namespace {
constexpr int64_t kTypeControl = 3, kTypeUserDefined = 4, kTypeUnused = 5;
}

Tokenizer Tokenizer::from_gguf(const GgufFile& f) {
  return with_context(f.name(), [&] {
    QWEN36_CHECK(f.has("tokenizer.ggml.model"), "no tokenizer in this GGUF file (tokenizer.ggml.model is missing)");
    const std::string_view model = f.get_str("tokenizer.ggml.model");
    QWEN36_CHECK(model == "gpt2", "tokenizer.ggml.model = \"{}\" is not supported (expected gpt2 byte-level BPE)",
                 model);
    TokenizerSpec spec;
    const auto& tokens = f.get_arr_str("tokenizer.ggml.tokens");
    std::vector<int64_t> types;
    if (f.has("tokenizer.ggml.token_type")) types = f.get_arr_int("tokenizer.ggml.token_type");
    QWEN36_CHECK(types.empty() || types.size() == tokens.size(), "tokenizer.ggml.token_type has {} entries for {} tokens",
                 types.size(), tokens.size());
    spec.tokens.reserve(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
      const int64_t type = types.empty() ? 1 : types[i];
      if (type == kTypeUnused) {
        spec.tokens.emplace_back();  // a hole: no text maps to it
        continue;
      }
      spec.tokens.emplace_back(tokens[i]);
      if (type == kTypeControl || type == kTypeUserDefined) {
        AddedToken a;
        a.id = int32_t(i);
        a.content = std::string(tokens[i]);
        a.special = type == kTypeControl;
        a.normalized = false;  // Qwen's added tokens all match the raw text
        spec.added_tokens.push_back(std::move(a));
      }
    }
    if (f.has("tokenizer.ggml.merges")) {
      for (std::string_view m : f.get_arr_str("tokenizer.ggml.merges")) {
        const size_t sp = m.find(' ');
        QWEN36_CHECK(sp != std::string_view::npos && sp > 0 && sp + 1 < m.size(),
                     "tokenizer.ggml.merges entry \"{}\" is not \"left right\"", m);
        spec.merges.emplace_back(std::string(m.substr(0, sp)), std::string(m.substr(sp + 1)));
      }
    }
    const std::string_view pre = f.has("tokenizer.ggml.pre") ? f.get_str("tokenizer.ggml.pre") : "qwen2";
    spec.pattern = pattern_for_pre(pre);
    spec.nfc = true;
    return Tokenizer(spec);
  });
}

}  // namespace qwen36::text
