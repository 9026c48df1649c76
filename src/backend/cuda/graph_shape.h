#pragma once
// defines: log_graph_shape — at debug level, what a recorded step is made of: nodes by type
// and how many kernel → kernel edges are programmatic (PDL: the next kernel may start before
// the one before it drains), so that a change which breaks that chain (a node between two
// kernels, e.g. a stream-ordered allocation) shows in the log; log_graph_dropped — at debug
// level, that a recording was dropped because an op needed the host (that shape then runs
// eagerly).

#include <cuda_runtime.h>

namespace qwen36::cuda {

void log_graph_shape(cudaGraph_t g);
void log_graph_dropped(unsigned long long key);

}  // namespace qwen36::cuda
