#include "idist/launchers/hostlist.hpp"

#include <charconv>
#include <cstdint>

namespace idist::launchers {
namespace {

bool is_separator(char c) { return c == ',' || c == ' ' || c == '\t' || c == '\n'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

struct Parser {
  std::string_view list;

  [[noreturn]] void fail(const std::string& why) const {
    throw HostlistError("invalid host list '" + std::string(list) + "': " + why);
  }

  std::uint64_t number(std::string_view digits) const {
    if (digits.empty() || digits.size() > 18) fail("bad number '" + std::string(digits) + "' in brackets");
    for (char c : digits)
      if (!is_digit(c)) fail("bad number '" + std::string(digits) + "' in brackets");
    std::uint64_t value = 0;
    std::from_chars(digits.data(), digits.data() + digits.size(), value);
    return value;
  }

  // "001-003,010" -> {"001","002","003","010"}
  std::vector<std::string> bracket(std::string_view body) const {
    std::vector<std::string> out;
    if (body.empty()) fail("empty brackets");
    while (true) {
      const auto comma = body.find(',');
      const auto range = body.substr(0, comma);
      const auto dash = range.find('-');
      const auto lo_text = range.substr(0, dash);
      const auto lo = number(lo_text);
      const auto hi = dash == std::string_view::npos ? lo : number(range.substr(dash + 1));
      if (hi < lo) fail("range '" + std::string(range) + "' runs backwards");
      if (hi - lo >= kMaxHosts || out.size() + (hi - lo) >= kMaxHosts) fail("more than " + std::to_string(kMaxHosts) + " hosts");
      for (auto v = lo; v <= hi; ++v) {
        auto text = std::to_string(v);
        if (text.size() < lo_text.size()) text.insert(0, lo_text.size() - text.size(), '0');
        out.push_back(std::move(text));
      }
      if (comma == std::string_view::npos) return out;
      body.remove_prefix(comma + 1);
    }
  }

  // One host expression, e.g. "rack[1-2]-node[01-02]", appended to out.
  void item(std::string_view expr, std::vector<std::string>& out) const {
    std::vector<std::string> names = {""};
    while (!expr.empty()) {
      const auto open = expr.find('[');
      // A stray ']' never gets here: expand_hostlist() rejects it while splitting items.
      if (open == std::string_view::npos) {  // plain text: a name without brackets
        for (auto& n : names) n.append(expr);
        break;
      }
      const auto close = expr.find(']', open);
      if (close == std::string_view::npos) fail("unbalanced '['");
      const auto prefix = expr.substr(0, open);
      const auto values = bracket(expr.substr(open + 1, close - open - 1));
      if (names.size() * values.size() > kMaxHosts) fail("more than " + std::to_string(kMaxHosts) + " hosts");
      std::vector<std::string> next;
      next.reserve(names.size() * values.size());
      for (const auto& n : names)
        for (const auto& v : values) next.push_back(n + std::string(prefix) + v);
      names = std::move(next);
      expr.remove_prefix(close + 1);
      if (!expr.empty() && expr.find('[') == std::string_view::npos)
        fail("text '" + std::string(expr) + "' after the last bracket");
    }
    if (out.size() + names.size() > kMaxHosts) fail("more than " + std::to_string(kMaxHosts) + " hosts");
    out.insert(out.end(), names.begin(), names.end());
  }
};

}  // namespace

std::vector<std::string> expand_hostlist(std::string_view list) {
  const Parser parser{list};
  std::vector<std::string> hosts;
  std::size_t start = 0;
  int depth = 0;
  for (std::size_t i = 0; i <= list.size(); ++i) {
    const bool end = i == list.size();
    if (!end && list[i] == '[') ++depth;
    if (!end && list[i] == ']' && --depth < 0) parser.fail("unbalanced ']'");
    if (!end && depth > 0 && (list[i] == ' ' || list[i] == '\t' || list[i] == '\n'))
      parser.fail("whitespace inside brackets");
    if (end || (depth == 0 && is_separator(list[i]))) {
      if (i > start) parser.item(list.substr(start, i - start), hosts);
      start = i + 1;
    }
  }
  if (depth != 0) parser.fail("unbalanced brackets");
  return hosts;
}

}  // namespace idist::launchers
