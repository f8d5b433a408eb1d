// dmuon/layout/world_model.cpp — the fake world's model: agreements and refusals.
#include "layout/world_model.h"

#include "common/check.h"

namespace dmuon::layout {

const char* transport_name(Transport transport) {
  switch (transport) {
    case Transport::kSingle: return "single";
    case Transport::kReal: return "real";
    case Transport::kFake: return "fake";
  }
  return "unknown";
}

WorldModel::WorldModel(Transport transport, int rank, int world_size)
    : transport_(transport), rank_(rank), world_size_(world_size) {
  DMUON_CHECK(world_size >= 1, "world_size must be >= 1, got ", world_size);
  DMUON_CHECK(rank >= 0 && rank < world_size, "rank ", rank, " is outside a world of ", world_size,
              " ranks (0..", world_size - 1, ")");
  DMUON_CHECK(transport != Transport::kSingle || world_size == 1,
              "a single-process world has world_size 1, got ", world_size);
}

std::vector<int64_t> WorldModel::modelled_agreement(const std::vector<int64_t>& local, FlagOp op) const {
  DMUON_CHECK(!moves_data(), "modelled_agreement: a ", transport_name(transport_),
              " group of ", world_size_, " ranks agrees by a collective, not by the model");
  std::vector<int64_t> agreed = local;
  if (op == FlagOp::kSum)
    for (int64_t& value : agreed) value *= world_size_;
  return agreed;
}

void WorldModel::require_data_movement(const std::string& what) const {
  DMUON_CHECK(transport_ != Transport::kFake, what,
              " cannot run over torch's fake process-group backend: its collectives move no data, so "
              "what other ranks send would never arrive (rank ", rank_, " of a fake world of ", world_size_, ")");
}

}  // namespace dmuon::layout
