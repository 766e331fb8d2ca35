#pragma once
// Checkpoint's files in their directory: <prefix>_<step>.pt, written under a temporary name
// (.<prefix>_<step>.pt.tmp) and renamed once on disk, so that a reader never sees half a file.
#include <torch/serialize/output-archive.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

namespace idist::checkpoint_files {

// Throws std::runtime_error naming the directory.
void make_directory(const std::filesystem::path& dir);
// The archive to <prefix>_<step>.pt: written, flushed to disk, renamed, the directory flushed.
void write(const std::filesystem::path& dir, const std::string& prefix, std::int64_t step,
           torch::serialize::OutputArchive& archive);
// Removes all but the newest `keep` (by step), and temporary files a crash left.
void keep_newest(const std::filesystem::path& dir, const std::string& prefix, std::size_t keep);

struct Found {
  std::filesystem::path path;
  std::string bytes;
};
// The newest checkpoint that loads (one that does not is skipped, with a warning on stderr);
// nullopt when there is none, or no such directory.
std::optional<Found> newest_loadable(const std::filesystem::path& dir, const std::string& prefix);

}  // namespace idist::checkpoint_files
