// dmuon/sim/traffic.cpp — stage layout checks and the per-stage exchange bytes.
#include "sim/traffic.h"

#include "common/check.h"

namespace dmuon::sim {

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
  out.agreement_bytes = agreement_bytes;
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

}  // namespace dmuon::sim
