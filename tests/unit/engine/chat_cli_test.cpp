// `qwen36 chat` through the built binary with the built-in small model (skipped when either is
// missing): turns from stdin, the first answer equal to `run --chat`'s (both greedy), the second
// turn reading most of its prompt from the prefix cache, /clear, unknown commands, a turn that
// no longer fits the context.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/run_command.h"

namespace qwen36 {
namespace {

const std::filesystem::path kModel = std::filesystem::path(QWEN36_TEST_DATA) / ".." / ".." / "models" /
                                     "qwen36-small-code-q8_0.gguf";

// Runs `qwen36 ARGS` with `input` on stdin; stdout returned, stderr into *err.
std::string run(const std::string& args, const std::string& input, int* status, std::string* err) {
  const auto tmp = std::filesystem::temp_directory_path() / ("chat_cli_test_" + std::to_string(::getpid()));
  std::ofstream(tmp.string() + ".in") << input;
  const std::string out = test::run_command(std::string(QWEN36_BIN) + " " + args + " -t 2 <" + tmp.string() +
                                                ".in 2>" + tmp.string() + ".err",
                                            status);
  std::ifstream f(tmp.string() + ".err");
  std::stringstream ss;
  ss << f.rdbuf();
  *err = ss.str();
  std::filesystem::remove(tmp.string() + ".in");
  std::filesystem::remove(tmp.string() + ".err");
  return out;
}

// The "[N tokens ...; prompt P tokens, C from the cache]" lines: (P, C) each.
std::vector<std::pair<int, int>> prompt_stats(const std::string& err) {
  std::vector<std::pair<int, int>> out;
  const std::regex line(R"(prompt (\d+) tokens, (\d+) from the cache)");
  for (auto it = std::sregex_iterator(err.begin(), err.end(), line); it != std::sregex_iterator(); ++it)
    out.emplace_back(std::stoi((*it)[1]), std::stoi((*it)[2]));
  return out;
}

class ChatCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(QWEN36_BIN)) GTEST_SKIP() << "qwen36 binary not built";
    if (!std::filesystem::exists(kModel)) GTEST_SKIP() << "no built-in model at " << kModel;
  }
};

TEST_F(ChatCli, TurnsCacheAndCommands) {
  int status = -1;
  std::string err, run_err;
  const std::string out =
      run("chat --temp 0 -n 10", "def add(a, b):\nWrite a loop\n/bogus\n/clear\nhello \\\nthere\n/exit\nignored\n",
          &status, &err);
  ASSERT_EQ(status, 0) << out << err;
  const std::string alone = run("run --chat --temp 0 -n 10 -p 'def add(a, b):'", "", &status, &run_err);
  ASSERT_EQ(status, 0) << run_err;
  ASSERT_FALSE(alone.empty());
  EXPECT_EQ(out.substr(0, alone.size()), alone) << "the first answer is run --chat's";

  const auto stats = prompt_stats(err);
  ASSERT_EQ(stats.size(), 3u) << err;  // three turns: the line after /exit is not read
  EXPECT_EQ(stats[0].second, 0);
  EXPECT_GT(stats[1].first, stats[0].first);
  EXPECT_GE(stats[1].second, stats[0].first) << "turn 2 reads turn 1's prompt from the cache";
  EXPECT_EQ(stats[2].second, 0) << "/clear: a new conversation";
  EXPECT_LT(stats[2].first, stats[1].first);
  EXPECT_NE(err.find("unknown command /bogus"), std::string::npos) << err;
}

// /system starts a conversation with that system message, /think switches reasoning, /save
// writes the messages (a bad path is an error line, the session goes on).
TEST_F(ChatCli, SystemThinkAndSave) {
  const auto file = std::filesystem::temp_directory_path() / ("chat_cli_save_" + std::to_string(::getpid()) + ".json");
  int status = -1;
  std::string err;
  run("chat --temp 0 -n 4",
      "/system Be terse.\n/think off\nhello\n/save " + file.string() + "\n/save /no/such/dir/x.json\n/think on\nagain\n",
      &status, &err);
  ASSERT_EQ(status, 0) << err;
  std::ifstream in(file);
  const auto saved = nlohmann::json::parse(in, nullptr, false);
  std::filesystem::remove(file);
  ASSERT_TRUE(saved.is_array() && saved.size() == 3) << saved.dump() << err;
  EXPECT_EQ(saved[0]["role"], "system");
  EXPECT_EQ(saved[0]["content"], "Be terse.");
  EXPECT_EQ(saved[1]["content"], "hello");
  EXPECT_EQ(saved[2]["role"], "assistant");
  EXPECT_NE(err.find("/no/such/dir/x.json: cannot write"), std::string::npos) << err;
  const auto stats = prompt_stats(err);
  ASSERT_EQ(stats.size(), 2u) << err;
}

TEST_F(ChatCli, ATurnPastTheContextIsRefusedAndTheSessionGoesOn) {
  int status = -1;
  std::string err;
  const std::string longer(400, 'x');
  run("chat --temp 0 -n 4 -c 64", longer + "\nshort\n", &status, &err);
  ASSERT_EQ(status, 0) << err;
  EXPECT_NE(err.find("no longer fits the context"), std::string::npos) << err;
  EXPECT_EQ(prompt_stats(err).size(), 1u) << "the next turn still runs: " << err;
  run("chat --temp -1", "", &status, &err);
  EXPECT_NE(status, 0);
  EXPECT_NE(err.find("temperature"), std::string::npos) << err;
}

}  // namespace
}  // namespace qwen36
