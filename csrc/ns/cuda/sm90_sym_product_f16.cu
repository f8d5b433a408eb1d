// dmuon/ns/cuda/sm90_sym_product_f16.cu — fp16 instances of the sm_90a symmetric kernel.
#include "ns/cuda/sm90_sym_launch.cuh"

namespace dmuon::ns::cuda::sm90 {
bool launch_f16(const SymProductArgs& args, const Sm90SymConfig& config, cudaStream_t stream) {
  return launch_instance<cutlass::half_t>(args, config, stream);
}
}  // namespace dmuon::ns::cuda::sm90
