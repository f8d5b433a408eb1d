// dmuon/ns/cuda/sm90_sym_pingpong_f16.cu — f16 instances of the ping-pong symmetric kernel.
#include "ns/cuda/sm90_sym_pingpong.cuh"

namespace dmuon::ns::cuda::sm90 {
bool launch_pingpong_f16(const SymProductArgs& args, const Sm90SymConfig& config, cudaStream_t stream) {
  return launch_pingpong_instance<cutlass::half_t>(args, config, stream);
}
}  // namespace dmuon::ns::cuda::sm90
