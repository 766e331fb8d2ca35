// --forward-signals: which signals idist-run passes on to the ranks.
#include <signal.h>

#include <algorithm>
#include <cctype>
#include <stdexcept>

#include "idist/launchers/signals.hpp"
#include "signal_list.hpp"

namespace idist::launchers {
namespace {

std::string upper(std::string_view text) {
  std::string out(text);
  for (auto& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

std::vector<int> parse_signal_list(std::string_view text) {
  std::vector<int> signals;
  if (upper(text) == "NONE") return signals;
  std::string choices;
  for (const auto& s : detail::kForwardable) choices += (choices.empty() ? "" : ", ") + std::string(s.name);
  while (true) {
    const auto comma = text.find(',');
    const std::string name = upper(text.substr(0, comma));
    const std::string bare = name.starts_with("SIG") ? name.substr(3) : name;
    const auto* found = std::find_if(std::begin(detail::kForwardable), std::end(detail::kForwardable),
                                     [&](const detail::NamedSignal& s) { return bare == s.name; });
    if (found == std::end(detail::kForwardable))
      throw std::invalid_argument("'" + std::string(text.substr(0, comma)) + "' is not a signal idist-run forwards (" +
                                  choices + ", or none)");
    if (std::find(signals.begin(), signals.end(), found->number) == signals.end()) signals.push_back(found->number);
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return signals;
}

}  // namespace idist::launchers
