// dmuon/ns/ns_algorithms.h — standard and Gram Newton–Schulz, written once over a
// backend's batched primitives so that the CPU and CUDA backends run the same steps.
//
// A Backend provides, for its iterate storage type `Elem`:
//   sym_product(alpha, A, B, beta, C, D)  D = α·A·Bᵀ + β·C, known to be symmetric
//                                         (A·Aᵀ, or A·B of commuting symmetric A, B);
//                                         C may be null when β = 0; D aliases nothing.
//   gemm(alpha, A, B, beta, C, D)         D = α·A·B + β·C (dense); D aliases nothing.
//   add_identity(Z, a, Q)                 Q = Z + a·I.
// Every matrix is a BatchedMatrix<Elem> holding the whole batch; X is m×n with m ≤ n,
// already normalized by the caller. Each function returns the buffer holding the result.
#pragma once

#include <utility>

#include "common/check.h"
#include "ns/batched_matrix.h"
#include "ns/schedule.h"

namespace dmuon::ns {

/// Workspace of the standard iteration: two m×n iterates, two m×m matrices.
template <typename Elem>
struct StandardWorkspace {
  BatchedMatrix<Elem> x_alt;  // [batch, m, n]
  BatchedMatrix<Elem> gram;   // [batch, m, m]  A = X·Xᵀ
  BatchedMatrix<Elem> poly;   // [batch, m, m]  B = b·A + c·A²
};

/// Workspace of the Gram iteration: two m×n iterates, five m×m matrices.
template <typename Elem>
struct GramWorkspace {
  BatchedMatrix<Elem> x_alt;  // [batch, m, n]
  BatchedMatrix<Elem> r;      // [batch, m, m]  Gram matrix of the current iterate
  BatchedMatrix<Elem> z;      // [batch, m, m]  Z = b·R + c·R²
  BatchedMatrix<Elem> s;      // [batch, m, m]  S = R·(Z + a·I)
  BatchedMatrix<Elem> q;      // [batch, m, m]  accumulated polynomial Q (X_k = Q·X)
  BatchedMatrix<Elem> q_alt;  // [batch, m, m]
};

/// Standard quintic NS: for each step, A = X·Xᵀ, B = c·A² + b·A, X ← B·X + a·X.
template <typename Backend, typename Elem>
BatchedMatrix<Elem> run_standard_ns(Backend& backend, const Schedule& schedule,
                                    BatchedMatrix<Elem> x, StandardWorkspace<Elem> ws) {
  DMUON_CHECK(x.rows <= x.cols, "standard NS expects a wide iterate, got ", x.rows, "x", x.cols);
  for (const Coefficients& c : schedule.steps) {
    backend.sym_product(1.0, x, x, 0.0, nullptr, ws.gram);
    backend.sym_product(c.c, ws.gram, ws.gram, c.b, &ws.gram, ws.poly);
    backend.gemm(1.0, ws.poly, x, c.a, &x, ws.x_alt);
    std::swap(x, ws.x_alt);
  }
  return x;
}

/// Gram NS (DESIGN.md §3). Keeps X fixed and accumulates Q with X_k = Q·X_0:
///   Z = c·R² + b·R
///   Q ← Z·Q + a·Q        (first step after a (re)start: Q = Z + a·I)
///   S = R·Z + a·R        (= R·(Z + a·I))
///   R ← Z·S + a·S        (= (Z + a·I)·R·(Z + a·I), the next iterate's Gram matrix)
/// The a·I term stays in β of the products so it is never rounded into a half-precision
/// intermediate. After each iteration listed in restart_after: X ← Q·X, R ← X·Xᵀ, Q ← I.
/// The last iteration skips the R update; the result is Q·X.
template <typename Backend, typename Elem>
BatchedMatrix<Elem> run_gram_ns(Backend& backend, const Schedule& schedule,
                                BatchedMatrix<Elem> x, GramWorkspace<Elem> ws) {
  DMUON_CHECK(x.rows <= x.cols, "Gram NS expects a wide iterate, got ", x.rows, "x", x.cols);
  const int num_steps = static_cast<int>(schedule.steps.size());
  size_t restart_idx = 0;
  bool q_is_identity = true;
  backend.sym_product(1.0, x, x, 0.0, nullptr, ws.r);

  for (int step = 1; step <= num_steps; ++step) {
    const Coefficients& c = schedule.steps[static_cast<size_t>(step - 1)];
    const bool restart_here = restart_idx < schedule.restart_after.size() &&
                              schedule.restart_after[restart_idx] == step && step < num_steps;
    const bool last = step == num_steps;

    // Z and the accumulated polynomial.
    backend.sym_product(c.c, ws.r, ws.r, c.b, &ws.r, ws.z);
    if (q_is_identity) {
      backend.add_identity(ws.z, c.a, ws.q);
      q_is_identity = false;
    } else {
      backend.sym_product(1.0, ws.z, ws.q, c.a, &ws.q, ws.q_alt);
      std::swap(ws.q, ws.q_alt);
    }

    // Next Gram matrix, unless it is about to be rebuilt or never used again.
    if (restart_here) {
      backend.gemm(1.0, ws.q, x, 0.0, nullptr, ws.x_alt);
      std::swap(x, ws.x_alt);
      backend.sym_product(1.0, x, x, 0.0, nullptr, ws.r);
      q_is_identity = true;
      ++restart_idx;
    } else if (!last) {
      backend.sym_product(1.0, ws.r, ws.z, c.a, &ws.r, ws.s);
      backend.sym_product(1.0, ws.z, ws.s, c.a, &ws.s, ws.r);
    }
  }
  if (q_is_identity) return x;  // NOTE: only when num_steps == 0, which validate() forbids.
  backend.gemm(1.0, ws.q, x, 0.0, nullptr, ws.x_alt);
  return ws.x_alt;
}

}  // namespace dmuon::ns
