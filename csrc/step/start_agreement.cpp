// dmuon/step/start_agreement.cpp — the step's start agreement (see start_agreement.h).
#include "step/start_agreement.h"

#include <sstream>

#include "common/check.h"
#include "plan/hash.h"

namespace dmuon::step {
namespace {

// Slots of the agreement (all reduced by max). NOTE: max over ranks of (x, −x) gives max
// and −min: every rank holds the same x iff both are its own.
enum Slot : size_t {
  kSignatureHi,
  kSignatureHiNeg,
  kSignatureLo,
  kSignatureLoNeg,
  kPresenceHi,
  kPresenceHiNeg,
  kPresenceLo,
  kPresenceLoNeg,
  kFailed,      // 1 where a rank's checks failed
  kNonfinite,   // count − first non-finite gradient (0: none): the smallest index wins
  kCorrupt,     // count − first corrupt momentum buffer
  kChanged,
  kNumSlots,
};
static_assert(kNumSlots == kStartAgreementValues, "start_agreement.h states the agreement's size");

void put_hash(std::vector<int64_t>& v, size_t at, uint64_t hash) {
  const int64_t hi = static_cast<int64_t>(hash >> 32), lo = static_cast<int64_t>(hash & 0xffffffffu);
  v[at] = hi, v[at + 1] = -hi, v[at + 2] = lo, v[at + 3] = -lo;
}
bool same_hash(const std::vector<int64_t>& v, const std::vector<int64_t>& agreed, size_t at) {
  for (size_t k = at; k < at + 4; ++k)
    if (v[k] != agreed[k]) return false;
  return true;
}

std::string ranks_list(const std::vector<int>& ranks) {
  std::ostringstream out;
  out << "[";
  for (size_t k = 0; k < ranks.size(); ++k) out << (k ? ", " : "") << ranks[k];
  out << "]";
  return out.str();
}

// What each rank sends when the agreement failed: its error, its structure and its
// gradients' presence, separated by unit separators.
constexpr char kField = '\x1f', kLine = '\x1e';

std::string encode(const StartChecks& checks, const StartFacts& facts) {
  std::string out = checks.error;
  out += kField;
  for (size_t k = 0; k < checks.describe.size(); ++k) out += (k ? std::string(1, kLine) : "") + checks.describe[k];
  out += kField;
  for (bool h : facts.has_grad) out += h ? '1' : '0';
  return out;
}

struct RankView {
  std::string error;
  std::vector<std::string> describe;
  std::string has_grad;
};

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out(1);
  for (char c : text) {
    if (c == sep) out.emplace_back();
    else out.back() += c;
  }
  return out;
}

RankView decode(const std::string& text) {
  const std::vector<std::string> fields = split(text, kField);
  DMUON_CHECK(fields.size() == 3, "the start agreement's details arrived malformed (", fields.size(), " fields)");
  RankView view{fields[0], {}, fields[2]};
  if (!fields[1].empty()) view.describe = split(fields[1], kLine);
  return view;
}

// The first part of the structure that is not the same on every rank, in words.
std::string first_difference(const std::vector<RankView>& views) {
  size_t parts = 0;
  for (const RankView& v : views) parts = std::max(parts, v.describe.size());
  for (size_t g = 0; g < parts; ++g) {
    std::vector<int> having, missing;
    bool same = true;
    for (size_t r = 0; r < views.size(); ++r) {
      const bool has = g < views[r].describe.size();
      (has ? having : missing).push_back(static_cast<int>(r));
      same = same && has && views[r].describe[g] == views[0].describe[g];
    }
    if (same) continue;
    std::ostringstream out;
    if (!missing.empty()) {
      out << "param group " << g << " (" << views[static_cast<size_t>(having.front())].describe[g] << ") exists on rank(s) "
          << ranks_list(having) << " but not on rank(s) " << ranks_list(missing);
      return out.str();
    }
    out << "param group " << g << " differs across ranks (";
    for (size_t r = 0; r < views.size(); ++r) out << (r ? "; " : "") << "rank " << r << ": " << views[r].describe[g];
    out << ")";
    return out.str();
  }
  return "the param groups' structure differs across ranks";
}

}  // namespace

StartAgreed agree_start(Transport& transport, const StartChecks& checks, const StartFacts& facts, int64_t step_idx,
                        const std::function<std::string(int)>& what_of) {
  const int world = transport.world_size();
  const int64_t count = static_cast<int64_t>(facts.has_grad.size());
  StartAgreed agreed;
  if (world == 1) {
    DMUON_CHECK(checks.error.empty(), checks.error);
    agreed.first_nonfinite = facts.first_nonfinite;
    agreed.first_corrupt = facts.first_corrupt;
    agreed.changed = checks.changed;
    return agreed;
  }
  std::vector<int64_t> local(kNumSlots, 0);
  put_hash(local, kSignatureHi, checks.signature);
  plan::Hasher presence;
  presence.i64(count);
  for (bool h : facts.has_grad) presence.i64(h ? 1 : 0);
  put_hash(local, kPresenceHi, presence.digest());
  local[kFailed] = checks.error.empty() ? 0 : 1;
  local[kNonfinite] = facts.first_nonfinite < 0 ? 0 : count - facts.first_nonfinite;
  local[kCorrupt] = facts.first_corrupt < 0 ? 0 : count - facts.first_corrupt;
  local[kChanged] = checks.changed ? 1 : 0;
  const std::string at = step_name(step_idx);
  const std::vector<int64_t> all =
      transport.all_reduce(local, ReduceOp::kMax, "all_reduce of the start agreement (" + at + ")");
  DMUON_CHECK(all.size() == local.size(), "the start agreement returned ", all.size(), " values for ", local.size());
  const bool same_structure = same_hash(local, all, kSignatureHi);
  const bool same_presence = same_hash(local, all, kPresenceHi);
  if (all[kFailed] == 0 && same_structure && same_presence) {
    agreed.first_nonfinite = all[kNonfinite] == 0 ? -1 : static_cast<int>(count - all[kNonfinite]);
    agreed.first_corrupt = all[kCorrupt] == 0 ? -1 : static_cast<int>(count - all[kCorrupt]);
    agreed.changed = all[kChanged] != 0;
    return agreed;
  }

  // NOTE: only on failure (every rank is here): each rank's texts, to name the cause.
  std::vector<RankView> views;
  for (const std::string& text :
       transport.all_gather(encode(checks, facts), "all_gather of the failed start agreement's details (" + at + ")"))
    views.push_back(decode(text));
  if (all[kFailed] != 0) {
    DMUON_CHECK(checks.error.empty(), checks.error);
    int rank = 0;
    while (rank < world && views[static_cast<size_t>(rank)].error.empty()) ++rank;
    DMUON_FAIL("dmuon ", at, ": rank ", rank, " failed its checks before writing anything, so no rank stepped: ",
               rank < world ? views[static_cast<size_t>(rank)].error : std::string("(its error did not arrive)"));
  }
  // NOTE: every rank compares the same gathered texts: all raise the same message.
  bool structures_differ = false;
  for (const RankView& v : views) structures_differ = structures_differ || v.describe != views[0].describe;
  if (!same_structure || structures_differ)
    DMUON_FAIL("dmuon ", at, ": ", first_difference(views),
               "; add_param_group (and every change to param groups) must happen on every rank");
  for (int64_t i = 0; i < count; ++i) {
    int64_t having = 0;
    for (const RankView& v : views)
      having += static_cast<int64_t>(i) < static_cast<int64_t>(v.has_grad.size()) && v.has_grad[static_cast<size_t>(i)] == '1';
    if (having != 0 && having != world)
      DMUON_FAIL(what_of(static_cast<int>(i)), " has a gradient on ", having, " of ", world, " ranks at ", at,
                 "; every rank must have it or none");
  }
  DMUON_FAIL("dmuon ", at, ": the ranks step different parameters (", count, " here); every rank must build the "
             "same optimizer");
}

}  // namespace dmuon::step
