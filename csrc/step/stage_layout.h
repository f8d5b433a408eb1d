// dmuon/step/stage_layout.h — the engine's stages as the projection sees them
// (sim/stage_layout.h): every rank's bytes to every peer in each stage's forward and
// return exchange, and every rank's work in each stage.
//
// The engine knows only its own rank's exchanges while it runs (StepStats' StageTimeline);
// every rank derives the same items and stages, so every rank's traffic follows from them
// by the engine's own rules (step/engine.cpp issue_forward, run_stage, land): a piece
// travels to each other rank that computes its item and does not hold it whole, from the
// block's source (ItemTable::source: replicas send a block once); an owner
// returns each other rank its rows of the result (mode owner); a rank applies the rows
// other owners return; an owner's own whole items are read straight into its iterate.
// tests/cpp/test_step_stage_layout.cpp checks it against the bytes the engine counted.
#pragma once

#include <cstdint>
#include <vector>

#include "sim/stage_layout.h"
#include "step/items.h"
#include "step/options.h"
#include "step/stages.h"

namespace dmuon::step {

/// The stage layout of `stages` over `table` (every rank): `wire_size` bytes per
/// exchanged element; `active_params[p]`: parameter p had a gradient (empty: all did).
sim::StageLayout stage_layout(const ItemTable& table, const std::vector<Stage>& stages, Mode mode,
                              int64_t wire_size, const std::vector<bool>& active_params);

}  // namespace dmuon::step
