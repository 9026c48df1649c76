#pragma once
// defines: qwen36::Error, QWEN36_CHECK
//
// Every failure that bad input can cause is an Error with one clear line of text; the CLI
// prints it and exits non-zero. Checks are real code, never asserts that vanish in Release.

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace qwen36 {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

// Prefixes an error escaping `fn` with context (e.g. the file being read).
template <typename Fn>
auto with_context(const std::string& context, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const Error& e) {
    throw Error(context + ": " + e.what());
  }
}

}  // namespace qwen36

#define QWEN36_CHECK(cond, ...)                 \
  do {                                          \
    if (!(cond)) ::qwen36::fail(__VA_ARGS__);   \
  } while (0)
