// dmuon/ns/cuda/tri_plan.cpp — the portable symmetric products' plans (see tri_plan.h).
#include "ns/cuda/tri_plan.h"

#include <algorithm>

#include "common/check.h"

namespace dmuon::ns::cuda {

std::vector<TriPanel> tri_panels(int64_t m, int64_t block) {
  DMUON_CHECK(m >= 1, "tri_panels: m = ", m, " (must be >= 1)");
  DMUON_CHECK(block >= kTriBlockQuantum && block % kTriBlockQuantum == 0, "tri_panels: block = ", block,
              " (must be a positive multiple of ", kTriBlockQuantum, ")");
  std::vector<TriPanel> panels;
  for (int64_t row0 = 0; row0 < m; row0 += block) {
    const int64_t rows = std::min(block, m - row0);
    panels.push_back({row0, rows, row0 + rows});
  }
  return panels;
}

std::string tri_name(int64_t block) { return "tri:" + std::to_string(block); }

namespace {

// The block of "<prefix><block>" (a positive multiple of kTriBlockQuantum); −1 otherwise.
int64_t parse_block_name(const std::string& config, const std::string& prefix) {
  const size_t n = prefix.size();
  if (config.rfind(prefix, 0) != 0 || config.size() == n || config.size() > n + 9) return -1;
  int64_t value = 0;
  for (size_t i = n; i < config.size(); ++i) {
    if (config[i] < '0' || config[i] > '9') return -1;
    value = value * 10 + (config[i] - '0');
  }
  return value >= kTriBlockQuantum && value % kTriBlockQuantum == 0 ? value : -1;
}

int64_t round_up_block(int64_t rows) { return (rows + kTriBlockQuantum - 1) / kTriBlockQuantum * kTriBlockQuantum; }

}  // namespace

int64_t parse_tri(const std::string& config) { return parse_block_name(config, "tri:"); }

std::vector<int64_t> tri_block_candidates(int64_t m) {
  std::vector<int64_t> blocks;
  if (m < 2 * kTriBlockQuantum) return blocks;
  for (int64_t k : {2, 3, 4, 6, 8, 12, 16}) {
    const int64_t block = round_up_block((m + k - 1) / k);
    if (block < m && std::find(blocks.begin(), blocks.end(), block) == blocks.end()) blocks.push_back(block);
  }
  return blocks;
}

int64_t tri_default_block(int64_t m) {
  if (m < 2 * kTriBlockQuantum) return round_up_block(std::max<int64_t>(m, 1));
  return round_up_block((m + 3) / 4);
}

BlockPlan block_plan(int64_t m, int64_t block) {
  DMUON_CHECK(m >= 1, "block_plan: m = ", m, " (must be >= 1)");
  DMUON_CHECK(block >= kTriBlockQuantum && block % kTriBlockQuantum == 0, "block_plan: block = ", block,
              " (must be a positive multiple of ", kTriBlockQuantum, ")");
  BlockPlan plan;
  plan.block = block;
  plan.num_block_rows = m / block;
  plan.num_blocks = plan.num_block_rows * (plan.num_block_rows + 1) / 2;
  const int64_t row0 = plan.num_block_rows * block;
  plan.remainder = {row0, m - row0, row0 == m ? 0 : m};
  return plan;
}

std::string blk_name(int64_t block) { return "blk:" + std::to_string(block); }

int64_t parse_blk(const std::string& config) { return parse_block_name(config, "blk:"); }

std::vector<int64_t> blk_block_candidates(int64_t m) {
  std::vector<int64_t> blocks;
  for (int64_t block : {128, 256, 384, 512})
    if (2 * block <= m) blocks.push_back(block);
  return blocks;
}

int64_t blk_default_block(int64_t m) { return m >= 4 * kTriBlockQuantum ? 2 * kTriBlockQuantum : kTriBlockQuantum; }

int64_t common_alignment(const std::vector<uint64_t>& byte_offsets) {
  uint64_t alignment = 256;
  for (uint64_t offset : byte_offsets)
    while (offset % alignment != 0) alignment /= 2;
  return static_cast<int64_t>(alignment);
}

}  // namespace dmuon::ns::cuda
