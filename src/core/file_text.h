#pragma once
// defines: read_file (a whole file's bytes, for the small text files a checkpoint or a user gives:
//          templates, schemas, grammars, configs)

#include <string>

namespace qwen36 {

std::string read_file(const std::string& path);  // throws Error "PATH: cannot open" / "PATH: read error"

}  // namespace qwen36
