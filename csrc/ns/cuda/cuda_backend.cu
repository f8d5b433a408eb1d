// dmuon/ns/cuda/cuda_backend.cu — the CUDA backend of ns_algorithms.h and its entry point.
#include "ns/cuda/cuda_backend.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "common/check.h"
#include "ns/cuda/cublaslt_gemm.h"
#include "ns/cuda/cuda_check.h"
#include "ns/cuda/elementwise.h"
#include "ns/cuda/sm90_sym_product.h"
#include "ns/ns_algorithms.h"

namespace dmuon::ns::cuda {
namespace {

// NOTE: cuBLASLt's heuristic picks faster split/stream-K algorithms when it may use
// scratch space; 32 MiB is what cuBLAS itself reserves per stream on Hopper.
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
constexpr size_t kAlign = 256;

size_t align_up(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Backend primitives (ns_algorithms.h) over whole batches, enqueued on one stream.
template <typename Elem>
struct CudaBackend {
  DType dtype;
  SymMode sym_mode;
  void* cublas_workspace;
  cudaStream_t stream;

  void sym_product(double alpha, BatchedMatrix<Elem> a, BatchedMatrix<Elem> b, double beta,
                   const BatchedMatrix<Elem>* c, BatchedMatrix<Elem> d) {
    SymProductArgs args;
    args.dtype = dtype;
    args.batch = d.batch;
    args.m = d.rows;
    args.k = a.cols;
    args.a = a.data, args.lda = a.ld, args.stride_a = a.batch_stride;
    args.b = b.data, args.ldb = b.ld, args.stride_b = b.batch_stride;
    if (c != nullptr) args.c = c->data, args.ldc = c->ld, args.stride_c = c->batch_stride;
    args.d = d.data, args.ldd = d.ld, args.stride_d = d.batch_stride;
    args.alpha = alpha;
    args.beta = c == nullptr ? 0.0 : beta;
    run_sym_product(args, sym_mode, cublas_workspace, stream);
  }

  void gemm(double alpha, BatchedMatrix<Elem> a, BatchedMatrix<Elem> b, double beta,
            const BatchedMatrix<Elem>* c, BatchedMatrix<Elem> d) {
    GemmDesc g;
    g.dtype = dtype;
    g.batch = d.batch, g.m = d.rows, g.n = d.cols, g.k = a.cols;
    g.lda = a.ld, g.stride_a = a.batch_stride, g.ldb = b.ld, g.stride_b = b.batch_stride;
    g.ldd = d.ld, g.stride_d = d.batch_stride;
    if (c != nullptr) g.ldc = c->ld, g.stride_c = c->batch_stride;
    cuda::gemm(g, alpha, a.data, b.data, c == nullptr ? 0.0 : beta, c == nullptr ? nullptr : c->data,
               d.data, cublas_workspace, kCublasWorkspaceBytes, stream);
  }

  void add_identity(BatchedMatrix<Elem> z, double a, BatchedMatrix<Elem> q) {
    DMUON_CHECK(z.ld == q.ld && z.batch_stride == q.batch_stride, "add_identity: layouts differ");
    cuda::add_identity(dtype, z.data, a, q.data, z.batch, z.rows, z.ld, z.batch_stride, stream);
  }

  static void run_sym_product(const SymProductArgs& args, SymMode mode, void* workspace,
                              cudaStream_t stream) {
    if (mode == SymMode::kKernel) {
#if defined(DMUON_WITH_SM90_SYM)
      sm90_sym_product(args, Sm90SymConfig{}, stream);
      return;
#else
      DMUON_FAIL("the sm_90a symmetric kernel is not part of this build (no CUTLASS headers)");
#endif
    }
    // Portable path: dense product, then the lower triangle mirrored onto the upper one.
    GemmDesc g;
    g.dtype = args.dtype;
    g.transpose_b = true;
    g.batch = args.batch, g.m = args.m, g.n = args.m, g.k = args.k;
    g.lda = args.lda, g.stride_a = args.stride_a, g.ldb = args.ldb, g.stride_b = args.stride_b;
    g.ldc = args.ldc, g.stride_c = args.stride_c, g.ldd = args.ldd, g.stride_d = args.stride_d;
    cuda::gemm(g, args.alpha, args.a, args.b, args.beta, args.c, args.d, workspace,
               workspace == nullptr ? 0 : kCublasWorkspaceBytes, stream);
    mirror_lower(args.dtype, args.d, args.batch, args.m, args.ldd, args.stride_d, stream);
  }
};

// Carves the workspace into 256-byte aligned regions, in order.
struct Carver {
  char* base;
  size_t offset = 0;
  void* take(size_t bytes) {
    void* p = base == nullptr ? nullptr : base + offset;
    offset += align_up(bytes);
    return p;
  }
};

// Lay out the workspace (also used with base = nullptr to size it).
struct Layout {
  float* sum_squares;  // [batch]
  void* x;             // [batch, m, ld_n]
  void* x_alt;         // [batch, m, ld_n]
  void* mm[5];         // [batch, m, ld_m] each
  void* cublas;        // kCublasWorkspaceBytes
  size_t bytes;
};

Layout layout_workspace(void* base, Algorithm algorithm, int64_t batch, int64_t m, int64_t n) {
  Carver carver{static_cast<char*>(base)};
  Layout l{};
  const size_t elem = 2;
  const size_t mn = static_cast<size_t>(batch * m * padded_ld(n)) * elem;
  const size_t mm = static_cast<size_t>(batch * m * padded_ld(m)) * elem;
  l.sum_squares = static_cast<float*>(carver.take(sizeof(float) * static_cast<size_t>(batch)));
  l.x = carver.take(mn);
  l.x_alt = carver.take(mn);
  const int num_mm = algorithm == Algorithm::kGram ? 5 : 2;
  for (int i = 0; i < num_mm; ++i) l.mm[i] = carver.take(mm);
  l.cublas = carver.take(kCublasWorkspaceBytes);
  l.bytes = carver.offset;
  return l;
}

template <typename Elem>
void orthogonalize_typed(const Schedule& schedule, DType dtype, SymMode sym_mode,
                         const float* input, float* output, int64_t batch, int64_t rows,
                         int64_t cols, const Layout& ws, cudaStream_t stream) {
  const bool transposed = rows > cols;
  const int64_t m = transposed ? cols : rows, n = transposed ? rows : cols;
  const int64_t ld_n = padded_ld(n), ld_m = padded_ld(m);

  // Normalize in fp32 and cast into the wide, padded iterate.
  sum_squares(input, batch, rows * cols, ws.sum_squares, stream);
  normalize_cast(dtype, input, batch, rows, cols, transposed, ws.sum_squares, schedule.eps, ws.x,
                 ld_n, stream);

  auto iterate = [&](void* p) {
    return BatchedMatrix<Elem>{static_cast<Elem*>(p), batch, m, n, ld_n, m * ld_n};
  };
  auto square = [&](void* p) {
    return BatchedMatrix<Elem>{static_cast<Elem*>(p), batch, m, m, ld_m, m * ld_m};
  };
  CudaBackend<Elem> backend{dtype, sym_mode, ws.cublas, stream};
  BatchedMatrix<Elem> result;
  if (schedule.algorithm == Algorithm::kStandard) {
    StandardWorkspace<Elem> w{iterate(ws.x_alt), square(ws.mm[0]), square(ws.mm[1])};
    result = run_standard_ns(backend, schedule, iterate(ws.x), w);
  } else {
    GramWorkspace<Elem> w{iterate(ws.x_alt), square(ws.mm[0]), square(ws.mm[1]),
                          square(ws.mm[2]),  square(ws.mm[3]), square(ws.mm[4])};
    result = run_gram_ns(backend, schedule, iterate(ws.x), w);
  }
  write_back(dtype, result.data, ld_n, batch, rows, cols, transposed, output, stream);
}

}  // namespace

bool sym_kernel_built() {
#if defined(DMUON_WITH_SM90_SYM)
  return true;
#else
  return false;
#endif
}

bool sym_kernel_supported(int device) {
  if (!sym_kernel_built()) return false;
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
    cudaGetLastError();  // NOTE: clear the sticky-free error so later calls are unaffected.
    return false;
  }
  return major == 9 && minor == 0;
}

int64_t padded_ld(int64_t cols) { return (cols + 7) / 8 * 8; }

size_t workspace_bytes(Algorithm algorithm, int64_t batch, int64_t rows, int64_t cols) {
  const int64_t m = std::min(rows, cols), n = std::max(rows, cols);
  return layout_workspace(nullptr, algorithm, batch, m, n).bytes;
}

void orthogonalize(const Schedule& schedule, DType dtype, SymMode sym_mode, const float* input,
                   float* output, int64_t batch, int64_t rows, int64_t cols, void* workspace,
                   size_t workspace_size, cudaStream_t stream) {
  schedule.validate();
  DMUON_CHECK(batch >= 1 && rows >= 1 && cols >= 1, "orthogonalize: invalid shape [", batch, ", ",
              rows, ", ", cols, "]");
  DMUON_CHECK(reinterpret_cast<uintptr_t>(workspace) % kAlign == 0,
              "orthogonalize: workspace must be 256-byte aligned");
  const int64_t m = std::min(rows, cols), n = std::max(rows, cols);
  const Layout ws = layout_workspace(workspace, schedule.algorithm, batch, m, n);
  DMUON_CHECK(workspace_size >= ws.bytes, "orthogonalize: workspace of ", workspace_size,
              " bytes, needs ", ws.bytes);
  if (dtype == DType::kFloat16)
    orthogonalize_typed<__half>(schedule, dtype, sym_mode, input, output, batch, rows, cols, ws, stream);
  else
    orthogonalize_typed<__nv_bfloat16>(schedule, dtype, sym_mode, input, output, batch, rows, cols, ws, stream);
}

void sym_product(const SymProductArgs& args, SymMode mode, cudaStream_t stream) {
  CudaBackend<__half>::run_sym_product(args, mode, nullptr, stream);
}

}  // namespace dmuon::ns::cuda
