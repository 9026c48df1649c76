// qwen36 tokenize / detokenize: text file <-> token ids (.i32 = int32 little-endian, no header).
// These are the commands the golden tests and humans use to check the tokenizer against
// Hugging Face, so they print nothing but the result.
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/error.h"
#include "core/file_text.h"

#ifdef QWEN36_HAVE_PCRE2
#include "format/gguf.h"
#include "text/tokenizer.h"
#endif

namespace qwen36::cli {

namespace {

[[maybe_unused]] void write_ids(const std::string& path, const std::vector<int32_t>& ids) {
  std::string bytes;
  bytes.reserve(ids.size() * 4);
  for (int32_t id : ids) {
    const auto u = static_cast<uint32_t>(id);
    for (int shift = 0; shift < 32; shift += 8) bytes += static_cast<char>((u >> shift) & 0xFF);
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail("{}: cannot create", path);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) fail("{}: write error", path);
}

[[maybe_unused]] std::vector<int32_t> read_ids(const std::string& path) {
  const std::string bytes = read_file(path);
  if (bytes.size() % 4 != 0)
    fail("{}: size {} is not a multiple of 4 (expected int32 little-endian ids)", path, bytes.size());
  std::vector<int32_t> ids(bytes.size() / 4);
  for (size_t i = 0; i < ids.size(); ++i) {
    uint32_t u = 0;
    for (int k = 0; k < 4; ++k)
      u |= static_cast<uint32_t>(static_cast<unsigned char>(bytes[i * 4 + static_cast<size_t>(k)])) << (8 * k);
    ids[i] = static_cast<int32_t>(u);
  }
  return ids;
}

#ifdef QWEN36_HAVE_PCRE2
// A .gguf model file carries its own tokenizer (tokenizer.ggml.* metadata).
text::Tokenizer load_tokenizer(const std::string& path) {
  if (path.ends_with(".gguf")) return text::Tokenizer::from_gguf(GgufFile(path));
  return text::Tokenizer::from_file(path);
}
#else
[[noreturn]] void no_tokenizer() {
  fail("this qwen36 was built without PCRE2, so it has no tokenizer (install libpcre2-dev and rebuild)");
}
#endif

}  // namespace

void register_tokenize(CLI::App& app) {
  struct Options {
    std::string tokenizer, in, out;
  };
  auto tok_opts = std::make_shared<Options>();
  CLI::App* tok = app.add_subcommand("tokenize", "Encode a UTF-8 text file to token ids (int32 LE)");
  tok->add_option("--tokenizer", tok_opts->tokenizer, "tokenizer.json, a model directory or a .gguf model")->required();
  tok->add_option("--in", tok_opts->in, "UTF-8 text file")->required();
  tok->add_option("--out", tok_opts->out, "output ids file (.i32)")->required();
  tok->callback([tok_opts] {
#ifdef QWEN36_HAVE_PCRE2
    const text::Tokenizer t = load_tokenizer(tok_opts->tokenizer);
    const std::string input = read_file(tok_opts->in);
    const std::vector<int32_t> ids =
        with_context(tok_opts->in, [&] { return t.encode(input, /*parse_special=*/true); });
    write_ids(tok_opts->out, ids);
#else
    no_tokenizer();
#endif
  });

  auto detok_opts = std::make_shared<Options>();
  CLI::App* detok = app.add_subcommand("detokenize", "Decode token ids (int32 LE) to text on stdout");
  detok->add_option("--tokenizer", detok_opts->tokenizer, "tokenizer.json, a model directory or a .gguf model")->required();
  detok->add_option("--in", detok_opts->in, "ids file (.i32)")->required();
  detok->callback([detok_opts] {
#ifdef QWEN36_HAVE_PCRE2
    const text::Tokenizer t = load_tokenizer(detok_opts->tokenizer);
    const std::vector<int32_t> ids = read_ids(detok_opts->in);
    const std::string textout = with_context(detok_opts->in, [&] { return t.decode(ids); });
    if (std::fwrite(textout.data(), 1, textout.size(), stdout) != textout.size() || std::fflush(stdout) != 0)
      fail("cannot write to stdout");
#else
    no_tokenizer();
#endif
  });
}

}  // namespace qwen36::cli
