// dmuon/step/device_ops.cpp — the argument check every DeviceOps shares.
#include "step/device_ops.h"

#include "common/check.h"

namespace dmuon::step {

void check_batch_rows(const char* what, const NsBatchDesc& batch, int64_t matrix_idx, int64_t row_begin,
                      int64_t row_count, int64_t numel) {
  DMUON_CHECK(matrix_idx >= 0 && matrix_idx < batch.count && row_begin >= 0 && row_count >= 0 &&
                  row_begin + row_count <= batch.rows && numel == row_count * batch.cols,
              what, ": rows [", row_begin, ", ", row_begin + row_count, ") of matrix ", matrix_idx, " with ", numel,
              " elements, in a batch of ", batch.count, " ", batch.rows, "x", batch.cols);
}

}  // namespace dmuon::step
