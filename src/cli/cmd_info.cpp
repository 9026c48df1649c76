// qwen36 info FILE: what a GGUF file holds — architecture, every metadata KV (huge arrays such
// as the vocabulary summarised), every tensor with its type, shape and size, and totals.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>

#include "cli/commands.h"
#include "core/error.h"
#include "format/gguf.h"

namespace qwen36::cli {

namespace {

std::string human_bytes(uint64_t n) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(n);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", n) : fmt::format("{:.2f} {}", v, kUnits[u]);
}

std::string human_count(uint64_t n) {
  if (n >= 1000000000ull) return fmt::format("{:.2f}B", double(n) / 1e9);
  if (n >= 1000000ull) return fmt::format("{:.2f}M", double(n) / 1e6);
  if (n >= 1000ull) return fmt::format("{:.2f}K", double(n) / 1e3);
  return fmt::format("{}", n);
}

void print_info(const GgufFile& f, size_t max_items, bool show_tensors) {
  std::printf("file:          %s (%s)\n", f.name().c_str(), human_bytes(f.file_size()).c_str());
  std::printf("format:        GGUF v%u, alignment %u, data section at byte %llu\n", f.version(), f.alignment(),
              static_cast<unsigned long long>(f.data_offset()));
  const GgufValue* arch = f.find("general.architecture");
  const std::string arch_str =
      arch && arch->type == GgufType::STRING ? std::string(arch->str) : std::string("(not set)");
  std::printf("architecture:  %s\n", arch_str.c_str());
  if (const GgufValue* name = f.find("general.name"); name && name->type == GgufType::STRING)
    std::printf("name:          %s\n", std::string(name->str).c_str());

  std::printf("\nmetadata (%zu keys):\n", f.kvs().size());
  size_t key_width = 0;
  for (const auto& kv : f.kvs()) key_width = std::max(key_width, kv.key.size());
  for (const auto& kv : f.kvs()) {
    const std::string type = kv.value.is_array() ? fmt::format("{}[{}]", kv.value.type_str(), kv.value.count)
                                                 : kv.value.type_str();
    std::printf("  %-*s %-20s %s\n", int(key_width), std::string(kv.key).c_str(), type.c_str(),
                GgufFile::value_to_string(kv.value, max_items).c_str());
  }

  struct Total {
    uint64_t tensors = 0, elems = 0, bytes = 0;
  };
  std::map<std::string, Total> by_type;
  Total all;
  size_t name_width = 4;
  for (const auto& t : f.tensors()) name_width = std::max(name_width, t.name.size());
  if (show_tensors) {
    std::printf("\ntensors (%zu):\n", f.tensors().size());
    std::printf("  %-*s %-7s %-24s %-22s %s\n", int(name_width), "name", "type", "shape (torch order)", "ne (GGUF order)",
                "size");
  }
  for (const auto& t : f.tensors()) {
    const std::string type(ggml_type_name(t.ggml_type));
    const uint64_t elems = uint64_t(t.tensor.numel());
    if (show_tensors) {
      std::string shape = "[", ne = "{";
      for (int d = 0; d < t.n_dims; ++d) {
        shape += fmt::format("{}{}", d ? ", " : "", t.tensor.shape[size_t(d)]);
        ne += fmt::format("{}{}", d ? ", " : "", t.ne[size_t(d)]);
      }
      std::printf("  %-*s %-7s %-24s %-22s %s\n", int(name_width), std::string(t.name).c_str(), type.c_str(),
                  (shape + "]").c_str(), (ne + "}").c_str(), human_bytes(t.nbytes).c_str());
    }
    for (Total* tot : {&by_type[type], &all}) {
      ++tot->tensors;
      tot->elems += elems;
      tot->bytes += t.nbytes;
    }
  }

  std::printf("\ntotals by type:\n");
  for (const auto& [type, tot] : by_type) {
    std::printf("  %-7s %5llu tensors %10s params %12s  (%.3f bits/weight)\n", type.c_str(),
                static_cast<unsigned long long>(tot.tensors), human_count(tot.elems).c_str(),
                human_bytes(tot.bytes).c_str(), tot.elems ? 8.0 * double(tot.bytes) / double(tot.elems) : 0.0);
  }
  std::printf("  %-7s %5llu tensors %10s params %12s  (%.3f bits/weight)\n", "all",
              static_cast<unsigned long long>(all.tensors), human_count(all.elems).c_str(),
              human_bytes(all.bytes).c_str(), all.elems ? 8.0 * double(all.bytes) / double(all.elems) : 0.0);
}

}  // namespace

void register_info(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Print the metadata and tensors of a GGUF file");
  struct Opts {
    std::string file;
    size_t max_items = 16;
    bool no_tensors = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("file", o->file, "GGUF file")->required();
  cmd->add_option("--max-items", o->max_items, "Array elements shown before an array is summarised");
  cmd->add_flag("--no-tensors", o->no_tensors, "Only metadata and totals, no per-tensor lines");
  cmd->callback([o] {
    const GgufFile f(o->file);
    print_info(f, o->max_items, !o->no_tensors);
  });
}

}  // namespace qwen36::cli
