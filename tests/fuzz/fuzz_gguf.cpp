// libFuzzer target for the GGUF reader: any input must either throw qwen36::Error or give a
// file whose every view lies inside the input (exercise_gguf aborts otherwise).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "format/gguf.h"
#include "gguf_test_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Copy to an exactly-sized heap block so ASan flags any read past the end.
  std::vector<std::byte> bytes(size);
  if (size) std::memcpy(bytes.data(), data, size);
  try {
    const qwen36::GgufFile f(bytes.data(), bytes.size(), "fuzz");
    volatile uint64_t sink = qwen36::test::exercise_gguf(f);
    (void)sink;
  } catch (const qwen36::Error&) {
  }
  return 0;
}
