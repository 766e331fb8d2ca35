#pragma once
// Limits a plan is checked against, shared by the files that make plans and rank environments.

namespace idist::launchers {

// What the env contract accepts (lib/src/env_contract.cpp).
inline constexpr int kMaxRanks = 1 << 24;

}  // namespace idist::launchers
