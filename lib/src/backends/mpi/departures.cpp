#include "backends/mpi/departures.hpp"

#include <spdlog/fmt/fmt.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <vector>

#include "common/wait.hpp"
#include "in_step_error.hpp"

namespace idist::detail::mpi {

void Departures::announce(MPI_Comm comm, int rank, int size, std::uint64_t calls, const std::string& note) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized != 0 || comm == MPI_COMM_NULL || size < 2) return;
  // Kept past this call if MPI does not let go of a send in time (never freed then).
  auto* text = new std::string(fmt::format("{}\t{}", calls, note));
  std::vector<MPI_Request> requests;
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    auto& r = requests.emplace_back(MPI_REQUEST_NULL);
    MPI_Isend(text->data(), static_cast<int>(text->size()), MPI_BYTE, p, kLeaveTag, comm, &r);
  }
  const bool sent = poll_until(
      [&] {
        int done = 0;
        return MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE) !=
                   MPI_SUCCESS ||
               done != 0;
      },
      std::chrono::steady_clock::now() + std::chrono::milliseconds(200));
  if (sent) {
    delete text;
    return;
  }
  for (auto& r : requests)
    if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
}

void Departures::check(MPI_Comm comm, std::uint64_t calls) {
  for (;;) {
    int flag = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kLeaveTag, comm, &flag, &status) != MPI_SUCCESS || flag == 0) break;
    int bytes = 0;
    MPI_Get_count(&status, MPI_BYTE, &bytes);
    std::string text(static_cast<std::size_t>(std::max(bytes, 0)), '\0');
    MPI_Recv(text.data(), bytes, MPI_BYTE, status.MPI_SOURCE, kLeaveTag, comm, MPI_STATUS_IGNORE);
    const auto tab = text.find('\t');
    departed_[status.MPI_SOURCE] = {std::strtoull(text.c_str(), nullptr, 10),
                                    tab == std::string::npos ? std::string("left") : text.substr(tab + 1)};
  }
  for (const auto& [r, d] : departed_)
    if (d.calls < calls)
      throw PeerLostFailure(r, fmt::format("rank {} {} while this rank waits for it in collective #{} (mpi): the ranks "
                                           "ran different numbers of steps (uneven data? see idist::join)",
                                           r, d.note, calls - 1));
}

}  // namespace idist::detail::mpi
