// dmuon/step/stage_layout.h — the engine's exchange plans as the projection sees them
// (sim/stage_layout.h): every rank's bytes to every peer in each stage's forward and
// return exchange, and every rank's work in each stage, read from every rank's plan
// (step/exchange_plan.h: every rank derives every rank's plan alike).
#pragma once

#include <cstdint>
#include <vector>

#include "sim/stage_layout.h"
#include "step/exchange_plan.h"

namespace dmuon::step {

/// The stage layout of `stages` over `table` (every rank's plan): `wire_size` bytes per
/// exchanged element; `active_params[p]`: parameter p had a gradient (empty: all did).
/// Its agreement_bytes is 0 (the engine's step stats know it).
sim::StageLayout stage_layout(const ItemTable& table, const std::vector<Stage>& stages, Mode mode,
                              int64_t wire_size, const std::vector<bool>& active_params);

}  // namespace dmuon::step
