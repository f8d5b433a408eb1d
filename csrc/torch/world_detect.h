// dmuon/torch/world_detect.h — which transport a c10d process group is (layout/world_model.h),
// decided once when a runtime is made.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <string>

#include "layout/world_model.h"

namespace dmuon::torch_adapter {

/// Whether `group` is served by torch's fake backend (its default backend, or the one of
/// the device type "cpu" | "cuda", is named "fake").
bool is_fake_group(const c10::intrusive_ptr<c10d::ProcessGroup>& group, const std::string& device_type);

/// single (null group), fake (is_fake_group) or real, with the group's rank and size.
layout::WorldModel detect_world_model(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                                    const std::string& device_type);

}  // namespace dmuon::torch_adapter
