// The accumulator layouts that the sm_90a kernel's epilogues assume
// (csrc/ns/cuda/sm90_sym_epilogue.cuh), checked on the host against CuTe's own layouts; the
// kernel's launch repeats the check and refuses to run when it fails. No GPU needed.
#include <gtest/gtest.h>

#include "ns/cuda/sm90_sym_launch.cuh"

namespace {

namespace sm90 = dmuon::ns::cuda::sm90;
using dmuon::ns::cuda::Sm90Epilogue;
constexpr int kTmaStore = static_cast<int>(Sm90Epilogue::kTmaStore);
constexpr int kStaged = static_cast<int>(Sm90Epilogue::kStaged);
constexpr int kDirect = static_cast<int>(Sm90Epilogue::kDirect);

TEST(Sm90Fragments, TmaStoreAccumulatorsAreTheMmaFragmentLayout) {
  // The block epilogue (ldmatrix/stmatrix of 8×8 blocks) of the 1-CTA and 2-CTA kernels.
  EXPECT_TRUE((sm90::fragment_is_mma_layout<sm90::Traits<cutlass::half_t, 5, kTmaStore>>()));
  EXPECT_TRUE((sm90::fragment_is_mma_layout<sm90::Traits<cutlass::half_t, 4, kTmaStore>>()));
  EXPECT_TRUE((sm90::fragment_is_mma_layout<sm90::Traits<cutlass::bfloat16_t, 5, kTmaStore>>()));
  EXPECT_TRUE((sm90::fragment_is_mma_layout<sm90::Traits<cutlass::half_t, 5, kTmaStore, 2>>()));
  // The wide tmastore epilogue (128×256 units): the same layout over 256 columns.
  EXPECT_TRUE((sm90::fragment_is_mma_layout<sm90::Traits<cutlass::half_t, 4, kTmaStore, 1, 256>>()));
  EXPECT_TRUE((sm90::fragment_is_mma_layout<sm90::Traits<cutlass::bfloat16_t, 4, kTmaStore, 2, 256>>()));
}

TEST(Sm90Fragments, N256AccumulatorsSplitByColumnTile) {
  EXPECT_TRUE((sm90::fragment_tiles_split_by_column<sm90::Traits<cutlass::half_t, 3, kStaged, 1, 256>>()));
  EXPECT_TRUE((sm90::fragment_tiles_split_by_column<sm90::Traits<cutlass::bfloat16_t, 4, kDirect, 1, 256>>()));
}

TEST(Sm90Fragments, TheChecksCanFail) {
  // A 128×256 unit has twice the accumulators of a 128×128 tile: a count of one tile fails.
  using Wide = sm90::Traits<cutlass::half_t, 3, kStaged, 1, 256>;
  EXPECT_FALSE(sm90::every_accumulator<Wide>(Wide::kTileValues, [](int, int, int, int) { return true; }));
  // A false assumption about the layout is caught.
  using T = sm90::Traits<cutlass::half_t, 5, kTmaStore>;
  EXPECT_FALSE(sm90::every_accumulator<T>(T::kTileValues, [](int thread, int, int row, int) {
    return row == thread / 2;  // rows as if each thread held two whole rows
  }));
}

}  // namespace
