#pragma once
// defines: ScopedEnv (sets an environment variable for a scope, restoring what it was)
//
// The engine reads switches such as QWEN36_MOE_STREAM or QWEN36_NO_TILE from the environment;
// a test that sets one must leave the next test the environment it found, also when an
// assertion returns early.

#include <cstdlib>
#include <string>

namespace qwen36 {

class ScopedEnv {
 public:
  // value nullptr: unset for the scope.
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* v = std::getenv(name)) old_ = v, had_ = true;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_.c_str(), old_.c_str(), 1);
    else
      unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_, old_;
  bool had_ = false;
};

}  // namespace qwen36
