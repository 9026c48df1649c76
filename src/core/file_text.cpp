#include "core/file_text.h"

#include <fstream>
#include <sstream>

#include "core/error.h"

namespace qwen36 {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail("{}: read error", path);
  return ss.str();
}

}  // namespace qwen36
