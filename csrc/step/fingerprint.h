// dmuon/step/fingerprint.h — the fingerprint of pieces' bits (DeviceOps::fingerprint): how
// the step begun from backward learns, at step(), whether a gradient it read has changed.
//
// The sum, mod 2⁶⁴, over every element of every piece of a hash of (its bits, its piece's
// salt, its index in the piece). An integer sum is exact and commutative: the same on any
// device, launch shape or split of the pieces into calls, so unchanged bits give the same
// sum; one element changed always changes it (for a fixed salt and index the hash is a
// bijection of the bits), several cancel with probability 2⁻⁶⁴.
// NOTE: not a float norm: two norms compare bit for bit only when summed in one order, and a
// sign flipped or two entries swapped keep the norm.
#pragma once

#include <cstdint>

#include "common/check.h"
#include "common/host_device.h"
#include "step/synthetic.h"

namespace dmuon::step {

/// The key of a piece's salt (once per piece).
inline uint64_t fingerprint_key(uint64_t salt) { return synthetic_bits(0x6A09E667F3BCC909ull, salt); }

/// What element `index` of a piece keyed `key` adds to the sum, holding `bits` (its bytes,
/// zero-extended).
DMUON_HOST_DEVICE uint64_t fingerprint_term(uint64_t bits, uint64_t key, int64_t index) {
  return synthetic_bits(key ^ bits, static_cast<uint64_t>(index));
}

/// fn(Bits{}), Bits the unsigned integer of an element of `width` bytes (2, 4 or 8): what the
/// ops read an element's bits as.
template <typename Fn>
void with_element_bits(int64_t width, Fn&& fn) {
  switch (width) {
    case 2: return fn(uint16_t{});
    case 4: return fn(uint32_t{});
    case 8: return fn(uint64_t{});
    default: DMUON_FAIL("fingerprint: elements of 2, 4 or 8 bytes, not ", width);
  }
}

}  // namespace dmuon::step
