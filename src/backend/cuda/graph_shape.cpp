// defines: log_graph_shape, log_graph_dropped (see graph_shape.h).
#include "backend/cuda/graph_shape.h"

#include <spdlog/spdlog.h>

#include <map>
#include <vector>

namespace qwen36::cuda {

void log_graph_shape(cudaGraph_t g) {
  if (!spdlog::should_log(spdlog::level::debug)) return;
  // A diagnostic: a query that fails says so and leaves the recording alone.
  bool ok = true;
  auto check = [&](cudaError_t e) { ok = ok && e == cudaSuccess; };
  size_t n = 0, ne = 0;
  check(cudaGraphGetNodes(g, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n) check(cudaGraphGetNodes(g, nodes.data(), &n));
  std::map<int, int> by_type;
  for (cudaGraphNode_t v : nodes) {
    cudaGraphNodeType t{};
    check(cudaGraphNodeGetType(v, &t));
    ++by_type[int(t)];
  }
  check(cudaGraphGetEdges(g, nullptr, nullptr, nullptr, &ne));
  std::vector<cudaGraphNode_t> from(ne), to(ne);
  std::vector<cudaGraphEdgeData> data(ne);
  if (ne) check(cudaGraphGetEdges(g, from.data(), to.data(), data.data(), &ne));
  size_t kk = 0, prog = 0;
  for (size_t i = 0; i < ne; ++i) {
    cudaGraphNodeType a{}, b{};
    check(cudaGraphNodeGetType(from[i], &a));
    check(cudaGraphNodeGetType(to[i], &b));
    kk += a == cudaGraphNodeTypeKernel && b == cudaGraphNodeTypeKernel;
    prog += data[i].type == cudaGraphDependencyTypeProgrammatic;
  }
  if (!ok) {
    spdlog::debug("graph: its nodes could not be listed");
    return;
  }
  auto count = [&](cudaGraphNodeType t) { return by_type.count(int(t)) ? by_type[int(t)] : 0; };
  spdlog::debug("graph: {} nodes ({} kernels, {} memory allocations, {} frees, {} copies, {} memsets, {} other), "
                "{} edges, {} kernel → kernel, {} programmatic",
                n, count(cudaGraphNodeTypeKernel), count(cudaGraphNodeTypeMemAlloc), count(cudaGraphNodeTypeMemFree),
                count(cudaGraphNodeTypeMemcpy), count(cudaGraphNodeTypeMemset),
                n - count(cudaGraphNodeTypeKernel) - count(cudaGraphNodeTypeMemAlloc) - count(cudaGraphNodeTypeMemFree) -
                    count(cudaGraphNodeTypeMemcpy) - count(cudaGraphNodeTypeMemset),
                ne, kk, prog);
}

void log_graph_dropped(unsigned long long key) {
  spdlog::debug("CUDA graph {:016x}: an op needed the host while recording; this shape runs eagerly", key);
}

}  // namespace qwen36::cuda
