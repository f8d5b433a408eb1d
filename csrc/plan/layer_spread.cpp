// dmuon/plan/layer_spread.cpp — layer spreading of an owner plan (see layer_spread.h).
#include "plan/layer_spread.h"

#include <algorithm>
#include <limits>
#include <map>
#include <numeric>
#include <tuple>
#include <utility>

#include "common/check.h"

namespace dmuon::plan {
namespace {

// NOTE: every round re-solves each class exactly given the others and keeps the new
// placement only when it is strictly cheaper, so rounds end by themselves; the cap only
// bounds the time on pathological inputs (the shipped manifests at D = 2..16 settle
// after the greedy round and at most 3 exact ones).
constexpr int kMaxRounds = 16;

// The checked inputs: dense layer indices (ascending id order) and each matrix's class.
struct Inputs {
  int num_ranks = 0;
  std::vector<int> layer;                      // [matrix] → dense layer index, or −1
  std::vector<int> layer_id;                   // [dense layer] → id from layer_of
  std::vector<int> class_of;                   // [matrix] → shape class
  std::vector<std::vector<int64_t>> capacity;  // [class][rank] → units of the class it owns
  std::vector<int64_t> num_free;               // [class] → matrices without a layer
};

Inputs check_inputs(const Problem& problem, const std::vector<int>& layer_of, const Plan& plan) {
  const size_t n = problem.matrices.size();
  const int D = problem.world_size();
  DMUON_CHECK(layer_of.size() == n, "layer_of has ", layer_of.size(), " entries, the problem has ", n,
              " matrices (one layer id per matrix, -1: none)");
  DMUON_CHECK(plan.problem_hash == problem.hash, "plan was made for problem hash ", plan.problem_hash,
              ", this problem has hash ", problem.hash, " (inputs differ)");
  DMUON_CHECK(plan.owner.size() == n && plan.ranks.size() == static_cast<size_t>(D), "plan has ",
              plan.owner.size(), " owners and ", plan.ranks.size(), " ranks, the problem has ", n,
              " matrices and world_size ", D);
  Inputs in;
  in.num_ranks = D;
  in.layer.assign(n, -1);
  in.class_of.assign(n, -1);
  in.capacity.assign(problem.shapes.size(), std::vector<int64_t>(static_cast<size_t>(D), 0));
  in.num_free.assign(problem.shapes.size(), 0);
  // Classes and capacities from the batches, cross-checked against plan.owner.
  for (size_t s = 0; s < problem.shapes.size(); ++s)
    for (int idx : problem.shapes[s].matrix_idx) in.class_of[static_cast<size_t>(idx)] = static_cast<int>(s);
  for (int r = 0; r < D; ++r)
    for (const Batch& batch : plan.ranks[static_cast<size_t>(r)].batches)
      for (int idx : batch.matrix_idx) {
        DMUON_CHECK(idx >= 0 && static_cast<size_t>(idx) < n && plan.owner[static_cast<size_t>(idx)] == r &&
                        in.class_of[static_cast<size_t>(idx)] == batch.shape_idx,
                    "plan is inconsistent: rank ", r, " batches matrix index ", idx,
                    " that plan.owner or its shape class does not give to it");
        ++in.capacity[static_cast<size_t>(batch.shape_idx)][static_cast<size_t>(r)];
      }
  // Layer ids: ≥ 0 or −1, made dense in ascending order.
  std::map<int, int> dense;
  for (size_t i = 0; i < n; ++i) {
    DMUON_CHECK(layer_of[i] >= -1, "layer_of[", i, "] = ", layer_of[i], " for matrix '",
                problem.matrices[i].name, "': layer ids must be >= 0, or -1 for no layer");
    if (layer_of[i] >= 0) dense.emplace(layer_of[i], 0);
  }
  for (auto& [id, idx] : dense) {
    idx = static_cast<int>(in.layer_id.size());
    in.layer_id.push_back(id);
  }
  for (size_t i = 0; i < n; ++i) {
    if (layer_of[i] >= 0)
      in.layer[i] = dense[layer_of[i]];
    else
      ++in.num_free[static_cast<size_t>(in.class_of[i])];
  }
  return in;
}

// Bytes and matrices each rank publishes for each layer.
struct Occupancy {
  int num_ranks = 0;
  std::vector<int64_t> bytes;  // [layer · D + rank]
  std::vector<int64_t> count;  // [layer · D + rank]

  Occupancy(int num_layers, int D)
      : num_ranks(D),
        bytes(static_cast<size_t>(num_layers) * static_cast<size_t>(D), 0),
        count(static_cast<size_t>(num_layers) * static_cast<size_t>(D), 0) {}
  size_t at(int layer, int rank) const {
    return static_cast<size_t>(layer) * static_cast<size_t>(num_ranks) + static_cast<size_t>(rank);
  }
  void add(int layer, int rank, int64_t wire_bytes, int sign) {
    bytes[at(layer, rank)] += sign * wire_bytes;
    count[at(layer, rank)] += sign;
  }
};

// Lexicographic cost: wire bytes first, then matrices (the objective in layer_spread.h).
struct Cost {
  int64_t bytes = 0;
  int64_t count = 0;
  Cost operator+(const Cost& o) const { return {bytes + o.bytes, count + o.count}; }
  Cost operator-(const Cost& o) const { return {bytes - o.bytes, count - o.count}; }
  bool operator<(const Cost& o) const { return bytes != o.bytes ? bytes < o.bytes : count < o.count; }
};

// One shape class: its layered matrices per layer, its units per rank, and the placement.
struct ClassState {
  int shape_idx = 0;
  int64_t wire_bytes = 0;
  std::vector<int64_t> per_layer;  // [layer] → layered matrices of the class
  std::vector<int64_t> capacity;   // [rank] → units of the class the rank owns
  std::vector<int64_t> placed;     // [layer · D + rank] → units there; empty before round 1
};

// Rise of Σ bytes² (divided by the class's wire bytes b, which every unit shares: same
// order, no overflow) and Σ count² over all cells when `placed` joins `others`.
// NOTE: x units on a cell holding B bytes add (B + x·b)² − B² = b·(2·B·x + b·x²).
Cost placement_cost(const Occupancy& others, int64_t b, const std::vector<int64_t>& placed) {
  Cost total;
  for (size_t cell = 0; cell < placed.size(); ++cell) {
    const int64_t x = placed[cell];
    total = total + Cost{2 * others.bytes[cell] * x + b * x * x, 2 * others.count[cell] * x + x * x};
  }
  return total;
}

// A first placement of one class given the larger ones: layer by layer, each unit onto
// the rank with room that publishes the fewest bytes, then matrices, for the layer; ties
// to the rank with the most room left, then the lowest rank.
// NOTE: the most-room tie-break deals consecutive layers round the ranks instead of
// filling rank 0 first, which leaves every rank room for the later (smaller) classes;
// starting the exact rounds from it reaches better optima than starting from nothing.
std::vector<int64_t> place_greedy(const Occupancy& others, const ClassState& cls) {
  const int D = others.num_ranks;
  std::vector<int64_t> x(others.bytes.size(), 0);
  std::vector<int64_t> room = cls.capacity;
  for (int l = 0; l < static_cast<int>(cls.per_layer.size()); ++l)
    for (int64_t unit = 0; unit < cls.per_layer[static_cast<size_t>(l)]; ++unit) {
      const auto key = [&](int r) {
        const size_t cell = others.at(l, r);
        return std::make_tuple(others.bytes[cell] + x[cell] * cls.wire_bytes, others.count[cell] + x[cell],
                               -room[static_cast<size_t>(r)]);
      };
      int best = -1;
      for (int r = 0; r < D; ++r)
        if (room[static_cast<size_t>(r)] > 0 && (best < 0 || key(r) < key(best))) best = r;
      DMUON_CHECK(best >= 0, "layer spreading found no room for shape class ", cls.shape_idx,
                  " (internal error)");
      ++x[others.at(l, best)];
      --room[static_cast<size_t>(best)];
    }
  return x;
}

// The least-cost placement of one class given the others: a min-cost flow source → layer
// (its matrices) → rank (its capacity) → sink whose layer→rank arcs have the convex cell
// costs above, by successive shortest paths (Dijkstra with potentials, one unit each).
// NOTE: convex arc costs make unit-by-unit augmentation exact; the residual arcs are
// implicit: forward l→r costs the next unit's rise, backward r→l refunds the last one.
// NOTE: the layer nodes are eliminated: a path alternates ranks and layers, so Dijkstra
// runs on the D ranks (plus source and sink) over two-hop arcs, a → b: the cheapest layer
// to move one unit from rank a to rank b (refund on a, rise on b), and source → r: the
// cheapest layer with matrices left to place on r. Rank potentials keep their reduced
// costs ≥ 0 (each is a minimum of two reduced arcs of the full graph). After a unit, only
// the rows and columns of the ranks on its path change. Per unit O(D² + |path|·L·D)
// instead of O((L + D)²): backward windows make L large (hundreds on MoE models).
// Ties go to the lowest layer and rank, so it is deterministic.
std::vector<int64_t> solve_class(const Occupancy& others, const ClassState& cls) {
  const int D = others.num_ranks;
  const int L = static_cast<int>(cls.per_layer.size());
  const int64_t b = cls.wire_bytes;
  const int src = D, sink = D + 1, num_nodes = D + 2;
  const Cost kInf{std::numeric_limits<int64_t>::max() / 4, 0};
  std::vector<int64_t> x(others.bytes.size(), 0), layer_used(static_cast<size_t>(L), 0),
      rank_used(static_cast<size_t>(D), 0);
  std::vector<Cost> potential(static_cast<size_t>(num_nodes));
  // Marginal cost of one more (or one fewer: its negative) unit on a cell.
  const auto add_cost = [&](size_t cell) {
    return Cost{2 * (others.bytes[cell] + x[cell] * b) + b, 2 * (others.count[cell] + x[cell]) + 1};
  };
  const auto remove_cost = [&](size_t cell) {
    return Cost{-(2 * (others.bytes[cell] + x[cell] * b) - b), -(2 * (others.count[cell] + x[cell]) - 1)};
  };
  // Two-hop arcs and their layers (−1: no arc).
  std::vector<Cost> move(static_cast<size_t>(D) * static_cast<size_t>(D), kInf), enter(static_cast<size_t>(D), kInf);
  std::vector<int> move_layer(move.size(), -1), enter_layer(static_cast<size_t>(D), -1);
  const auto at = [D](int a, int r) { return static_cast<size_t>(a) * static_cast<size_t>(D) + static_cast<size_t>(r); };
  const auto update_move = [&](int a, int r) {
    Cost best = kInf;
    int layer = -1;
    if (a != r)
      for (int l = 0; l < L; ++l) {
        if (x[others.at(l, a)] == 0) continue;
        const Cost c = remove_cost(others.at(l, a)) + add_cost(others.at(l, r));
        if (layer < 0 || c < best) {
          best = c;
          layer = l;
        }
      }
    move[at(a, r)] = best;
    move_layer[at(a, r)] = layer;
  };
  const auto update_enter = [&](int r) {
    Cost best = kInf;
    int layer = -1;
    for (int l = 0; l < L; ++l) {
      if (layer_used[static_cast<size_t>(l)] == cls.per_layer[static_cast<size_t>(l)]) continue;
      const Cost c = add_cost(others.at(l, r));
      if (layer < 0 || c < best) {
        best = c;
        layer = l;
      }
    }
    enter[static_cast<size_t>(r)] = best;
    enter_layer[static_cast<size_t>(r)] = layer;
  };
  for (int r = 0; r < D; ++r) update_enter(r);  // NOTE: no arc a → r before anything is placed
  const int64_t num_units = std::accumulate(cls.per_layer.begin(), cls.per_layer.end(), int64_t{0});
  std::vector<Cost> dist(static_cast<size_t>(num_nodes));
  std::vector<int> prev(static_cast<size_t>(num_nodes)), on_path(static_cast<size_t>(D));
  std::vector<char> done(static_cast<size_t>(num_nodes));
  for (int64_t unit = 0; unit < num_units; ++unit) {
    // Dijkstra on reduced costs (dense: D + 2 nodes).
    std::fill(dist.begin(), dist.end(), kInf);
    std::fill(prev.begin(), prev.end(), -1);
    std::fill(done.begin(), done.end(), 0);
    dist[src] = Cost{};
    const auto relax = [&](int u, int v, const Cost& cost) {
      const Cost d = dist[static_cast<size_t>(u)] + cost + potential[static_cast<size_t>(u)] -
                     potential[static_cast<size_t>(v)];
      if (d < dist[static_cast<size_t>(v)]) {
        dist[static_cast<size_t>(v)] = d;
        prev[static_cast<size_t>(v)] = u;
      }
    };
    for (int iter = 0; iter < num_nodes; ++iter) {
      int u = -1;
      for (int v = 0; v < num_nodes; ++v)
        if (!done[static_cast<size_t>(v)] && dist[static_cast<size_t>(v)] < kInf &&
            (u < 0 || dist[static_cast<size_t>(v)] < dist[static_cast<size_t>(u)]))
          u = v;
      if (u < 0 || u == sink) break;
      done[static_cast<size_t>(u)] = 1;
      if (u == src) {
        for (int r = 0; r < D; ++r)
          if (enter_layer[static_cast<size_t>(r)] >= 0) relax(u, r, enter[static_cast<size_t>(r)]);
      } else {
        for (int r = 0; r < D; ++r)
          if (move_layer[at(u, r)] >= 0) relax(u, r, move[at(u, r)]);
        if (rank_used[static_cast<size_t>(u)] < cls.capacity[static_cast<size_t>(u)]) relax(u, sink, Cost{});
      }
    }
    DMUON_CHECK(dist[sink] < kInf, "layer spreading found no room for shape class ", cls.shape_idx,
                " (internal error)");
    // Potentials keep reduced costs ≥ 0; nodes beyond the sink's distance are capped at it.
    for (int v = 0; v < num_nodes; ++v) {
      const Cost& d = dist[static_cast<size_t>(v)] < dist[sink] ? dist[static_cast<size_t>(v)] : dist[sink];
      potential[static_cast<size_t>(v)] = potential[static_cast<size_t>(v)] + d;
    }
    // Augment one unit along the path (the hops' layers as chosen above, before any change).
    std::vector<std::pair<int, int>> hops;  // (rank, layer): the unit entering rank via layer
    int last = prev[sink];
    for (int v = last; v != src; v = prev[static_cast<size_t>(v)]) {
      const int u = prev[static_cast<size_t>(v)];
      hops.emplace_back(v, u == src ? enter_layer[static_cast<size_t>(v)] : move_layer[at(u, v)]);
    }
    ++rank_used[static_cast<size_t>(last)];
    for (size_t k = hops.size(); k-- > 0;) {
      const auto [r, l] = hops[k];
      ++x[others.at(l, r)];
      if (k + 1 == hops.size())
        ++layer_used[static_cast<size_t>(l)];
      else
        --x[others.at(l, hops[k + 1].first)];
    }
    // Arcs out of and into the path's ranks, and every entry arc (a layer may be used up).
    std::fill(on_path.begin(), on_path.end(), 0);
    for (const auto& hop : hops) on_path[static_cast<size_t>(hop.first)] = 1;
    for (int a = 0; a < D; ++a)
      for (int r = 0; r < D; ++r)
        if (on_path[static_cast<size_t>(a)] || on_path[static_cast<size_t>(r)]) update_move(a, r);
    for (int r = 0; r < D; ++r) update_enter(r);
  }
  return x;
}

// Concrete owners from a class's placement: each layer's matrices (ascending index) fill
// its ranks in ascending order.
void assign_class(const Problem& problem, const Inputs& in, const ClassState& cls, int D,
                  std::vector<int>& owner) {
  std::vector<int64_t> left = cls.placed;
  for (int idx : problem.shapes[static_cast<size_t>(cls.shape_idx)].matrix_idx) {
    const int l = in.layer[static_cast<size_t>(idx)];
    if (l < 0) continue;
    int r = 0;
    while (left[static_cast<size_t>(l) * static_cast<size_t>(D) + static_cast<size_t>(r)] == 0) ++r;
    --left[static_cast<size_t>(l) * static_cast<size_t>(D) + static_cast<size_t>(r)];
    owner[static_cast<size_t>(idx)] = r;
  }
}

// The whole objective of an owner vector: Σ bytes², then Σ count², over (layer, rank).
// NOTE: 128-bit because squares of MoE stack bytes (> 3 GB) overflow 64 bits.
std::pair<__int128, __int128> objective(const Problem& problem, const Inputs& in,
                                        const std::vector<int>& owner) {
  Occupancy occ(static_cast<int>(in.layer_id.size()), in.num_ranks);
  for (size_t i = 0; i < owner.size(); ++i)
    if (in.layer[i] >= 0) occ.add(in.layer[i], owner[i], problem.matrices[i].wire_bytes, +1);
  std::pair<__int128, __int128> total{0, 0};
  for (size_t cell = 0; cell < occ.bytes.size(); ++cell) {
    total.first += static_cast<__int128>(occ.bytes[cell]) * occ.bytes[cell];
    total.second += static_cast<__int128>(occ.count[cell]) * occ.count[cell];
  }
  return total;
}

// Rewrites the plan's owners and batch members; batch sizes and order stay as they were.
void rewrite_plan(const Problem& problem, const Inputs& in, const std::vector<int>& owner, Plan& plan) {
  const size_t num_shapes = problem.shapes.size();
  std::vector<std::vector<std::vector<int>>> members(static_cast<size_t>(in.num_ranks),
                                                     std::vector<std::vector<int>>(num_shapes));
  for (size_t i = 0; i < owner.size(); ++i)  // ascending: members come out sorted
    members[static_cast<size_t>(owner[i])][static_cast<size_t>(in.class_of[i])].push_back(
        static_cast<int>(i));
  for (int r = 0; r < in.num_ranks; ++r) {
    std::vector<size_t> next(num_shapes, 0);
    // NOTE: a rank's same-class batches are filled in their order with ascending indices;
    // finalize() (plan.cpp) orders batches by (compute desc, class, first index), which this
    // keeps, so deserialize_plan(serialize()) rebuilds exactly this plan.
    for (Batch& batch : plan.ranks[static_cast<size_t>(r)].batches) {
      const std::vector<int>& pool = members[static_cast<size_t>(r)][static_cast<size_t>(batch.shape_idx)];
      size_t& pos = next[static_cast<size_t>(batch.shape_idx)];
      const size_t size = batch.matrix_idx.size();
      batch.matrix_idx.assign(pool.begin() + static_cast<long>(pos),
                              pool.begin() + static_cast<long>(pos + size));
      pos += size;
    }
  }
  plan.owner = owner;
}

}  // namespace

void spread_layers(const Problem& problem, const std::vector<int>& layer_of, Plan& plan) {
  const Inputs in = check_inputs(problem, layer_of, plan);
  const int D = in.num_ranks;
  const int L = static_cast<int>(in.layer_id.size());
  const int num_shapes = static_cast<int>(problem.shapes.size());
  if (L == 0) return;  // no layered matrix: nothing to spread
  // NOTE: with homes, units of a class are not interchangeable (moving one off its home
  // adds its receive time), so the loads would change: the plan is kept as it is.
  if (problem.has_homes()) return;

  // Classes by decreasing bytes (ties: class order).
  std::vector<ClassState> classes(static_cast<size_t>(num_shapes));
  for (int s = 0; s < num_shapes; ++s) {
    ClassState& cls = classes[static_cast<size_t>(s)];
    cls.shape_idx = s;
    cls.wire_bytes = problem.shapes[static_cast<size_t>(s)].wire_bytes;
    cls.capacity = in.capacity[static_cast<size_t>(s)];
    cls.per_layer.assign(static_cast<size_t>(L), 0);
    for (int idx : problem.shapes[static_cast<size_t>(s)].matrix_idx)
      if (in.layer[static_cast<size_t>(idx)] >= 0)
        ++cls.per_layer[static_cast<size_t>(in.layer[static_cast<size_t>(idx)])];
  }
  std::stable_sort(classes.begin(), classes.end(),
                   [](const ClassState& a, const ClassState& b) { return a.wire_bytes > b.wire_bytes; });

  // Rounds: each class re-placed optimally given all the others (round 1: given the
  // larger classes), kept only when strictly cheaper; until a round changes nothing.
  Occupancy occ(L, D);
  const auto apply = [&](const ClassState& cls, int sign) {
    for (size_t cell = 0; cell < cls.placed.size(); ++cell) {
      occ.bytes[cell] += sign * cls.placed[cell] * cls.wire_bytes;
      occ.count[cell] += sign * cls.placed[cell];
    }
  };
  for (int round = 0; round < kMaxRounds; ++round) {
    bool changed = false;
    for (ClassState& cls : classes) {
      apply(cls, -1);
      std::vector<int64_t> placed = round == 0 ? place_greedy(occ, cls) : solve_class(occ, cls);
      if (cls.placed.empty() ||
          placement_cost(occ, cls.wire_bytes, placed) < placement_cost(occ, cls.wire_bytes, cls.placed)) {
        cls.placed = std::move(placed);
        changed = true;
      }
      apply(cls, +1);
    }
    if (!changed) break;
  }

  // Owners of layered matrices, then those without a layer: their old owner where it has
  // room, else the lowest rank with room.
  std::vector<int> owner(problem.matrices.size(), -1);
  for (const ClassState& cls : classes) {
    assign_class(problem, in, cls, D, owner);
    std::vector<int64_t> spare = cls.capacity;
    for (int l = 0; l < L; ++l)
      for (int r = 0; r < D; ++r) spare[static_cast<size_t>(r)] -= cls.placed[occ.at(l, r)];
    std::vector<int> homeless;
    for (int idx : problem.shapes[static_cast<size_t>(cls.shape_idx)].matrix_idx) {
      if (in.layer[static_cast<size_t>(idx)] >= 0) continue;
      const int old = plan.owner[static_cast<size_t>(idx)];
      if (spare[static_cast<size_t>(old)] > 0) {
        owner[static_cast<size_t>(idx)] = old;
        --spare[static_cast<size_t>(old)];
      } else {
        homeless.push_back(idx);
      }
    }
    int r = 0;
    for (int idx : homeless) {
      while (spare[static_cast<size_t>(r)] == 0) ++r;
      owner[static_cast<size_t>(idx)] = r;
      --spare[static_cast<size_t>(r)];
    }
  }
  // NOTE: the result never loses to the input: a plan already better spread (by the same
  // objective) is kept as it is, which also makes spreading idempotent.
  if (!(objective(problem, in, owner) < objective(problem, in, plan.owner))) return;
  rewrite_plan(problem, in, owner, plan);
}

LayerSpreadStats layer_spread_stats(const Problem& problem, const std::vector<int>& layer_of,
                                    const Plan& plan) {
  const Inputs in = check_inputs(problem, layer_of, plan);
  const int D = in.num_ranks;
  const int L = static_cast<int>(in.layer_id.size());
  LayerSpreadStats stats;
  stats.num_layers = L;
  if (L == 0) return stats;
  Occupancy occ(L, D);
  std::vector<int64_t> layer_bytes(static_cast<size_t>(L), 0), layer_count(static_cast<size_t>(L), 0),
      largest(static_cast<size_t>(L), 0);
  for (size_t i = 0; i < problem.matrices.size(); ++i) {
    const int l = in.layer[i];
    if (l < 0) continue;
    const int64_t b = problem.matrices[i].wire_bytes;
    occ.add(l, plan.owner[i], b, +1);
    layer_bytes[static_cast<size_t>(l)] += b;
    ++layer_count[static_cast<size_t>(l)];
    largest[static_cast<size_t>(l)] = std::max(largest[static_cast<size_t>(l)], b);
  }

  // Per layer: its worst rank, its collisions and its bounds.
  for (int l = 0; l < L; ++l) {
    int64_t owners = 0;
    for (int r = 0; r < D; ++r) {
      const size_t cell = occ.at(l, r);
      owners += occ.count[cell] > 0 ? 1 : 0;
      stats.max_matrices_per_owner = std::max(stats.max_matrices_per_owner, occ.count[cell]);
      if (occ.bytes[cell] > stats.max_bytes_per_owner) {
        stats.max_bytes_per_owner = occ.bytes[cell];
        stats.worst_layer = in.layer_id[static_cast<size_t>(l)];
      }
    }
    const int64_t n = layer_count[static_cast<size_t>(l)];
    stats.max_collisions = std::max(stats.max_collisions, n - owners);
    stats.total_collisions += n - owners;
    stats.matrices_bound = std::max(stats.matrices_bound, (n + D - 1) / D);
    stats.collisions_bound = std::max<int64_t>(stats.collisions_bound, std::max<int64_t>(0, n - D));
    stats.bytes_bound = std::max({stats.bytes_bound, largest[static_cast<size_t>(l)],
                                  (layer_bytes[static_cast<size_t>(l)] + D - 1) / D});
  }

  // Per rank: the layered matrices it must hold whatever the spreading does (its class
  // capacities less the class's matrices without a layer), spread over L layers at best.
  stats.matrices_bound_for_counts = stats.matrices_bound;
  stats.bytes_bound_for_counts = stats.bytes_bound;
  for (int r = 0; r < D; ++r) {
    int64_t count = 0, bytes = 0;
    for (size_t s = 0; s < problem.shapes.size(); ++s) {
      const int64_t layered = std::max<int64_t>(0, in.capacity[s][static_cast<size_t>(r)] - in.num_free[s]);
      count += layered;
      bytes += layered * problem.shapes[s].wire_bytes;
    }
    stats.matrices_bound_for_counts = std::max(stats.matrices_bound_for_counts, (count + L - 1) / L);
    stats.bytes_bound_for_counts = std::max(stats.bytes_bound_for_counts, (bytes + L - 1) / L);
  }
  return stats;
}

}  // namespace dmuon::plan
