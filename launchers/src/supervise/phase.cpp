#include "phase.hpp"

namespace idist::launchers::supervision {

std::string_view phase_name(Phase phase) {
  switch (phase) {
    case Phase::starting: return "starting";
    case Phase::running: return "running";
    case Phase::stopping: return "stopping";
    case Phase::cleaning: return "cleaning";
    case Phase::awaiting_verdict: return "awaiting_verdict";
    case Phase::finishing: return "finishing";
    case Phase::done: return "done";
  }
  return "?";
}

bool may_enter(Phase from, Phase to) {
  using P = Phase;
  switch (from) {
    case P::starting: return to == P::running || to == P::finishing;
    case P::running:
      return to == P::stopping || to == P::cleaning || to == P::awaiting_verdict || to == P::starting ||
             to == P::finishing;
    case P::stopping: return to == P::awaiting_verdict || to == P::starting || to == P::finishing;
    case P::cleaning:
      return to == P::stopping || to == P::awaiting_verdict || to == P::starting || to == P::finishing;
    case P::awaiting_verdict: return to == P::starting || to == P::finishing;
    case P::finishing: return to == P::done;
    case P::done: return false;
  }
  return false;
}

}  // namespace idist::launchers::supervision
