// dmuon/step/transport.cpp — texts over a transport's all_reduce.
#include "step/transport.h"

#include <algorithm>
#include <cstring>

#include "common/check.h"

namespace dmuon::step {
namespace {

// Texts as int64 words (8 bytes each, zero-padded): a sum where every slot has one
// contributor moves them unchanged.
// NOTE: plans and a failed agreement's details are a few KiB, sent when a runtime is made
// or a step is refused, so one collective kind serves them beside the flags.
int64_t words_of(int64_t bytes) { return (bytes + 7) / 8; }

// `local` (a length per slot, 0 where another rank fills it) summed over the ranks.
std::vector<int64_t> lengths(Transport& t, std::vector<int64_t> local, const std::string& what) {
  std::vector<int64_t> all = t.all_reduce(local, ReduceOp::kSum, what + " (the lengths)");
  for (int64_t n : all) DMUON_CHECK(n >= 0, "dmuon: ", what, " on rank ", t.rank(), ": a negative length ", n, " arrived");
  return all;
}

std::string text_at(const std::vector<int64_t>& words, int64_t first_word, int64_t bytes) {
  std::string text(static_cast<size_t>(bytes), '\0');
  if (bytes > 0) std::memcpy(text.data(), words.data() + first_word, static_cast<size_t>(bytes));
  return text;
}

}  // namespace

std::string Transport::broadcast(const std::string& text, const std::string& what) {
  if (world_size() == 1 || !moves_data()) return text;
  const int64_t bytes = lengths(*this, {rank() == 0 ? static_cast<int64_t>(text.size()) : 0}, what)[0];
  if (bytes == 0) return std::string();
  std::vector<int64_t> words(static_cast<size_t>(words_of(bytes)), 0);
  if (rank() == 0) std::memcpy(words.data(), text.data(), text.size());
  return text_at(all_reduce(words, ReduceOp::kSum, what + " (its text)"), 0, bytes);
}

std::vector<std::string> Transport::all_gather(const std::string& text, const std::string& what) {
  const size_t world = static_cast<size_t>(world_size());
  if (world == 1 || !moves_data()) return std::vector<std::string>(world, text);
  std::vector<int64_t> mine(world, 0);
  mine[static_cast<size_t>(rank())] = static_cast<int64_t>(text.size());
  const std::vector<int64_t> bytes = lengths(*this, std::move(mine), what);
  const int64_t row = words_of(*std::max_element(bytes.begin(), bytes.end()));
  if (row == 0) return std::vector<std::string>(world);
  std::vector<int64_t> words(world * static_cast<size_t>(row), 0);
  std::memcpy(words.data() + rank() * row, text.data(), text.size());
  words = all_reduce(words, ReduceOp::kSum, what + " (the texts)");
  std::vector<std::string> out;
  for (size_t r = 0; r < world; ++r) out.push_back(text_at(words, static_cast<int64_t>(r) * row, bytes[r]));
  return out;
}

}  // namespace dmuon::step
