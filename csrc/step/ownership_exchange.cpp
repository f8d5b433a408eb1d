// dmuon/step/ownership_exchange.cpp — buckets reduced to their owners, weights published
// (see ownership_exchange.h).
#include "step/ownership_exchange.h"

#include <algorithm>
#include <utility>

#include "common/check.h"

namespace dmuon::step {

// One issued bucket on its way to the owners: level 0 in the row, level 1 down the column.
struct OwnershipExchange::Flight {
  size_t k = 0;
  OwnedBuffer recv0, partial, recv1;  // level 0's pieces of this rank's chunk, their sum, level 1's pieces
  std::unique_ptr<Pending> level0, level1;
  bool level1_issued = false;
};

OwnershipExchange::~OwnershipExchange() = default;

OwnershipExchange::OwnershipExchange(std::vector<OwnedParam> params, OwnershipMesh mesh, int rank,
                                     ExchangeTransports transports, DeviceOps& grad_ops, DeviceOps& ops,
                                     ExchangeOptions options)
    : params_(std::move(params)),
      mesh_(std::move(mesh)),
      rank_(rank),
      transports_(transports),
      grad_ops_(grad_ops),
      ops_(ops),
      options_(options),
      start_(std::chrono::steady_clock::now()) {
  mesh_.validate();
  DMUON_CHECK(rank_ >= 0 && rank_ < mesh_.world_size(), "OwnershipExchange: rank ", rank_, " outside a mesh of ",
              mesh_.world_size());
  // NOTE: an axis of several ranks needs its transport, whose ranks are the coordinates.
  const int shard = mesh_.shard_of[static_cast<size_t>(rank_)], replica = mesh_.replica_of[static_cast<size_t>(rank_)];
  auto check_axis = [&](Transport* t, int size, int coordinate, const char* name) {
    DMUON_CHECK(size == 1 || (t != nullptr && t->world_size() == size && t->rank() == coordinate),
                "OwnershipExchange: the ", name, " transport must span the ", size, " ranks of this rank's ", name,
                " with rank ", coordinate, " here, got ", t == nullptr ? "none" : std::to_string(t->world_size()) +
                " ranks, rank " + std::to_string(t->rank()));
  };
  check_axis(transports_.row, mesh_.shards, shard, "row");
  check_axis(transports_.column, mesh_.replicas, replica, "column");
  check_axis(transports_.column_reduce, mesh_.replicas, replica, "column");
  DMUON_CHECK(options_.reduce_dtype != DType::kInt32 && options_.reduce_dtype != DType::kFloat64,
              "reduce_dtype must be float32, bfloat16 or float16, got ", dtype_name(options_.reduce_dtype));
  std::vector<int64_t> numel;
  std::vector<int> owners;
  for (const OwnedParam& p : params_) {
    DMUON_CHECK(p.numel >= 0 && p.dtype != DType::kInt32, "OwnershipExchange: parameter '", p.name, "' has ", p.numel,
                " elements of ", dtype_name(p.dtype));
    numel.push_back(p.numel);
    owners.push_back(p.owner);
  }
  // NOTE: gradients arrive in roughly reverse registration order (backward runs the last
  // layer first), so buckets are cut from the reversed parameter list.
  std::vector<int> order(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) order[i] = static_cast<int>(params_.size() - 1 - i);
  buckets_ = plan_owned_buckets(order, numel, owners, mesh_, options_.bucket_bytes, dtype_size(options_.reduce_dtype));
  bucket_of_.assign(params_.size(), 0);
  slot_of_.assign(params_.size(), 0);
  for (size_t k = 0; k < buckets_.size(); ++k)
    for (size_t s = 0; s < buckets_[k].params.size(); ++s) {
      bucket_of_[static_cast<size_t>(buckets_[k].params[s])] = static_cast<int>(k);
      slot_of_[static_cast<size_t>(buckets_[k].params[s])] = static_cast<int>(s);
    }
  buffer_.resize(buckets_.size());
  contributed_.assign(params_.size(), false);
  arrived_.assign(params_.size(), false);
  issued_.assign(buckets_.size(), false);
  reduced_.resize(params_.size());
  momentum_.resize(params_.size());
}

void OwnershipExchange::record(const std::string& what, int64_t index) {
  const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  timeline_.push_back({what, index, t});
}

// ----------------------------------------------------------------------------- backward
void OwnershipExchange::grad_ready(int param, const Buffer& grad, const Buffer& momentum, bool sync) {
  DMUON_CHECK(param >= 0 && param < num_params(), "OwnershipExchange::grad_ready: parameter index ", param,
              " outside [0, ", num_params(), ")");
  const size_t p = static_cast<size_t>(param);
  const OwnedParam& spec = params_[p];
  DMUON_CHECK(grad.numel == spec.numel, "the gradient of '", spec.name, "' has ", grad.numel, " elements, expected ",
              spec.numel);
  // NOTE: the timeline holds one window: from its first gradient to the step.
  if (!window_open_) {
    timeline_.clear();
    window_open_ = true;
  }
  record("grad_ready", param);
  const size_t k = static_cast<size_t>(bucket_of_[p]);
  DMUON_CHECK(!issued_[k], "the gradient of '", spec.name, "' arrived after its bucket was reduced in this step: "
              "call optimizer.step() after the backward that synchronizes gradients, and mark gradient "
              "accumulation micro-batches with set_requires_gradient_sync(False)");
  if (spec.numel > 0) {
    const OwnedBucket& bucket = buckets_[k];
    if (buffer_[k].get().empty()) {
      buffer_[k] = grad_ops_.allocate(options_.reduce_dtype, bucket.numel);
      grad_ops_.fill_zero(buffer_[k].get());
    }
    const Buffer slot = buffer_[k].get().slice(bucket.offset[static_cast<size_t>(slot_of_[p])], spec.numel,
                                               "a gradient's bucket slot");
    grad_ops_.sum_into(grad, 1, spec.numel, slot, 1.0, contributed_[p]);
  }
  contributed_[p] = true;
  arrived_[p] = true;
  if (!momentum.empty()) momentum_[p] = momentum;
  if (!sync) return;
  // Complete buckets leave strictly in bucket order (the same on every rank).
  while (next_to_issue_ < buckets_.size()) {
    const std::vector<int>& next = buckets_[next_to_issue_].params;
    if (!std::all_of(next.begin(), next.end(), [&](int j) { return arrived_[static_cast<size_t>(j)]; })) break;
    issue(next_to_issue_++);
  }
}

void OwnershipExchange::end_backward(bool sync) {
  record("flush", -1);
  if (sync) issue_rest();
  std::fill(arrived_.begin(), arrived_.end(), false);
}

void OwnershipExchange::issue_rest() {
  while (next_to_issue_ < buckets_.size()) issue(next_to_issue_++);
}

// Level 0: this rank's whole buffer in its row, chunk s to the rank at shard s.
void OwnershipExchange::issue(size_t k) {
  const OwnedBucket& bucket = buckets_[k];
  if (buffer_[k].get().empty()) {
    buffer_[k] = grad_ops_.allocate(options_.reduce_dtype, bucket.numel);
    grad_ops_.fill_zero(buffer_[k].get());
  }
  issued_[k] = true;
  auto f = std::make_unique<Flight>();
  f->k = k;
  const int shards = mesh_.shards;
  if (shards > 1 && bucket.numel > 0) {
    const int64_t chunk = bucket.shard_counts[static_cast<size_t>(mesh_.shard_of[static_cast<size_t>(rank_)])];
    f->recv0 = grad_ops_.allocate(options_.reduce_dtype, chunk * shards);
    f->level0 = transports_.row->all_to_all(buffer_[k].get(), bucket.shard_counts, f->recv0.get(),
                                            std::vector<int64_t>(static_cast<size_t>(shards), chunk),
                                            "all_to_all of bucket " + std::to_string(k) +
                                                "'s gradients to their owners along the row (" +
                                                step_name(step_idx_) + ")");
  }
  record("reduce_issued", static_cast<int64_t>(k));
  flights_.push_back(std::move(f));
}

void OwnershipExchange::progress(bool wait, const std::function<void(int, const std::vector<int>&)>& on_final) {
  while (next_to_finish_ < flights_.size()) {
    Flight& f = *flights_[next_to_finish_];
    const bool due = flights_.size() - next_to_finish_ > static_cast<size_t>(std::max(0, options_.slack));
    if (!advance(f, wait || due)) return;
    ++next_to_finish_;
    // The owner's parameters of the bucket that this rank contributed to (finish_bucket's).
    std::vector<int> mine;
    for (int p : buckets_[f.k].params)
      if (!reduced_[static_cast<size_t>(p)].get().empty()) mine.push_back(p);
    record("ns_begin", static_cast<int64_t>(f.k));
    if (on_final) on_final(static_cast<int>(f.k), mine);
    record("ns_end", static_cast<int64_t>(f.k));
    // NOTE: the pieces are summed: free them (stream-ordered on the ops that made them).
    f.recv1 = OwnedBuffer{};
    f.partial = OwnedBuffer{};
  }
}

// Level 0's arrival and sum, level 1 issued and arrived, the owner's gradients summed:
// false where a collective is not ready and `wait` is false.
bool OwnershipExchange::advance(Flight& f, bool wait) {
  const OwnedBucket& bucket = buckets_[f.k];
  const int shards = mesh_.shards, replicas = mesh_.replicas;
  const size_t s = static_cast<size_t>(mesh_.shard_of[static_cast<size_t>(rank_)]);
  const size_t r = static_cast<size_t>(mesh_.replica_of[static_cast<size_t>(rank_)]);
  if (f.level0) {
    if (!wait && !f.level0->ready()) return false;
    f.level0->wait();
    f.level0.reset();
  }
  const int64_t chunk = shards > 1 ? bucket.shard_counts[s] : bucket.numel;
  if (replicas > 1 && !f.level1_issued) {
    // This rank's chunk: the sum of its pieces from the row (the buffer itself in a column).
    Buffer partial = buffer_[f.k].get();
    if (shards > 1 && bucket.numel > 0) {
      f.partial = ops_.allocate(options_.reduce_dtype, chunk);
      ops_.sum_into(f.recv0.get(), shards, chunk, f.partial.get(), 1.0, false);
      partial = f.partial.get();
    }
    f.level1_issued = true;
    if (bucket.numel > 0) {
      const int64_t mine = bucket.replica_counts[s][r];
      f.recv1 = ops_.allocate(options_.reduce_dtype, mine * replicas);
      f.level1 = transports_.column_reduce->all_to_all(
          partial, bucket.replica_counts[s], f.recv1.get(), std::vector<int64_t>(static_cast<size_t>(replicas), mine),
          "all_to_all of bucket " + std::to_string(f.k) + "'s gradients to their owners down the column (" +
              step_name(step_idx_) + ")");
    }
  }
  if (f.level1) {
    if (!wait && !f.level1->ready()) return false;
    f.level1->wait();
    f.level1.reset();
  }
  if (bucket.numel == 0) return true;
  if (replicas > 1) finish_bucket(f, f.recv1.get(), replicas, bucket.replica_counts[s][r]);
  else if (shards > 1) finish_bucket(f, f.recv0.get(), shards, chunk);
  else finish_bucket(f, buffer_[f.k].get(), 1, bucket.numel);
  return true;
}

// The owner's parameters of bucket f.k: scale · Σ of their pieces over the last level's
// parts, in the parameter's dtype. NOTE: the mean over the world, as data parallelism's.
void OwnershipExchange::finish_bucket(Flight& f, const Buffer& src, int64_t num_parts, int64_t part_stride) {
  const OwnedBucket& bucket = buckets_[f.k];
  const double scale = 1.0 / static_cast<double>(mesh_.world_size());
  for (size_t k = 0; k < bucket.params.size(); ++k) {
    const size_t p = static_cast<size_t>(bucket.params[k]);
    const OwnedParam& spec = params_[p];
    if (spec.owner != rank_ || spec.numel == 0 || !contributed_[p]) continue;
    reduced_[p] = ops_.allocate(spec.dtype, spec.numel);
    const int64_t span = (num_parts - 1) * part_stride + spec.numel;
    ops_.sum_into(src.slice(bucket.final_offset[k], span, "a parameter's pieces"), num_parts, part_stride,
                  reduced_[p].get(), scale, false);
  }
}

Buffer OwnershipExchange::reduced_grad(int param) const { return reduced_.at(static_cast<size_t>(param)).get(); }

void OwnershipExchange::hand_to(StepEngine& engine, int first_param, const std::vector<int>& params) const {
  const ItemTable& table = engine.items();
  DMUON_CHECK(first_param >= 0 && first_param + num_params() <= table.num_params(), "OwnershipExchange::hand_to: ",
              num_params(), " owned parameters from engine parameter ", first_param, " of ", table.num_params());
  std::vector<ParamTensors> tensors(static_cast<size_t>(table.num_params()));
  std::vector<int> items;
  for (int p : params) {
    const int e = first_param + p;
    tensors[static_cast<size_t>(e)] = {Buffer{}, reduced_grad(p), momentum(p), true, Buffer{}};
    const auto [first, count] = table.items_of(e);
    for (int item = first; item < first + count; ++item) items.push_back(item);
  }
  if (!items.empty()) engine.items_ready(items, tensors);
}

void OwnershipExchange::end_window(int64_t step_idx) {
  std::fill(contributed_.begin(), contributed_.end(), false);
  std::fill(arrived_.begin(), arrived_.end(), false);
  std::fill(issued_.begin(), issued_.end(), false);
  next_to_issue_ = next_to_finish_ = 0;
  flights_.clear();
  for (auto& b : buffer_) b = OwnedBuffer{};
  for (auto& b : reduced_) b = OwnedBuffer{};
  std::fill(momentum_.begin(), momentum_.end(), Buffer{});
  window_open_ = false;
  step_idx_ = step_idx + 1;
}

// ----------------------------------------------------------------------------- publish
std::unique_ptr<Pending> OwnershipExchange::publish(int param, const Buffer& weight, const std::string& what) {
  DMUON_CHECK(param >= 0 && param < num_params(), "OwnershipExchange::publish: parameter index ", param,
              " outside [0, ", num_params(), ")");
  const OwnedParam& spec = params_[static_cast<size_t>(param)];
  DMUON_CHECK(weight.numel == spec.numel, "publish: the buffer of '", spec.name, "' has ", weight.numel,
              " elements, expected ", spec.numel);
  const size_t owner = static_cast<size_t>(spec.owner), me = static_cast<size_t>(rank_);
  if (mesh_.replicas > 1 && mesh_.shard_of[me] == mesh_.shard_of[owner])
    transports_.column->broadcast_buffer(weight, mesh_.replica_of[owner], what + " (across replicas)")->wait();
  if (mesh_.shards > 1) return transports_.row->broadcast_buffer(weight, mesh_.shard_of[owner], what);
  return nullptr;
}

}  // namespace dmuon::step
