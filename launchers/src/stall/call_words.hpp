#pragma once
// How the stall and mismatch reports word a recorded call and the ranks in it, shared by both
// (stall_report.cpp, mismatch_report.cpp) so that a call reads the same in either.

#include <cstdint>
#include <string>
#include <vector>

#include "stall_report.hpp"

namespace idist::launchers::detail::call_words {

std::string group_name(std::int32_t g);  // "world", "new_group #2"
std::string seconds(std::int64_t ns);    // "2.5 s"
// Its arguments: "float32, 2 elements, root 0", "float32 MAX, 2 elements"; "" for a barrier.
// SUM, the default, is named only with `with_sum` (ranks that differ in the op).
std::string details(const Recorded& r, bool with_sum = false);
// What a call was: "all_reduce (float32, 2 elements)", "barrier".
std::string what(const Recorded& r, bool with_sum = false);
bool collective(const Recorded& s);
// The same op with the same arguments (its place in the group's order aside).
bool same_call(const Recorded& a, const Recorded& b);
std::string list(const std::vector<int>& ranks);  // "rank 1", "ranks 0, 2"

}  // namespace idist::launchers::detail::call_words
