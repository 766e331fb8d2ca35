// The tutorial's barrier: local rank 0 "downloads" the dataset while the other ranks of its
// node wait; then everyone reads it.
//
//   barrier [DIR]     DIR defaults to a fresh directory that rank 0 creates and shares.
#include <idist/idist.hpp>

#include <filesystem>
#include <fstream>
#include <thread>

#include "print.hpp"
#include "scratch_dir.hpp"

namespace fs = std::filesystem;

int main(int argc, char** argv) try {
  idist::init();
  const int rank = idist::get_rank();
  const auto who = "Rank " + std::to_string(rank);

  const std::string dir = examples::scratch_dir(argc, argv, "idist-barrier");
  const fs::path dataset = fs::path(dir) / "dataset.txt";

  if (idist::get_local_rank() > 0) idist::barrier();  // wait for the download
  if (idist::get_local_rank() == 0) {
    fs::create_directories(dir);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the "download" takes a while
    std::ofstream(dataset) << "1000 samples\n";
    examples::say(who + ", downloaded the dataset");
  }
  std::string content;
  std::getline(std::ifstream(dataset), content);
  examples::say(who + ", loaded the dataset: " + (content.empty() ? "<missing>" : content));
  if (idist::get_local_rank() == 0) idist::barrier();  // release the others

  idist::barrier();  // everyone has read it: rank 0 may clean up
  if (rank == 0 && argc <= 1) fs::remove_all(dir);
  idist::finalize();
  return content.empty() ? 1 : 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
