// dmuon/ns/cuda/sm90_sym_device.cpp — the sm_90a kernel's configuration rules
// (sm90_sym_config.h) applied on the current CUDA device.
#include <cuda_runtime.h>

#include "ns/cuda/sm90_sym_product.h"

namespace dmuon::ns::cuda {

std::string sm90_sym_config_rejects(const SymProductArgs& args, const Sm90SymConfig& config) {
  // NOTE: only the split-K configurations depend on the device (their scratch is per CTA).
  int num_sms = 0;
  if (config.split_k) {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
      cudaGetLastError();
      num_sms = 0;
    }
  }
  return sm90_sym_config_rejects(args, config, num_sms);
}

}  // namespace dmuon::ns::cuda
