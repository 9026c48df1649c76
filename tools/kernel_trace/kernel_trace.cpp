// A CUDA injection library that writes every kernel's device start and end times to a CSV file:
// where a replayed decode step's time goes, kernel by kernel, with the programmatic-dependent
// launch overlap and the graph replay of a real run left in place (Nsight Compute profiles each
// kernel alone, cold; nsys is not on every machine). CUPTI's concurrent-kernel activity does not
// serialize kernels.
//
//   export CUDA_INJECTION64_PATH=/path/libqwen36_kernel_trace.so QWEN36_TRACE_OUT=trace.csv
//   qwen36 bench --backend cuda --synthetic qwen3.6-27b --type q4_k_m -p "" -n 16 -r 1
//   scripts/trace-step.py trace.csv
//
// The driver loads the library when the process first initialises CUDA and calls
// InitializeInjection; the records are written as CUPTI hands back its buffers and at exit.
// Columns: start_ns, end_ns, correlation (a graph launch's kernels share its launch's), graph_id,
// graph_node, grid, block, registers, dynamic shared memory, name (mangled).
#include <cupti.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace {

constexpr size_t kBufferBytes = size_t(8) << 20;

std::FILE* g_out = nullptr;
std::mutex g_mutex;

void check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return;
  const char* msg = nullptr;
  cuptiGetResultString(r, &msg);
  std::fprintf(stderr, "qwen36 kernel trace: %s failed: %s\n", what, msg ? msg : "unknown CUPTI error");
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(g_mutex);
  CUpti_Activity* rec = nullptr;
  while (g_out && cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
    std::fprintf(g_out, "%" PRIu64 ",%" PRIu64 ",%u,%u,%" PRIu64 ",%dx%dx%d,%dx%dx%d,%u,%d,%s\n", k->start, k->end,
                 k->correlationId, k->graphId, k->graphNodeId, k->gridX, k->gridY, k->gridZ, k->blockX, k->blockY,
                 k->blockZ, unsigned(k->registersPerThread), k->dynamicSharedMemory, k->name ? k->name : "?");
  }
  size_t dropped = 0;
  if (cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped) == CUPTI_SUCCESS && dropped > 0)
    std::fprintf(stderr, "qwen36 kernel trace: %zu records dropped\n", dropped);
  std::free(buffer);
}

void finish() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_out) std::fclose(g_out);
  g_out = nullptr;
}

}  // namespace

extern "C" int InitializeInjection() {
  const char* path = std::getenv("QWEN36_TRACE_OUT");
  if (!path || !*path) path = "kernel-trace.csv";
  g_out = std::fopen(path, "w");
  if (!g_out) {
    std::fprintf(stderr, "qwen36 kernel trace: cannot write %s\n", path);
    return 0;
  }
  std::fprintf(g_out, "start_ns,end_ns,correlation,graph_id,graph_node,grid,block,registers,dyn_smem,name\n");
  check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable(CONCURRENT_KERNEL)");
  std::atexit(finish);
  std::fprintf(stderr, "qwen36 kernel trace: writing kernel times to %s\n", path);
  return 1;
}
