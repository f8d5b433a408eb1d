// dmuon/ns/cuda/sm90_sym_product_bf16.cu — bf16 instances of the sm_90a symmetric kernel.
#include "ns/cuda/sm90_sym_launch.cuh"

namespace dmuon::ns::cuda::sm90 {
bool launch_bf16(const SymProductArgs& args, const Sm90SymConfig& config, cudaStream_t stream) {
  return launch_instance<cutlass::bfloat16_t>(args, config, stream);
}
}  // namespace dmuon::ns::cuda::sm90
