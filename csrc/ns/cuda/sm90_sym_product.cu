// dmuon/ns/cuda/sm90_sym_product.cu — checked dispatch of the sm_90a
// symmetric kernel (the kernel: sm90_sym_kernel.cuh; its instances: sm90_sym_instances.def, compiled
// per element type in *_f16/_bf16.cu).
#include "ns/cuda/sm90_sym_product.h"

#include <string>

#include "common/check.h"

namespace dmuon::ns::cuda {

void sm90_sym_product(const SymProductArgs& args, const Sm90SymConfig& config, cudaStream_t stream) {
  const std::string why = sm90_sym_config_rejects(args, config);
  DMUON_CHECK(why.empty(), "sm90_sym_product (", config.name(), "): ", why);
  const bool built = args.dtype == DType::kFloat16 ? sm90::launch_f16(args, config, stream)
                                                   : sm90::launch_bf16(args, config, stream);
  DMUON_CHECK(built, "sm90_sym_product: configuration ", config.name(), " is not built");
}

}  // namespace dmuon::ns::cuda
