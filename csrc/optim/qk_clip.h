// dmuon/optim/qk_clip.h — QK-clip of MuonClip (Kimi Team, 2025, "Kimi K2: Open Agentic
// Intelligence", arXiv:2507.20534): after the optimizer step, every attention head whose
// largest pre-softmax logit S_h in the step exceeded τ gets its query and key weights
// scaled so that the logits shrink by γ_h = τ / S_h.
//
// The rule, per head h of a layer (q heads H, kv heads K, group size H / K):
//   γ_h = min(1, τ / S_h)
//   K = H (multi-head):   W_q rows of head h × √γ_h, W_k rows of head h × √γ_h
//   K < H (GQA: a k head is shared by H / K q heads):
//                         W_q rows of head h × γ_h, W_k untouched
// NOTE: the GQA rule follows Kimi K2's treatment of a key shared across heads (MLA's
// shared rotary key is left alone and the head-specific query takes all of γ_h): each
// head's logits shrink by exactly its own γ_h, and heads of the group that stayed under τ
// are not clipped with their sibling.
#pragma once

#include <cstdint>
#include <vector>

namespace dmuon::optim {

/// Per-head factors of one layer: q[h] for q head h's rows, k[g] for kv head g's rows.
struct QkClipFactors {
  std::vector<double> q, k;
  bool any() const;  ///< whether any factor differs from 1
};

/// The factors of a layer from its per-q-head max logits (length num_heads). Throws
/// dmuon::Error naming tau, num_heads, num_kv_heads or max_logits when out of range. A
/// non-finite max logit is an error naming its head (a NaN in attention is not clipped
/// away silently).
QkClipFactors qk_clip_factors(const std::vector<double>& max_logits, int64_t num_kv_heads, double tau);

/// One factor per row of rows [row_begin, row_begin + row_count) of a [heads · head_dim,
/// cols] projection weight (row r belongs to head r / head_dim): what a rank that holds
/// those rows (an FSDP2 or TP shard) multiplies them by. Throws naming the rows when they
/// exceed the heads.
std::vector<double> qk_clip_row_factors(const std::vector<double>& head_factors, int64_t head_dim, int64_t row_begin,
                                        int64_t row_count);

}  // namespace dmuon::optim
