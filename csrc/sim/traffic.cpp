// dmuon/sim/traffic.cpp — step layout checks and the per-bucket exchange bytes.
#include "sim/traffic.h"

#include "common/check.h"

namespace dmuon::sim {

void StepLayout::validate() const {
  DMUON_CHECK(world_size >= 1, "StepLayout.world_size must be >= 1, got ", world_size);
  DMUON_CHECK(wire_element_size >= 1, "StepLayout.wire_element_size must be >= 1, got ", wire_element_size);
  DMUON_CHECK(gather || owners.size() == layouts.size(), "StepLayout.owners has ", owners.size(), " entries for ",
              layouts.size(), " parameters");
  DMUON_CHECK(active.empty() || active.size() == layouts.size(), "StepLayout.active has ", active.size(),
              " entries for ", layouts.size(), " parameters");
  if (!gather)
    for (size_t i = 0; i < owners.size(); ++i)
      DMUON_CHECK(owners[i] >= 0 && owners[i] < world_size, "StepLayout.owners[", i, "] = ", owners[i],
                  " is not a rank of a world of ", world_size);
  std::vector<int> seen(layouts.size(), 0);
  for (size_t b = 0; b < buckets.size(); ++b)
    for (int idx : buckets[b].param_idx) {
      DMUON_CHECK(idx >= 0 && static_cast<size_t>(idx) < layouts.size(), "StepLayout.buckets[", b,
                  "] names parameter ", idx, " of ", layouts.size());
      ++seen[static_cast<size_t>(idx)];
    }
  for (size_t i = 0; i < seen.size(); ++i)
    DMUON_CHECK(seen[i] == 1, "StepLayout: parameter ", i, " is in ", seen[i], " buckets (expected 1)");
}

RankTraffic StepTraffic::total(int rank) const {
  RankTraffic sum;
  for (const auto* exchanges : {&forward, &back})
    for (const Exchange& e : *exchanges) {
      if (!e.issued) continue;
      const RankTraffic& t = e.ranks[static_cast<size_t>(rank)];
      sum.send_intra += t.send_intra;
      sum.send_inter += t.send_inter;
      sum.recv_intra += t.recv_intra;
      sum.recv_inter += t.recv_inter;
    }
  return sum;
}

namespace {

// `bytes` from src to dst, on the link between them.
void add_transfer(std::vector<RankTraffic>& ranks, const Topology& topology, int src, int dst, int64_t bytes) {
  if (src == dst || bytes == 0) return;
  RankTraffic& from = ranks[static_cast<size_t>(src)];
  RankTraffic& to = ranks[static_cast<size_t>(dst)];
  if (topology.same_node(src, dst)) {
    from.send_intra += bytes;
    to.recv_intra += bytes;
  } else {
    from.send_inter += bytes;
    to.recv_inter += bytes;
  }
}

// One engine exchange on `topology`: every (src, dst) entry of its byte matrix.
Exchange exchange_of(const StageExchange& e, int world, const Topology& topology) {
  Exchange out;
  out.issued = e.issued;
  out.ranks.assign(static_cast<size_t>(world), {});
  for (int src = 0; src < world; ++src)
    for (int dst = 0; dst < world; ++dst)
      add_transfer(out.ranks, topology, src, dst, e.bytes[static_cast<size_t>(src * world + dst)]);
  return out;
}

}  // namespace

void StageLayout::validate() const {
  DMUON_CHECK(world_size >= 1, "StageLayout.world_size must be >= 1, got ", world_size);
  DMUON_CHECK(back.size() == forward.size() && work.size() == forward.size(), "StageLayout: ", forward.size(),
              " forward exchanges, ", back.size(), " returns and ", work.size(), " stages of work");
  const size_t cells = static_cast<size_t>(world_size) * static_cast<size_t>(world_size);
  for (size_t s = 0; s < forward.size(); ++s) {
    for (const auto* e : {&forward[s], &back[s]}) {
      DMUON_CHECK(e->bytes.size() == cells, "StageLayout: stage ", s, "'s ", e == &forward[s] ? "forward" : "return",
                  " exchange has ", e->bytes.size(), " byte counts for a world of ", world_size, " (world²)");
      for (size_t k = 0; k < cells; ++k) {
        DMUON_CHECK(e->bytes[k] >= 0, "StageLayout: stage ", s, " has negative bytes from rank ", k / world_size,
                    " to rank ", k % world_size);
        DMUON_CHECK(e->issued || e->bytes[k] == 0, "StageLayout: stage ", s, " moves bytes in an exchange it does "
                    "not issue");
      }
    }
    DMUON_CHECK(work[s].size() == static_cast<size_t>(world_size), "StageLayout: stage ", s, " has the work of ",
                work[s].size(), " ranks for a world of ", world_size);
  }
}

StageLayout StageLayout::from_stage(size_t first) const {
  DMUON_CHECK(first <= num_stages(), "StageLayout.from_stage: first stage ", first, " is past the layout's ",
              num_stages(), " stages");
  StageLayout out;
  out.world_size = world_size;
  const auto at = static_cast<std::ptrdiff_t>(first);
  out.forward.assign(forward.begin() + at, forward.end());
  out.back.assign(back.begin() + at, back.end());
  out.work.assign(work.begin() + at, work.end());
  return out;
}

StepTraffic step_traffic(const StageLayout& layout, const Topology& topology) {
  layout.validate();
  DMUON_CHECK(topology.world_size() == layout.world_size, "step_traffic: the topology has ", topology.world_size(),
              " ranks, the stage layout ", layout.world_size);
  StepTraffic traffic;
  for (size_t s = 0; s < layout.num_stages(); ++s) {
    traffic.forward.push_back(exchange_of(layout.forward[s], layout.world_size, topology));
    traffic.back.push_back(exchange_of(layout.back[s], layout.world_size, topology));
  }
  return traffic;
}

StepTraffic step_traffic(const StepLayout& layout, const Topology& topology) {
  layout.validate();
  DMUON_CHECK(topology.world_size() == layout.world_size, "step_traffic: the topology has ", topology.world_size(),
              " ranks, the step layout ", layout.world_size);
  const int world = layout.world_size;
  std::vector<std::vector<dist::RowBlock>> rows;
  for (const auto& l : layout.layouts) rows.push_back(l.rank_rows(world));

  StepTraffic traffic;
  for (const dist::Bucket& bucket : layout.buckets) {
    Exchange forward, back;
    forward.ranks.assign(static_cast<size_t>(world), {});
    back.ranks.assign(static_cast<size_t>(world), {});
    for (int idx : bucket.param_idx) {
      if (!layout.is_active(idx) || world == 1) continue;
      const auto& l = layout.layouts[static_cast<size_t>(idx)];
      const auto& blocks = rows[static_cast<size_t>(idx)];
      const int64_t row_bytes = l.cols() * layout.wire_element_size;
      // Forward: each rank's rows of a sharded matrix go to every rank that computes it.
      if (l.sharded) {
        forward.issued = true;
        for (int dst = 0; dst < world; ++dst) {
          if (!layout.computes(idx, dst)) continue;
          for (int src = 0; src < world; ++src)
            add_transfer(forward.ranks, topology, src, dst, blocks[static_cast<size_t>(src)].count * row_bytes);
        }
      }
      // Return (owner mode): the owner sends every rank its rows of the result.
      if (!layout.gather) {
        back.issued = true;
        const int owner = layout.owners[static_cast<size_t>(idx)];
        for (int dst = 0; dst < world; ++dst)
          add_transfer(back.ranks, topology, owner, dst, blocks[static_cast<size_t>(dst)].count * row_bytes);
      }
    }
    traffic.forward.push_back(std::move(forward));
    traffic.back.push_back(std::move(back));
  }
  return traffic;
}

}  // namespace dmuon::sim
