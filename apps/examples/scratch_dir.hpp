#pragma once
// The download directory the examples share: argv[1] when given, else a fresh temporary
// directory that rank 0 makes and tells the others about (so one run never sees another's
// files). Every rank calls it, since it broadcasts.

#include <idist/idist.hpp>
#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>

namespace examples {

inline std::string scratch_dir(int argc, char** argv, const std::string& name) {
  if (argc > 1) return argv[1];
  std::string made;
  if (idist::get_rank() == 0) {
    std::string tmpl = (std::filesystem::temp_directory_path() / (name + "-XXXXXX")).string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error(name + ": mkdtemp failed");
    made = tmpl;
  }
  return idist::broadcast(made, 0);
}

}  // namespace examples
