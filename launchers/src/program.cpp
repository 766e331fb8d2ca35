#include "idist/launchers/program.hpp"

#include <elf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <cstdint>
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

// Reads `size` bytes at `offset` into `out`; false when the file is shorter.
bool read_at(std::ifstream& in, std::uint64_t offset, void* out, std::size_t size) {
  in.clear();
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(static_cast<char*>(out), static_cast<std::streamsize>(size));
  return in.gcount() == static_cast<std::streamsize>(size);
}

// The DT_NEEDED names of an ELF file of one class (Elf32_* or Elf64_*): the SHT_DYNAMIC
// section's entries, whose names are offsets into the string table its sh_link names. Every
// offset and count is the file's word, so each is checked before it is used.
template <class Ehdr, class Shdr, class Dyn>
std::vector<std::string> needed_of(std::ifstream& in) {
  constexpr std::size_t kMaxNeeded = 4096;
  std::vector<std::string> out;
  Ehdr header{};
  if (!read_at(in, 0, &header, sizeof(header)) || header.e_shentsize != sizeof(Shdr)) return out;
  const auto section = [&](std::size_t index, Shdr& s) {
    return index < header.e_shnum && read_at(in, header.e_shoff + index * sizeof(Shdr), &s, sizeof(s));
  };
  for (std::size_t i = 0; i < header.e_shnum; ++i) {
    Shdr dynamic{}, strings{};
    if (!section(i, dynamic)) return out;
    if (dynamic.sh_type != SHT_DYNAMIC || !section(dynamic.sh_link, strings)) continue;
    for (std::uint64_t at = 0; at + sizeof(Dyn) <= dynamic.sh_size && out.size() < kMaxNeeded; at += sizeof(Dyn)) {
      Dyn entry{};
      if (!read_at(in, dynamic.sh_offset + at, &entry, sizeof(entry)) || entry.d_tag == DT_NULL) break;
      if (entry.d_tag != DT_NEEDED || entry.d_un.d_val >= strings.sh_size) continue;
      char name[256] = {};
      in.clear();
      in.seekg(static_cast<std::streamoff>(strings.sh_offset + entry.d_un.d_val));
      in.read(name, sizeof(name) - 1);
      out.emplace_back(name, ::strnlen(name, static_cast<std::size_t>(in.gcount())));
    }
    return out;
  }
  return out;
}

}  // namespace

std::vector<std::string> needed_libraries(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  unsigned char ident[EI_NIDENT] = {};
  if (!in || !read_at(in, 0, ident, sizeof(ident)) || std::memcmp(ident, ELFMAG, SELFMAG) != 0) return {};
  const bool little = ident[EI_DATA] == ELFDATA2LSB;
  if (little != (std::endian::native == std::endian::little)) return {};
  if (ident[EI_CLASS] == ELFCLASS64) return needed_of<Elf64_Ehdr, Elf64_Shdr, Elf64_Dyn>(in);
  if (ident[EI_CLASS] == ELFCLASS32) return needed_of<Elf32_Ehdr, Elf32_Shdr, Elf32_Dyn>(in);
  return {};
}

std::string mpi_library(const std::string& path) {
  for (const auto& name : needed_libraries(path)) {
    const std::string_view stem = std::string_view(name).substr(0, name.find(".so"));
    if (stem == "libmpi" || stem == "libmpi_cxx" || stem == "libmpi_mpifh" || stem == "libmpifort" ||
        stem.starts_with("libmpich"))
      return name;
  }
  return "";
}

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
