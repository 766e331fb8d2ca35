// "Collective Communication with Ignite", write_preds_to_file: every rank holds predictions
// for its own samples; rank 0 collects them and writes them to one file. Only rank 0 needs
// them, so gather (to rank 0) does it; all_gather, as in the tutorial, would work too.
//
//   write_preds [FILE]     FILE defaults to preds.txt
//
// The file has a line "sample,rank,prediction" per sample. After one_rank_only's barrier
// every rank on rank 0's host reads it back and checks that its own predictions are there
// (ranks on other nodes see another filesystem, unless it is shared).
#include <idist/helpers.hpp>

#include <algorithm>
#include <fstream>

#include "print.hpp"

namespace {

constexpr std::int64_t kPerRank = 4;

// A stand-in for a model's class prediction, one of 10 classes.
std::int64_t predict(std::int64_t sample) { return (sample * 7) % 10; }

std::string line(std::int64_t sample, std::int64_t rank, std::int64_t prediction) {
  return std::to_string(sample) + "," + std::to_string(rank) + "," + std::to_string(prediction);
}

}  // namespace

int main(int argc, char** argv) try {
  idist::init();
  const std::int64_t rank = idist::get_rank();
  const std::string filename = argc > 1 ? argv[1] : "preds.txt";

  // Rows of (sample, rank, prediction), flat, so that one gather carries them all.
  std::vector<std::int64_t> rows;
  for (std::int64_t i = 0; i < kPerRank; ++i) {
    const std::int64_t sample = rank * kPerRank + i;
    rows.insert(rows.end(), {sample, rank, predict(sample)});
  }
  const std::vector<std::int64_t> all = idist::gather(rows, {.dst = 0});

  idist::one_rank_only(
      [&] {
        std::ofstream out(filename);
        for (std::size_t i = 0; i + 2 < all.size(); i += 3) out << line(all[i], all[i + 1], all[i + 2]) << "\n";
        if (!out.flush()) throw std::runtime_error("write_preds: cannot write " + filename);
        examples::say("Rank 0 wrote " + std::to_string(all.size() / 3) + " predictions to " + filename);
      },
      {.rank = 0, .with_barrier = true});  // the others read the file only once it is complete

  if (idist::broadcast(idist::hostname(), 0) != idist::hostname()) {
    examples::say("Rank " + std::to_string(rank) + " is on another host than rank 0: not reading " + filename);
    idist::finalize();
    return 0;
  }
  std::ifstream in(filename);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  std::int64_t found = 0;
  for (std::size_t i = 0; i < rows.size(); i += 3)
    if (std::find(lines.begin(), lines.end(), line(rows[i], rows[i + 1], rows[i + 2])) != lines.end()) ++found;
  examples::say("Rank " + std::to_string(rank) + " found " + std::to_string(found) + " of its " +
                std::to_string(kPerRank) + " predictions in " + filename);
  idist::finalize();
  return found == kPerRank ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 1;
}
