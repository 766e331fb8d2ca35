#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace idist::launchers {

// A usage error: idist-run prints it as one line and exits 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The executable `name` names: a path when it contains '/', else the first match in PATH, as
// execvp would find it. Throws UsageError when it does not exist, is a directory, or is not
// executable, so the job fails before any rank starts rather than N times after.
std::string resolve_program(const std::string& name);

// How many leading words of `command` start the program, that is where an argument for the
// program itself (--local_rank=N) goes: 1 for a binary; for a Python interpreter (python,
// python3, python3.11, pypy3, by its base name) the interpreter, its own options and the
// script (or -m MODULE, -c CODE), as python3 -u train.py reads its sys.argv after train.py.
// A command without a script (python3 -u alone) is all program words.
std::size_t program_words(const std::vector<std::string>& command);

// The libraries the ELF file at `path` links directly (its DT_NEEDED entries: "libmpi.so.40"),
// read from its section headers; empty when it is not an ELF file of this machine's byte order
// or cannot be read (a script, a truncated file). Never throws.
std::vector<std::string> needed_libraries(const std::string& path);

// The first of `path`'s needed libraries that is MPI's (libmpi.so.*, libmpi_cxx.so.*,
// libmpich*.so.*, Intel MPI's libmpi and libmpifort), or "" when it links none. A program
// that links libidist is not one: libidist loads MPI only as a plugin, when a rank asks.
std::string mpi_library(const std::string& path);

// A rank whose program could not be executed exits with these, as a shell does: found but
// not executable, and not found (a file gone since it was resolved).
inline constexpr int kCannotExecute = 126;
inline constexpr int kNotFound = 127;

// Why execve of `path` (a file that was there) failed with `err`, for a person, and the code
// to exit with: ENOENT means its #! interpreter is missing ("its interpreter /usr/bin/python9
// (the #! line) does not exist") or, with no #! to blame, the file itself (kNotFound); ENOEXEC
// a script without a #! line.
struct ExecFailure {
  std::string why;
  int code = kCannotExecute;
};
ExecFailure exec_failure(const std::string& path, int err);

// execve failed (exec_in_place): what exec_failure says, for idist-run to exit with `code`.
class ExecError : public std::runtime_error {
 public:
  ExecError(const std::string& what, int code) : std::runtime_error(what), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

}  // namespace idist::launchers
