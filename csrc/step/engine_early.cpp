// dmuon/step/engine_early.cpp — work begun before step(): items made ready early are
// checked, their momentum staged and their Newton–Schulz run at once; the results are
// held until the agreed step is committed (engine_step.cpp), or dropped.
#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include "common/check.h"
#include "dist/buckets.h"
#include "step/engine_state.h"

namespace dmuon::step {

void StepEngine::begin_step(const std::vector<GroupRule>& rules, int64_t step_idx) {
  DMUON_CHECK(!step_open(), "StepEngine::begin_step(", step_name(step_idx), "): ",
              step_name(early_ ? early_->step_idx : agreed_->step_idx),
              " is still open (finish and commit it, or discard it)");
  for (const GroupRule& rule : rules) rule.validate();
  // NOTE: early results are held as NS left them; NorMuon's transform (and its state) is
  // not wired into early work yet.
  for (size_t g = 0; g < rules.size(); ++g)
    DMUON_CHECK(!rules[g].normuon.enabled, "normuon=True (Muon group ", g,
                ") is not supported with early work (the weight-ownership mode)");
  for (int p = 0; p < table_.num_params(); ++p)
    DMUON_CHECK(table_.param(p).group >= 0 && static_cast<size_t>(table_.param(p).group) < rules.size(),
                "parameter '", table_.param(p).name, "': group index ", table_.param(p).group, " but ", rules.size(),
                " group rules");
  auto early = std::make_unique<Early>();
  early->step_idx = step_idx;
  early->rules = rules;
  early->flags = ops_.allocate(DType::kInt32, std::max(1, 2 * table_.num_params()));
  ops_.fill_zero(early->flags.get());
  const size_t n = static_cast<size_t>(table_.num_items());
  early->ready.assign(n, false);
  early->staged.resize(n);
  early->result.resize(n);
  early_ = std::move(early);
}

void StepEngine::items_ready(const std::vector<int>& items, const std::vector<ParamTensors>& tensors) {
  DMUON_CHECK(early_, "StepEngine::items_ready: no step is begun (call begin_step first)");
  Early& early = *early_;
  const std::string at_step = " at " + step_name(early.step_idx);
  DMUON_CHECK(static_cast<int>(tensors.size()) == table_.num_params(), "StepEngine::items_ready: ", tensors.size(),
              " parameters' tensors for ", table_.num_params(), " parameters");
  // The ids, and the items this rank has work for: whole on it, computed by it.
  // NOTE: every id is checked before any is marked, so a refused call changes nothing.
  std::vector<int> work;
  std::vector<bool> in_call(static_cast<size_t>(table_.num_items()), false);
  for (int item : items) {
    DMUON_CHECK(item >= 0 && item < table_.num_items(), "StepEngine::items_ready: item id ", item,
                " is out of range [0, ", table_.num_items(), ")", at_step);
    const std::string name = "item '" + table_.item_name(item) + "' (id " + std::to_string(item) + ")";
    DMUON_CHECK(!early.ready[static_cast<size_t>(item)] && !in_call[static_cast<size_t>(item)],
                "StepEngine::items_ready: ", name, " was made ready twice", at_step);
    in_call[static_cast<size_t>(item)] = true;
    const Item& it = table_.item(item);
    // NOTE: such items never travel, so what is ready early changes no rank's collectives.
    DMUON_CHECK(world_ == 1 || table_.param(it.param_idx).whole_on_rank >= 0, "StepEngine::items_ready: ", name,
                " travels between ranks (its parameter is sharded or replicated); early work is for items whole on "
                "their owner (shard-exchanged buckets inside backward are issue 27's)");
    if (!computes(item, rank_)) continue;
    const ParamTensors& t = tensors[static_cast<size_t>(it.param_idx)];
    const ParamSpec& spec = table_.param(it.param_idx);
    DMUON_CHECK(t.has_grad, "StepEngine::items_ready: ", name, " has no gradient on rank ", rank_, at_step);
    const int64_t numel = table_.local_numel(it.param_idx, rank_);
    for (const auto& [b, what] : {std::make_pair(t.grad, "gradient"), std::make_pair(t.momentum, "momentum buffer")})
      DMUON_CHECK(b.dtype == spec.dtype && b.numel == numel && (numel == 0 || (b.data != nullptr && b.device == ops_.device())),
                  "StepEngine::items_ready: parameter '", spec.name, "' on rank ", rank_, ": its ", what, " holds ",
                  b.numel, " elements of ", dtype_name(b.dtype), " on ", device_name(b.device), ", expected ", numel,
                  " of ", dtype_name(spec.dtype), " on ", device_name(ops_.device()));
    work.push_back(item);
  }
  for (int item : items) early.ready[static_cast<size_t>(item)] = true;
  if (work.empty()) return;

  // Check and staging: momentum copied aside (the caller's buffer is never written before
  // the agreement), the check reads the gradient and that copy.
  std::vector<CheckPiece> pieces;
  std::vector<int> partial_of(static_cast<size_t>(table_.num_items()), -1);
  for (int item : work) {
    const Item& it = table_.item(item);
    const ParamTensors& t = tensors[static_cast<size_t>(it.param_idx)];
    const GroupRule& rule = early.rules[static_cast<size_t>(it.group)];
    const Piece& me = table_.piece(item, rank_);
    OwnedBuffer staged = ops_.allocate(it.dtype, it.numel());
    ops_.copy(piece_view(t.momentum, me, it.cols), staged.get());
    partial_of[static_cast<size_t>(item)] = static_cast<int>(pieces.size());
    pieces.push_back({piece_view(t.grad, me, it.cols), staged.get(), {rule.momentum, rule.nesterov}, it.param_idx, true});
    early.staged[static_cast<size_t>(item)] = std::move(staged);
  }
  const Partials partials = ops_.check(pieces, early.flags.get());
  // NOTE: a NaN anywhere so far closes the gate: iterates get zeros (the ops' NS never
  // sees a non-finite input), the staged momentum stays as copied, and the agreement
  // refuses the step on every rank.
  const OwnedBuffer gate = ops_.make_gate(early.flags.get());

  // NS batches: same (group, dtype, shape), in order of first appearance, under the NS
  // workspace bound.
  std::vector<std::pair<std::tuple<int, int, int64_t, int64_t>, std::vector<int>>> runs;
  for (int item : work) {
    const Item& it = table_.item(item);
    const auto key = std::make_tuple(it.group, static_cast<int>(it.dtype), it.rows, it.cols);
    auto run = std::find_if(runs.begin(), runs.end(), [&](const auto& r) { return r.first == key; });
    if (run == runs.end()) run = runs.insert(runs.end(), {key, {}});
    run->second.push_back(item);
  }
  for (const auto& [key, members] : runs) {
    const auto [group, dtype_code, rows, cols] = key;
    const DType dtype = static_cast<DType>(dtype_code);
    const GroupRule& rule = early.rules[static_cast<size_t>(group)];
    const int64_t capacity = std::min<int64_t>(
        static_cast<int64_t>(members.size()),
        ns_batch_capacity(rows, cols, dtype, rule.schedule.algorithm, options_.ns_batch_bytes,
                          [&](int64_t r, int64_t c, int64_t k, DType d, ns::Algorithm a) {
                            return ops_.ns_workspace_bytes(r, c, k, d, a);
                          }));
    const std::vector<int64_t> ones(members.size(), 1);
    for (const std::vector<int>& part : dist::split_near_equal(ones, capacity)) {
      const int64_t count = static_cast<int64_t>(part.size());
      const NsBatchDesc desc{rows, cols, count, dtype, &rule.schedule, options_.graphs};
      std::vector<LocalMatrix> matrices;
      for (size_t j = 0; j < part.size(); ++j) {
        const int item = members[static_cast<size_t>(part[j])];
        const Item& it = table_.item(item);
        const Piece& me = table_.piece(item, rank_);
        matrices.push_back({piece_view(tensors[static_cast<size_t>(it.param_idx)].grad, me, cols),
                            early.staged[static_cast<size_t>(item)].get(), {rule.momentum, rule.nesterov},
                            partial_of[static_cast<size_t>(item)], static_cast<int64_t>(j)});
      }
      OwnedBuffer held;
      ops_.orthogonalize(
          desc, [&](const NsView& iterate, bool first) {
            ops_.prepare_to_iterate(matrices, partials, desc, iterate, first, gate.get());
          },
          [&](const NsView& result) {
            // NOTE: held in the result's own element type: exact, and 16 bits on CUDA.
            if (held.get().numel != count * rows * cols || held.get().dtype != result.dtype)
              held = ops_.allocate(result.dtype, count * rows * cols);
            std::vector<WirePiece> rows_of;
            for (int64_t j = 0; j < count; ++j)
              rows_of.push_back({held.get().slice(j * rows * cols, rows * cols), j, 0, rows});
            ops_.result_to_pieces(result, desc, rows_of);
          });
      for (size_t j = 0; j < part.size(); ++j)
        early.result[static_cast<size_t>(members[static_cast<size_t>(part[j])])] =
            held.get().slice(static_cast<int64_t>(j) * rows * cols, rows * cols);
      early.held.push_back(std::move(held));
      ++early.num_batches;
      early.num_items += count;
    }
  }
}

// The agreed step's early items: staged momentum into the buffers, held results applied.
void StepEngine::commit_early(StepState& st, Early& early) {
  const auto start = Clock::now();
  std::vector<ApplyPiece> apply;
  for (int item = 0; item < table_.num_items(); ++item) {
    if (early.staged[static_cast<size_t>(item)].get().empty() && early.result[static_cast<size_t>(item)].empty())
      continue;
    const Item& it = table_.item(item);
    const ParamTensors& t = (*st.tensors)[static_cast<size_t>(it.param_idx)];
    const GroupRule& rule = (*st.rules)[static_cast<size_t>(it.group)];
    const Piece& me = table_.piece(item, rank_);
    ops_.copy(early.staged[static_cast<size_t>(item)].get(), piece_view(t.momentum, me, it.cols));
    apply.push_back({piece_view(t.param, me, it.cols), early.result[static_cast<size_t>(item)], 0, 0, it.rows,
                     item_scale(rule, item), rule.decay(), it.param_idx});
  }
  if (!apply.empty()) ops_.apply_pieces(apply, Buffer{}, st.result_flags.get());
  stats_.num_orthogonalized += early.num_items;
  stats_.num_ns_batches += early.num_batches;
  stats_.apply_s += seconds_since(start);
}

}  // namespace dmuon::step
