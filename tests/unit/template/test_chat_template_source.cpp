// Where a checkpoint's chat template is found (ChatTemplate::find / from_file): a GGUF's
// metadata, tokenizer_config.json, chat_template.jinja, a file given on the command line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <unistd.h>

#include "core/error.h"
#include "format/gguf_writer.h"
#include "text/chat_template.h"

namespace qwen36 {
namespace {

namespace fs = std::filesystem;

// A template that shows which source it came from and the special tokens it was given.
std::string marked(const std::string& source) {
  return "{{ bos_token }}[" + source + "]{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}";
}

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("qwen36_template_source_" + std::to_string(::getpid()));
  TempDir() {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  void write(const std::string& name, const std::string& text) const { std::ofstream(path / name) << text; }
};

std::string rendered(const ChatTemplate& t) {
  return t.render(jinja::Json::array({{{"role", "user"}, {"content", "hi"}}}), nullptr, false, nullptr);
}

void write_gguf(const fs::path& file, const std::string* chat_template) {
  GgufWriter w(file.string());
  w.add_str("general.architecture", "qwen35");
  const std::vector<std::string> tokens = {"<s>", "a", "</s>"};
  w.add_arr_str("tokenizer.ggml.tokens", tokens);
  w.add_u32("tokenizer.ggml.bos_token_id", 0);
  w.add_u32("tokenizer.ggml.eos_token_id", 2);
  if (chat_template) w.add_str("tokenizer.chat_template", *chat_template);
  w.finish();
}

TEST(ChatTemplateSource, EachPlaceInOrder) {
  TempDir dir;
  EXPECT_FALSE(ChatTemplate::find(dir.path.string()).has_value()) << "nothing there";

  // transformers' newer layout: the template in chat_template.jinja, the tokens in the config.
  dir.write("tokenizer_config.json", R"({"bos_token": "B", "eos_token": {"content": "E"}})");
  dir.write("chat_template.jinja", marked("jinja"));
  auto t = ChatTemplate::find(dir.path.string());
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(rendered(*t), "B[jinja]hiE");

  // tokenizer_config.json's own template wins, from the directory or a file in it.
  jinja::Json cfg = {{"bos_token", "B"}, {"eos_token", "E"}, {"chat_template", marked("config")}};
  dir.write("tokenizer_config.json", cfg.dump());
  EXPECT_EQ(rendered(*ChatTemplate::find(dir.path.string())), "B[config]hiE");
  EXPECT_EQ(rendered(*ChatTemplate::find((dir.path / "tokenizer.json").string())), "B[config]hiE");

  // A GGUF's metadata wins over the folder; without a template there, the folder's.
  const std::string gguf_template = marked("gguf");
  write_gguf(dir.path / "with.gguf", &gguf_template);
  EXPECT_EQ(rendered(*ChatTemplate::find((dir.path / "with.gguf").string())), "<s>[gguf]hi</s>");
  write_gguf(dir.path / "without.gguf", nullptr);
  EXPECT_EQ(rendered(*ChatTemplate::find((dir.path / "without.gguf").string())), "B[config]hiE");

  // --chat-template-file: its text, the special tokens of the path.
  dir.write("mine.jinja", marked("file"));
  EXPECT_EQ(rendered(ChatTemplate::from_file((dir.path / "mine.jinja").string(), (dir.path / "with.gguf").string())),
            "<s>[file]hi</s>");
  EXPECT_EQ(rendered(ChatTemplate::from_file((dir.path / "mine.jinja").string(), "")), "[file]hi");

  dir.write("tokenizer_config.json", "{not json");
  EXPECT_THROW(ChatTemplate::find(dir.path.string()), Error);
  EXPECT_THROW(ChatTemplate::from_file((dir.path / "missing.jinja").string(), ""), Error);
}

}  // namespace
}  // namespace qwen36
