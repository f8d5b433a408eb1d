// dmuon/torch/world_detect.cpp — the fake backend is recognised by its backend's name.
#include "world_detect.h"

namespace dmuon::torch_adapter {
namespace {

// The name of `group`'s backend for `type`, or "" when it has none.
std::string backend_name(const c10::intrusive_ptr<c10d::ProcessGroup>& group, c10::DeviceType type) {
  try {
    const auto backend = group->getBackend(type);
    return backend ? backend->getBackendName() : std::string();
  } catch (const std::exception&) {
    return std::string();  // NOTE: no backend registered for this device type
  }
}

}  // namespace

bool is_fake_group(const c10::intrusive_ptr<c10d::ProcessGroup>& group, const std::string& device_type) {
  if (!group) return false;
  // NOTE: a fake default group is of backend type CUSTOM (ProcessGroup::getBackendName() says
  // "custom"); the Backend object behind it is c10d::FakeProcessGroup, named "fake".
  if (group->getBackendName() == "fake") return true;
  try {
    if (group->getDefaultBackend()->getBackendName() == "fake") return true;
  } catch (const std::exception&) {
  }
  return backend_name(group, device_type == "cuda" ? c10::DeviceType::CUDA : c10::DeviceType::CPU) == "fake";
}

layout::WorldModel detect_world_model(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                                    const std::string& device_type) {
  if (!group) return layout::WorldModel();
  const layout::Transport transport = is_fake_group(group, device_type) ? layout::Transport::kFake : layout::Transport::kReal;
  return layout::WorldModel(transport, group->getRank(), group->getSize());
}

}  // namespace dmuon::torch_adapter
