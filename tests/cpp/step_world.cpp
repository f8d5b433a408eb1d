// tests/cpp/step_world.cpp — the test world of the step engine and its fp64 reference.
#include "step_world.h"

#include <cmath>
#include <stdexcept>

#include "ns/cpu/cpu_backend.h"

namespace dmuon::testing {
namespace {

using step::DType;
using step::cpu::dispatch_float;
using step::cpu::Elem;

// ATen's lerp in fp64 (the reference's arithmetic).
double lerp(double self, double end, double weight) {
  return std::abs(weight) < 0.5 ? self + weight * (end - self) : end - (end - self) * (1.0 - weight);
}

}  // namespace

HostTensor::HostTensor(const std::vector<double>& values, DType dtype)
    : dtype_(dtype), numel_(static_cast<int64_t>(values.size())) {
  bytes_.resize(static_cast<size_t>(numel_ * step::dtype_size(dtype)));
  for (int64_t i = 0; i < numel_; ++i) set(i, values[static_cast<size_t>(i)]);
}

void HostTensor::set(int64_t i, double value) {
  dispatch_float(dtype_, [&](auto zero) {
    using T = decltype(zero);
    reinterpret_cast<T*>(bytes_.data())[i] = Elem<T>::template store<double>(value);
  });
}

std::vector<double> HostTensor::values() const {
  std::vector<double> out(static_cast<size_t>(numel_));
  dispatch_float(dtype_, [&](auto zero) {
    using T = decltype(zero);
    for (int64_t i = 0; i < numel_; ++i)
      out[static_cast<size_t>(i)] = static_cast<double>(Elem<T>::load(reinterpret_cast<const T*>(bytes_.data())[i]));
  });
  return out;
}

step::Buffer HostTensor::buffer() const {
  return step::Buffer{numel_ == 0 ? nullptr : bytes_.data(), dtype_, numel_, step::Device{}};
}

std::vector<double> rounded(const std::vector<double>& values, DType dtype) { return HostTensor(values, dtype).values(); }

std::vector<step::ParamTensors> RankTensors::views() const {
  std::vector<step::ParamTensors> out;
  for (size_t p = 0; p < param.size(); ++p)
    out.push_back({param[p].buffer(), grad[p].buffer(), momentum[p].buffer(), has_grad[p], row_state[p].buffer()});
  return out;
}

static std::vector<step::ParamSpec> specs_of(const std::vector<ModelParam>& model) {
  std::vector<step::ParamSpec> specs;
  for (const ModelParam& m : model) {
    specs.push_back({m.name, {m.shape, m.batch_dims, m.sharded, m.row_blocks, m.transposed}, m.dtype, m.group, m.whole_on_rank});
    specs.back().layout.mesh = m.mesh;
    specs.back().layout.col_blocks = m.col_blocks;
  }
  return specs;
}

World::World(std::vector<ModelParam> model, int world_size, int num_steps, uint64_t seed)
    : model_(std::move(model)), world_size_(world_size), table_(specs_of(model_), world_size) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  auto random = [&](int p, double scale) {
    std::vector<double> v(static_cast<size_t>(numel(p)));
    for (double& x : v) x = scale * normal(rng);
    return rounded(v, model_[static_cast<size_t>(p)].dtype);
  };
  for (int p = 0; p < static_cast<int>(model_.size()); ++p) {
    initial_param.push_back(random(p, 1.0));
    initial_momentum.push_back(random(p, 0.1));
  }
  grads.resize(static_cast<size_t>(num_steps));
  for (auto& step_grads : grads)
    for (int p = 0; p < static_cast<int>(model_.size()); ++p) step_grads.push_back(random(p, 1.0));
}

std::vector<step::ParamSpec> World::specs() const { return specs_of(model_); }

int64_t World::numel(int p) const {
  const auto& layout = table_.param(p).layout;
  return layout.flat_rows() * layout.cols();
}

// The elements of `box` of a row-major tensor of `shape` (box order, row-major), or the
// reverse: `local` written into `global` at the box.
static void for_box(const std::vector<int64_t>& shape, const layout::Box& box,
                    const std::function<void(int64_t global_idx, int64_t local_idx)>& fn) {
  if (layout::box_numel(box) == 0) return;
  const size_t nd = shape.size();
  std::vector<int64_t> idx(nd, 0);
  for (int64_t local = 0; local < layout::box_numel(box); ++local) {
    int64_t global = 0;
    for (size_t d = 0; d < nd; ++d) global = global * shape[d] + box[d].begin + idx[d];
    fn(global, local);
    for (size_t d = nd; d-- > 0;) {
      if (++idx[d] < box[d].count) break;
      idx[d] = 0;
    }
  }
}

static std::vector<double> box_of(const std::vector<double>& global, const std::vector<int64_t>& shape,
                                  const layout::Box& box) {
  std::vector<double> out(static_cast<size_t>(layout::box_numel(box)));
  for_box(shape, box, [&](int64_t g, int64_t l) { out[static_cast<size_t>(l)] = global[static_cast<size_t>(g)]; });
  return out;
}

RankTensors World::local(int rank) const {
  RankTensors t;
  for (int p = 0; p < static_cast<int>(model_.size()); ++p) {
    const layout::Box& box = table_.box(p, rank);
    const std::vector<int64_t>& shape = model_[static_cast<size_t>(p)].shape;
    const DType dtype = model_[static_cast<size_t>(p)].dtype;
    t.param.emplace_back(box_of(initial_param[static_cast<size_t>(p)], shape, box), dtype);
    t.momentum.emplace_back(box_of(initial_momentum[static_cast<size_t>(p)], shape, box), dtype);
    t.grad.emplace_back(std::vector<double>(static_cast<size_t>(layout::box_numel(box)), 0.0), dtype);
    t.has_grad.push_back(true);
    const int64_t cols = box.back().count;
    t.row_state.emplace_back(std::vector<double>(static_cast<size_t>(cols == 0 ? 0 : layout::box_numel(box) / cols), 0.0),
                             DType::kFloat32);
  }
  return t;
}

std::vector<RankTensors> World::locals() const {
  std::vector<RankTensors> out;
  for (int r = 0; r < world_size_; ++r) out.push_back(local(r));
  return out;
}

std::vector<std::vector<unsigned char>> state_bytes(const std::vector<RankTensors>& ranks) {
  std::vector<std::vector<unsigned char>> out;
  for (const RankTensors& t : ranks)
    for (size_t p = 0; p < t.param.size(); ++p) {
      out.push_back(t.param[p].bytes());
      out.push_back(t.momentum[p].bytes());
    }
  return out;
}

void World::set_grads(int rank, int step, RankTensors& t) const {
  for (int p = 0; p < static_cast<int>(model_.size()); ++p)
    t.grad[static_cast<size_t>(p)] =
        HostTensor(box_of(grads.at(static_cast<size_t>(step - 1))[static_cast<size_t>(p)],
                          model_[static_cast<size_t>(p)].shape, table_.box(p, rank)),
                   model_[static_cast<size_t>(p)].dtype);
}

std::vector<double> World::gather_boxes(int p, bool rows,
                                        const std::function<std::vector<double>(int rank)>& local_of) const {
  std::vector<int64_t> shape = model_[static_cast<size_t>(p)].shape;
  if (rows) shape.pop_back();
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  std::vector<double> global(static_cast<size_t>(numel), 0.0);
  std::vector<int> written_by(global.size(), -1);
  for (int r = 0; r < world_size_; ++r) {
    const std::vector<double> local = local_of(r);
    layout::Box box = table_.box(p, r);
    if (rows) box.pop_back();
    for_box(shape, box, [&](int64_t g, int64_t l) {
      const size_t gi = static_cast<size_t>(g);
      if (written_by[gi] >= 0 && global[gi] != local[static_cast<size_t>(l)])
        throw std::runtime_error("the replicas of parameter '" + model_[static_cast<size_t>(p)].name + "' on ranks " +
                                 std::to_string(written_by[gi]) + " and " + std::to_string(r) + " differ");
      global[gi] = local[static_cast<size_t>(l)];
      written_by[gi] = r;
    });
  }
  return global;
}

std::vector<double> World::gather(int p, const std::vector<RankTensors>& ranks, bool momentum) const {
  return gather_boxes(p, false, [&](int r) {
    return (momentum ? ranks[static_cast<size_t>(r)].momentum : ranks[static_cast<size_t>(r)].param)[static_cast<size_t>(p)].values();
  });
}

std::vector<double> World::gather_rows(int p, const std::vector<RankTensors>& ranks) const {
  return gather_boxes(p, true, [&](int r) { return ranks[static_cast<size_t>(r)].row_state[static_cast<size_t>(p)].values(); });
}

// NorMuon in fp64 on an item's orthogonalized update o (rows × cols), the parameter's flat
// rows [row0, row0 + rows), with the parameter's v: written here from the rule's formulas
// (optim/normuon.h), not from its code.
static void normuon_reference(std::vector<double>& o, int64_t rows, int64_t cols, int64_t row0, std::vector<double>& v,
                              const optim::NormuonRule& rule) {
  std::vector<double> row_sq(static_cast<size_t>(rows), 0.0);
  double norm_sq = 0.0, hat_sq = 0.0;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) row_sq[static_cast<size_t>(i)] += o[static_cast<size_t>(i * cols + j)] * o[static_cast<size_t>(i * cols + j)];
    norm_sq += row_sq[static_cast<size_t>(i)];
    double& vi = v[static_cast<size_t>(row0 + i)];
    vi = rule.beta2 * vi + (1.0 - rule.beta2) * row_sq[static_cast<size_t>(i)] / static_cast<double>(cols);
    hat_sq += row_sq[static_cast<size_t>(i)] / std::pow(std::sqrt(vi) + rule.eps, 2);
  }
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      o[static_cast<size_t>(i * cols + j)] *= std::sqrt(norm_sq / hat_sq) / (std::sqrt(v[static_cast<size_t>(row0 + i)]) + rule.eps);
}

ReferenceResult reference_muon(const World& world, const std::vector<step::GroupRule>& rules, int num_steps) {
  ReferenceResult out{world.initial_param, world.initial_momentum, {}};
  const step::ItemTable& table = world.table();
  for (int p = 0; p < table.num_params(); ++p)
    out.row_state.emplace_back(static_cast<size_t>(world.numel(p) / table.param(p).layout.cols()), 0.0);
  for (int s = 0; s < num_steps; ++s) {
    for (int p = 0; p < table.num_params(); ++p) {
      const step::GroupRule& rule = rules.at(static_cast<size_t>(table.param(p).group));
      std::vector<double>& m = out.momentum[static_cast<size_t>(p)];
      std::vector<double>& w = out.param[static_cast<size_t>(p)];
      const std::vector<double>& g = world.grads[static_cast<size_t>(s)][static_cast<size_t>(p)];
      std::vector<double> u(m.size());
      for (size_t i = 0; i < m.size(); ++i) {
        m[i] = lerp(m[i], g[i], 1.0 - rule.momentum);
        u[i] = rule.nesterov ? lerp(g[i], m[i], rule.momentum) : m[i];
      }
      const auto [first, count] = table.items_of(p);
      const layout::ParamLayout& layout = table.param(p).layout;
      for (int item = first; item < first + count; ++item) {
        const step::Item& it = table.item(item);
        // Element i (row-major in the item) of the flat parameter. NOTE: matrices of a
        // parameter may differ in rows (row blocks of unequal sizes); column block j is
        // the columns [j·cols, (j+1)·cols) of every row.
        auto at = [&](int64_t i) -> size_t {
          if (layout.splits_cols()) return static_cast<size_t>((i / it.cols) * layout.cols() + it.matrix_idx * it.cols + i % it.cols);
          return static_cast<size_t>(layout.matrix_blocks()[static_cast<size_t>(it.matrix_idx)].begin * it.cols + i);
        };
        std::vector<double> x(static_cast<size_t>(it.numel()));
        for (int64_t i = 0; i < it.numel(); ++i) x[static_cast<size_t>(i)] = u[at(i)];
        ns::orthogonalize_cpu<double>(rule.schedule, x.data(), 1, it.rows, it.cols);
        if (rule.normuon.enabled)
          normuon_reference(x, it.rows, it.cols, static_cast<int64_t>(at(0)) / layout.cols(), out.row_state[static_cast<size_t>(p)],
                            rule.normuon);
        const double scale = rule.update_scale(it.rows, it.cols), decay = rule.decay();
        for (int64_t i = 0; i < it.numel(); ++i) w[at(i)] = w[at(i)] * decay + scale * x[static_cast<size_t>(i)];
      }
    }
  }
  return out;
}

double relative_error(const std::vector<double>& a, const std::vector<double>& b) {
  double diff = 0.0, ref = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    ref += b[i] * b[i];
  }
  if (a.size() != b.size()) return INFINITY;
  return std::sqrt(diff) / std::max(std::sqrt(ref), 1e-300);
}

std::vector<double> difference(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] - b[i];
  return out;
}

EngineRun run_engine(const World& world, const step::EngineOptions& options, const std::vector<step::GroupRule>& rules,
                     int num_steps, const RunHooks& hooks) {
  const int n = world.world_size();
  EngineRun run;
  run.outcomes.resize(static_cast<size_t>(n));
  run.stats.resize(static_cast<size_t>(n));
  run.owners.resize(static_cast<size_t>(n));
  run.stages.resize(static_cast<size_t>(n));
  run.tensors = world.locals();
  LoopbackWorld loopback(n, hooks.loopback);
  const std::vector<step::ParamSpec> specs = world.specs();
  run.errors = loopback.run([&](int r) {
    step::CpuOpsOptions cpu_options;
    cpu_options.poison_allocations = true;
    step::CpuOps cpu(cpu_options);
    step::DeviceOps& ops = hooks.ops ? hooks.ops(r, cpu) : cpu;
    step::StepEngine engine(loopback.transport(r), ops, specs, options);
    run.owners[static_cast<size_t>(r)] = engine.owners();
    RankTensors& t = run.tensors[static_cast<size_t>(r)];
    for (int s = 1; s <= num_steps; ++s) {
      world.set_grads(r, s, t);
      if (hooks.before_step) hooks.before_step(r, s, t);
      run.outcomes[static_cast<size_t>(r)].push_back(hooks.step ? hooks.step(r, s, engine, t)
                                                                 : engine.step(t.views(), rules, s, {}, !hooks.before_results));
      if (hooks.before_results) {
        hooks.before_results(r, s, engine);
        if (engine.results_pending()) engine.agree_committed();
      }
      run.stats[static_cast<size_t>(r)] = engine.last_stats();
      run.stages[static_cast<size_t>(r)] = engine.stages();
    }
  });
  return run;
}

namespace {

// A validated rule of `schedule`; adjust_lr under its Python spelling.
step::GroupRule rule_of(double lr, double weight_decay, bool nesterov, const char* adjust_lr, ns::Schedule schedule) {
  step::GroupRule rule;
  rule.lr = lr, rule.weight_decay = weight_decay, rule.momentum = 0.95, rule.nesterov = nesterov;
  rule.adjust_lr = optim::parse_adjust_lr(adjust_lr);
  rule.schedule = std::move(schedule);
  rule.validate();
  return rule;
}

}  // namespace

step::GroupRule gram_rule(double lr, double weight_decay, bool nesterov, const char* adjust_lr) {
  return rule_of(lr, weight_decay, nesterov, adjust_lr,
                 ns::Schedule{ns::Algorithm::kGram, ns::polar_express_coefficients(5), {2}, 1e-7});
}

step::GroupRule standard_rule(double lr, double weight_decay, bool nesterov, const char* adjust_lr) {
  return rule_of(lr, weight_decay, nesterov, adjust_lr,
                 ns::Schedule{ns::Algorithm::kStandard, ns::keller_jordan_coefficients(5), {}, 1e-7});
}

}  // namespace dmuon::testing
