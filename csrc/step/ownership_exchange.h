// dmuon/step/ownership_exchange.h — the weight-ownership mode's data movement over the step
// transport: gradients reduced to their owners in buckets during backward, weights
// published from their owners in forward (docs/design/step_engine.md, "Weight ownership").
//
//   grad_ready   a rank's whole local gradient of an owned parameter added into its
//                bucket's buffer (reduce dtype; gradient accumulation adds over a window);
//                with sync, complete buckets leave at once, in bucket order: level 0, the
//                all_to_all of the buffer in this rank's row of the mesh
//   progress     buckets in flight, in bucket order: those with `slack` newer buckets issued
//                behind them waited for, then as far as the collectives are ready (a poll:
//                no host wait), or all of them (wait): level 0 summed on arrival,
//                level 1 (the all_to_all down the column to the owner) issued and summed;
//                the owner's parameters of a finished bucket then hold their reduced
//                gradient (the mean over the world, in the parameter's dtype) and are
//                handed on: hand_to() gives them to the step engine's early work
//   publish      the owner's weight into every rank's buffer: down the owner's column
//                (waited), then along every row (returned in flight)
// No thread: the caller polls at each backward hook and waits for the rest in the step; a
// bucket's reduction has `slack` buckets of backward's time to arrive (on a GPU a wait is
// the side stream's, never the host's).
// Every rank issues the same collectives in the same order on each transport: level 0 and
// publishes from backward's and forward's hooks (the same on every rank), level 1 in
// bucket order on a transport of its own (its issue times may differ between ranks).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "step/device_ops.h"
#include "step/engine.h"
#include "step/owned_buckets.h"
#include "step/transport.h"

namespace dmuon::step {

/// One owned parameter as every rank sees it.
struct OwnedParam {
  std::string name;
  int64_t numel = 0;
  DType dtype = DType::kFloat32;  ///< of the parameter (its reduced gradient's)
  int owner = 0;                  ///< world rank
};

/// The transports of this rank's mesh axes (null where the axis has one rank).
struct ExchangeTransports {
  Transport* row = nullptr;     ///< this rank's row (level 0 of the reduction, publish along rows)
  Transport* column = nullptr;  ///< this rank's column, for publishes across replicas
  /// The same column, for the reduction's level 1 alone (its collectives keep their own order).
  Transport* column_reduce = nullptr;
};

struct ExchangeOptions {
  int64_t bucket_bytes = int64_t{25} << 20;  ///< reduce-dtype bytes per bucket (≤ 0: one bucket)
  DType reduce_dtype = DType::kFloat32;      ///< the buckets' and the wire's element type
  /// Buckets issued after one before progress() waits for it. NOTE: a poll alone finds a
  /// reduction complete only if the peers issued it before this rank's next hook; a rank a
  /// few milliseconds ahead would otherwise run its Newton–Schulz after backward.
  int slack = 1;
};

/// One moment of the exchange (seconds since it was made), for overlap analysis.
struct ExchangeEvent {
  std::string what;  ///< "grad_ready" | "reduce_issued" | "ns_begin" | "ns_end" | "flush" | "finish"
  int64_t index;     ///< parameter (grad_ready) or bucket (−1: none)
  double seconds;
};

class OwnershipExchange {
 public:
  /// `grad_ops`: the passes over the caller's gradients (the stream backward runs on);
  /// `ops`: the reductions' and reduced gradients' (the step engine's). Buckets are cut from
  /// the parameters in reverse order (backward's). Both ops and the transports outlive it.
  OwnershipExchange(std::vector<OwnedParam> params, OwnershipMesh mesh, int rank, ExchangeTransports transports,
                    DeviceOps& grad_ops, DeviceOps& ops, ExchangeOptions options);
  ~OwnershipExchange();
  OwnershipExchange(const OwnershipExchange&) = delete;
  OwnershipExchange& operator=(const OwnershipExchange&) = delete;

  // ---- backward
  /// This rank's whole local gradient of parameter `param` (any floating dtype, its numel)
  /// into its bucket; `momentum`: the owner's buffer its early work reads (kept as given,
  /// empty elsewhere). sync=false accumulates only (gradient accumulation); sync=true also
  /// issues the complete buckets, in bucket order. Throws when its bucket already left.
  void grad_ready(int param, const Buffer& grad, const Buffer& momentum, bool sync);
  /// The end of a backward pass: with sync, every bucket not yet issued is (a missing
  /// gradient counts as zeros).
  void end_backward(bool sync);
  /// Issues every bucket not yet issued (the step after a backward without sync).
  void issue_rest();
  /// Buckets in flight, in order: those with options.slack newer buckets issued waited for,
  /// then as far as their collectives are ready, or (wait) all of them. For each finished bucket, on_final(bucket, the parameters in it this rank owns
  /// and had a gradient of, of at least one element) once their reduced gradients are
  /// enqueued.
  void progress(bool wait, const std::function<void(int bucket, const std::vector<int>& params)>& on_final = {});

  // ---- the step
  /// Whether this rank added a gradient of `param` in this window.
  bool contributed(int param) const { return contributed_.at(static_cast<size_t>(param)); }
  /// The owner's reduced gradient of `param` (empty before its bucket finished, or elsewhere).
  Buffer reduced_grad(int param) const;
  /// The momentum buffer grad_ready was given for `param` (empty when none).
  Buffer momentum(int param) const { return momentum_.at(static_cast<size_t>(param)); }
  /// Hands `params` (finished, this rank's) to `engine`'s early work (an open step), whose
  /// parameters [first_param, first_param + num_params()) are the owned ones in order.
  void hand_to(StepEngine& engine, int first_param, const std::vector<int>& params) const;
  /// Closes the window of step `step_idx` (the next one is named in errors): contributions,
  /// buckets and reduced gradients are dropped. The caller finished every bucket first
  /// (progress(true)), or its step failed.
  void end_window(int64_t step_idx);
  /// The step whose window is open (or opens next): named in the collectives' errors.
  int64_t step_idx() const { return step_idx_; }

  // ---- publish
  /// The owner's `weight` (every rank's buffer of param's numel and dtype) on every rank:
  /// the column broadcast waited, the row's returned in flight (null when nothing is).
  std::unique_ptr<Pending> publish(int param, const Buffer& weight, const std::string& what);

  int num_params() const { return static_cast<int>(params_.size()); }
  const OwnedParam& param(int p) const { return params_.at(static_cast<size_t>(p)); }
  const OwnershipMesh& mesh() const { return mesh_; }
  int rank() const { return rank_; }
  const std::vector<OwnedBucket>& buckets() const { return buckets_; }
  /// The events of the current (or last) window.
  const std::vector<ExchangeEvent>& timeline() const { return timeline_; }
  void clear_timeline() { timeline_.clear(); }
  void record(const std::string& what, int64_t index);

 private:
  struct Flight;
  void issue(size_t k);
  bool advance(Flight& f, bool wait);
  void finish_bucket(Flight& f, const Buffer& src, int64_t num_parts, int64_t part_stride);

  std::vector<OwnedParam> params_;
  OwnershipMesh mesh_;
  int rank_ = 0;
  ExchangeTransports transports_;
  DeviceOps& grad_ops_;
  DeviceOps& ops_;
  ExchangeOptions options_;
  std::vector<OwnedBucket> buckets_;
  std::vector<int> bucket_of_, slot_of_;  // [param] its bucket and position there
  // The window (until end_window).
  std::vector<OwnedBuffer> buffer_;        // [bucket] this rank's gradients (reduce dtype)
  std::vector<bool> contributed_;          // [param] this window
  std::vector<bool> arrived_;              // [param] this backward pass
  std::vector<bool> issued_;               // [bucket] this window
  size_t next_to_issue_ = 0;
  std::vector<std::unique_ptr<Flight>> flights_;  // issued buckets, in order
  size_t next_to_finish_ = 0;
  std::vector<OwnedBuffer> reduced_;       // [param] the owner's reduced gradient
  std::vector<Buffer> momentum_;           // [param] as given
  bool window_open_ = false;
  int64_t step_idx_ = 1;
  std::chrono::steady_clock::time_point start_;
  std::vector<ExchangeEvent> timeline_;
};

}  // namespace dmuon::step
