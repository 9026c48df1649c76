// The CUDA backend's .cu files cannot include core/error.h (fmt's consteval checks do not
// compile under nvcc); they raise qwen36::Error through this function instead.
#include <string>

#include "core/error.h"

namespace qwen36::cuda {

[[noreturn]] void throw_error(const std::string& message) { throw Error(message); }

}  // namespace qwen36::cuda
