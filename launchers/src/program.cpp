#include "idist/launchers/program.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string_view>

namespace idist::launchers {
namespace {

enum class Check { ok, missing, directory, not_executable };

Check check(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) return Check::missing;
  if (S_ISDIR(st.st_mode)) return Check::directory;
  if (::access(path.c_str(), X_OK) != 0) return Check::not_executable;
  return Check::ok;
}

bool is_python(std::string_view path) {
  const auto slash = path.rfind('/');
  std::string_view name = slash == std::string_view::npos ? path : path.substr(slash + 1);
  if (name.starts_with("python")) name.remove_prefix(6);
  else if (name.starts_with("pypy")) name.remove_prefix(4);
  else return false;
  return name.find_first_not_of("0123456789.") == std::string_view::npos;
}

}  // namespace

std::size_t program_words(const std::vector<std::string>& command) {
  if (command.empty()) return 0;
  if (!is_python(command.front())) return 1;
  const std::size_t n = command.size();
  const auto upto = [n](std::size_t words) { return std::min(words, n); };
  // Python's options (python3 --help): -c CMD and -m MOD end them, -W ARG and -X OPT take a
  // value (joined or the next word), the rest are flags that may be grouped (-uB).
  for (std::size_t i = 1; i < n; ++i) {
    const std::string_view word = command[i];
    if (word == "-") return i + 1;  // the script from stdin
    if (word == "--") return upto(i + 2);
    if (word.starts_with("--")) {
      if (word == "--check-hash-based-pycs") ++i;
      continue;
    }
    if (!word.starts_with("-")) return i + 1;  // the script
    for (std::size_t c = 1; c < word.size(); ++c) {
      const bool joined = c + 1 < word.size();
      if (word[c] == 'c' || word[c] == 'm') return upto(joined ? i + 1 : i + 2);
      if (word[c] == 'W' || word[c] == 'X') {
        if (!joined) ++i;
        break;
      }
    }
  }
  return n;
}

std::string resolve_program(const std::string& name) {
  if (name.empty()) throw UsageError("the program name is empty");
  if (name.find('/') != std::string::npos) {
    switch (check(name)) {
      case Check::ok: return name;
      case Check::missing: throw UsageError("program '" + name + "' does not exist");
      case Check::directory: throw UsageError("program '" + name + "' is a directory");
      case Check::not_executable: throw UsageError("program '" + name + "' is not executable");
    }
  }
  const char* path_env = std::getenv("PATH");
  std::string_view path = path_env != nullptr ? path_env : "/usr/local/bin:/usr/bin:/bin";
  bool seen_non_executable = false;
  while (true) {
    const auto colon = path.find(':');
    // An empty PATH entry means the current directory. Built from views and appends:
    // string assignment/concatenation here trips GCC 12's false -Wrestrict (bug 105329).
    const std::string_view dir = path.substr(0, colon);
    std::string candidate(dir.empty() ? std::string_view(".") : dir);
    candidate.append("/").append(name);
    const auto result = check(candidate);
    if (result == Check::ok) return candidate;
    if (result == Check::not_executable) seen_non_executable = true;
    if (colon == std::string_view::npos) break;
    path.remove_prefix(colon + 1);
  }
  if (seen_non_executable) throw UsageError("program '" + name + "' was found in PATH but is not executable");
  throw UsageError("program '" + name + "' not found in PATH");
}

ExecFailure exec_failure(const std::string& path, int err) {
  if (err == ENOEXEC) return {"not a program this system runs, nor a script with a #! line (Exec format error)"};
  if (err != ENOENT) return {std::strerror(err)};
  // The #! line: the kernel reads at most 256 bytes of it.
  char head[256] = {};
  std::ifstream in(path, std::ios::binary);
  in.read(head, sizeof(head));
  const std::string_view text(head, static_cast<std::size_t>(in.gcount()));
  if (text.rfind("#!", 0) == 0) {
    const auto line = text.substr(0, text.find('\n'));
    if (line.back() == '\r') return {"its #! line ends in \\r (Windows line endings): convert the script (dos2unix)"};
    const auto start = line.find_first_not_of(" \t", 2);
    if (start != std::string_view::npos) {
      const std::string interpreter(line.substr(start, line.find_first_of(" \t", start) - start));
      if (::access(interpreter.c_str(), F_OK) != 0)
        return {"its interpreter " + interpreter + " (the #! line) does not exist"};
    }
  }
  return {std::strerror(err), kNotFound};
}

}  // namespace idist::launchers
