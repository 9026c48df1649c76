#pragma once
// defines: MappedFile (read-only memory map of a whole file)

#include <cstddef>
#include <string>

namespace qwen36 {

class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // throws Error naming the path on failure
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace qwen36
