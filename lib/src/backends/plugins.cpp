// Loading backend plugins, the way Open MPI loads its components: dlopen from the install's
// own directory, found from where libidist itself lies, so that a relocated install (cmake
// --install --prefix P, a .deb) needs no configuration; IDIST_PLUGIN_PATH adds directories.

#include "backends/plugins.hpp"

#include "idist/plugins.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <stdexcept>

namespace idist::detail {

namespace {

std::string plugin_file(std::string_view name) {
  return "libidist-backend-" + std::string(name) + IDIST_PLUGIN_SUFFIX;
}

// The directory of the file this code was loaded from: libidist.so, or the executable when a
// test links the objects statically. Taken once, when the library is loaded: the loader may
// have found it by a relative path (LD_LIBRARY_PATH=.), which a later chdir would change.
std::string own_dir() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&own_dir), &info) == 0 || info.dli_fname == nullptr) return {};
  std::error_code ec;
  auto path = std::filesystem::canonical(info.dli_fname, ec);
  if (ec) path = info.dli_fname;
  return path.parent_path().string();
}

// The loader's last message, which names the missing library ("libmpi.so.40: cannot open
// shared object file: No such file or directory") or symbol, less the plugin's own path when
// it starts with it (the message names it already).
std::string loader_error(const std::string& path) {
  const char* text = ::dlerror();
  std::string error = text != nullptr ? text : "unknown dlopen error";
  if (error.starts_with(path + ": ")) error.erase(0, path.size() + 2);
  return error;
}

std::string joined(const std::vector<std::string>& dirs) {
  std::string out;
  for (const auto& d : dirs) out += (out.empty() ? "" : ", ") + d;
  return out.empty() ? "(no directory)" : out;
}

// Where `name`'s plugin lies, if anywhere in `dirs`: the first directory that has it.
std::string locate(std::string_view name, const std::vector<std::string>& dirs) {
  const auto file = plugin_file(name);
  for (const auto& dir : dirs) {
    std::error_code ec;
    if (std::filesystem::exists(std::filesystem::path(dir) / file, ec)) return (std::filesystem::path(dir) / file).string();
  }
  return {};
}

std::string not_installed(std::string_view name, const std::vector<std::string>& dirs) {
  return "backend '" + std::string(name) + "' is not installed: no " + plugin_file(name) + " in " + joined(dirs) +
         " (install idist-backend-" + std::string(name) + ", build idist with it, or add its directory to " +
         std::string(kPluginPathEnv) + ")";
}

// Loads the plugin at `path` and checks it is one of this build's: into `out`, or the line
// that says why not ("" when it loads).
std::string open_plugin(std::string_view name, const std::string& path, const BackendPlugin*& out) {
  const std::string what = "backend '" + std::string(name) + "'";
  // RTLD_GLOBAL for mpi only: Open MPI loads components of its own that expect libmpi's
  // symbols to be global. Others stay local, so that CUDA's and NCCL's symbols never capture a
  // library the program loads later (torch's own copies). Never closed: MPI and CUDA keep
  // state and handlers past any point we could.
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | (name == "mpi" ? RTLD_GLOBAL : RTLD_LOCAL));
  if (handle == nullptr) {
    const auto error = loader_error(path);
    return what + ": cannot load " + path + ": " + error +
           (error.find("undefined symbol") != std::string::npos
                ? " (built for another libidist? install matching versions)"
                : " (install what the backend needs, or use --backend gloo)");
  }
  const auto symbol = "idist_backend_plugin_" + std::string(name);
  using Entry = const BackendPlugin* (*)();
  auto entry = reinterpret_cast<Entry>(::dlsym(handle, symbol.c_str()));
  if (entry == nullptr) return what + ": " + path + " has no " + symbol + ": not an idist plugin";
  const BackendPlugin* plugin = entry();
  const BackendPlugin here;  // this build's sizes
  if (plugin == nullptr || plugin->abi != kPluginAbi || plugin->idist_version == nullptr ||
      std::string_view(plugin->idist_version) != IDIST_VERSION || plugin->make == nullptr ||
      plugin->sizes != here.sizes)
    return what + ": " + path + " was built for idist " +
           (plugin != nullptr && plugin->idist_version != nullptr ? plugin->idist_version : "?") + " (plugin ABI " +
           std::to_string(plugin != nullptr ? plugin->abi : 0) + "), this libidist is " + IDIST_VERSION + " (ABI " +
           std::to_string(kPluginAbi) + "): install matching versions";
  out = plugin;
  return {};
}

// open_plugin in a child process: its answer, and nothing it loaded left in this one.
std::string open_plugin_in_child(std::string_view name, const std::string& path) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return "backend '" + std::string(name) + "': cannot test " + path + ": " + std::strerror(errno);
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int error = errno;
    ::close(fds[0]);
    ::close(fds[1]);
    return "backend '" + std::string(name) + "': cannot test " + path + ": " + std::strerror(error);
  }
  if (pid == 0) {
    ::close(fds[0]);
    const BackendPlugin* plugin = nullptr;
    const auto why = open_plugin(name, path, plugin);
    const bool written = why.empty() || ::write(fds[1], why.data(), why.size()) == static_cast<ssize_t>(why.size());
    ::_exit(written ? 0 : 2);
  }
  ::close(fds[1]);
  std::string why;
  char buffer[512];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof(buffer))) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    why.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (why.empty() && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
    why = "backend '" + std::string(name) + "': loading " + path + " crashed (" +
          (WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status)) : "exit " + std::to_string(WEXITSTATUS(status))) +
          ")";
  return why;
}

// The plugins this process has loaded, by name.
struct Loaded {
  std::mutex mu;
  std::map<std::string, const BackendPlugin*, std::less<>> plugins;
};
Loaded& loaded() {
  static Loaded instance;
  return instance;
}

const std::string kOwnDir = own_dir();

}  // namespace

std::vector<std::string> plugin_dirs() {
  std::vector<std::string> dirs;
  if (const char* extra = std::getenv(std::string(kPluginPathEnv).c_str())) {
    std::string_view rest(extra);
    while (!rest.empty()) {
      const auto colon = rest.find(':');
      const auto dir = rest.substr(0, colon);
      std::error_code ec;
      if (!dir.empty()) dirs.push_back(std::filesystem::absolute(dir, ec).lexically_normal().string());
      rest = colon == std::string_view::npos ? std::string_view() : rest.substr(colon + 1);
    }
  }
  if (!kOwnDir.empty()) dirs.push_back(kOwnDir + "/idist");
  return dirs;
}

const BackendPlugin& load_plugin(std::string_view name) {
  auto& cache = loaded();
  const std::lock_guard lock(cache.mu);
  if (const auto it = cache.plugins.find(name); it != cache.plugins.end()) return *it->second;
  const auto dirs = plugin_dirs();
  const auto path = locate(name, dirs);
  if (path.empty()) throw std::runtime_error(not_installed(name, dirs));
  const BackendPlugin* plugin = nullptr;
  if (auto why = open_plugin(name, path, plugin); !why.empty()) throw std::runtime_error(why);
  cache.plugins.emplace(std::string(name), plugin);
  return *plugin;
}

}  // namespace idist::detail

namespace idist {

PluginStatus plugin_status(std::string_view name) {
  using namespace detail;
  const auto dirs = plugin_dirs();
  PluginStatus status{.path = locate(name, dirs), .looked_in = joined(dirs), .error = {}};
  if (status.path.empty()) {
    status.error = not_installed(name, dirs);
    return status;
  }
  {
    auto& cache = loaded();
    const std::lock_guard lock(cache.mu);
    if (cache.plugins.contains(name)) return status;
  }
  status.error = open_plugin_in_child(name, status.path);
  return status;
}

}  // namespace idist
