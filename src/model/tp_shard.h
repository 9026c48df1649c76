#pragma once
// defines: TpShard, plan_tensor_parallel, shard_config, shard_weights, column_block
//
// Megatron-style tensor parallelism for the Qwen3.5/3.6 decoder. Each rank holds:
//  - attention: a range of query heads with their q/gate rows, the kv heads they read (a kv
//    head is replicated when there are more ranks than kv heads), o_proj's matching input
//    columns;
//  - DeltaNet: a range of key heads, the value heads grouped under them (their v/z/b/a rows,
//    conv channels, A_log and dt_bias), out_proj's matching input columns;
//  - MLP, every routed expert and the shared expert: a range of the intermediate dimension
//    (gate/up rows, down input columns); or with expert parallelism a range of whole routed
//    experts (the router still scores all of them; a rank computes the chosen ones it holds,
//    Backend::moe_local_ids, and the all-reduce after the MoE block sums the ranks' shares);
//  - replicated: norms, embedding, lm_head, MoE router, shared-expert gate, MTP fc.
// A rank's model is the ordinary Model with shard_config's head counts and sizes; the output
// of each row-parallel projection (o_proj, out_proj, down) is then a partial sum, completed
// by an all-reduce before the residual add (Model::set_comm).

#include <span>
#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace qwen36 {

// Rank `rank`'s ranges, [first, first + count) of each split dimension of the full model.
struct TpShard {
  int rank = 0, ranks = 1;
  int64_t q_head0 = 0, q_heads = 0;    // attention query heads
  int64_t kv_head0 = 0, kv_heads = 0;  // attention kv heads
  int64_t k_head0 = 0, k_heads = 0;    // DeltaNet key heads (value heads: Hv/Hk per key head)
  int64_t ffn0 = 0, ffn = 0;           // dense MLP intermediate
  int64_t moe0 = 0, moe = 0;           // every routed expert's intermediate
  int64_t expert0 = 0, experts = 0;    // expert parallelism: the routed experts held whole (0: all, split by moe)
  int64_t shared0 = 0, shared = 0;     // shared expert intermediate
};

// Splits `c` over `ranks` ranks. ratios (--tensor-split, one positive weight per rank; empty:
// even) apportion each dimension in whole units — kv heads with their query heads, key heads
// with their value heads, and intermediate columns in multiples of `col_block` (the elements
// per quantization block of the column-split matrices, 1 for plain dtypes) — rank r ending at
// unit round(units · (w_0 + … + w_r) / Σw). An even split must divide exactly; when there are
// more ranks than kv heads (even split only) each kv head is replicated over ranks/kv ranks.
// expert_parallel: the routed experts are apportioned whole (as heads are), not by columns.
// Throws a one-line Error naming the dimension that cannot be split.
std::vector<TpShard> plan_tensor_parallel(const ModelConfig& c, int ranks, std::span<const double> ratios = {},
                                          int64_t col_block = 1, bool expert_parallel = false);

// The config of one rank's model: head counts and intermediate sizes of its shard.
ModelConfig shard_config(const ModelConfig& c, const TpShard& s);

// Rank s's weights from the full host weights `w`: views where the shard is one contiguous
// range of rows, copies (in the returned storage) where it is several ranges or a range of
// columns. Column ranges of a quantized matrix must be whole blocks (an Error says which
// tensor is not). The result shares w's storage.
ModelWeights shard_weights(const ModelWeights& w, const TpShard& s);

// The largest quantization block (in elements) among w's column-split matrices (o_proj,
// out_proj, down projections): plan_tensor_parallel's col_block.
int64_t column_block(const ModelWeights& w);

}  // namespace qwen36
