// dmuon/common/env.h — one typed, cached accessor for DMUON_* environment knobs.
//
// NOTE: modelled on NCCL's NCCL_PARAM: every knob is read once, parsed with a clear
// error on a malformed value, and cached for the life of the process. The README's
// table of knobs lists every name used with these functions.
#pragma once

#include <cstdint>
#include <string>

namespace dmuon::env {

/// Integer knob; throws dmuon::Error naming the variable if its value is not an integer.
int64_t get_int(const char* name, int64_t default_value);

/// Boolean knob: 1/0, true/false, yes/no, on/off (case-insensitive).
bool get_bool(const char* name, bool default_value);

/// Floating-point knob.
double get_double(const char* name, double default_value);

/// String knob (returned verbatim, default when unset or empty).
std::string get_string(const char* name, const std::string& default_value);

/// Forget cached values (tests only).
void clear_cache_for_testing();

}  // namespace dmuon::env
