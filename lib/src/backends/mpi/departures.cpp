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

void Departures::read_notices(MPI_Comm comm) {
  for (;;) {
    int flag = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kLeaveTag, comm, &flag, &status) != MPI_SUCCESS || flag == 0) return;
    int bytes = 0;
    MPI_Get_count(&status, MPI_BYTE, &bytes);
    std::string text(static_cast<std::size_t>(std::max(bytes, 0)), '\0');
    MPI_Recv(text.data(), bytes, MPI_BYTE, status.MPI_SOURCE, kLeaveTag, comm, MPI_STATUS_IGNORE);
    const auto tab = text.find('\t');
    departed_[status.MPI_SOURCE] = {std::strtoull(text.c_str(), nullptr, 10),
                                    tab == std::string::npos ? std::string("left") : text.substr(tab + 1)};
  }
}

void Departures::check(MPI_Comm comm, int rank, std::uint64_t calls) {
  read_notices(comm);
  for (const auto& [r, d] : departed_) {
    if (d.calls >= calls) continue;
    // The leaver waits in its finalize() for the others: it must not end as if all went well.
    const std::string told = fmt::format("{}\tcollective #{}", rank, calls - 1);
    MPI_Request request = MPI_REQUEST_NULL;
    MPI_Isend(told.data(), static_cast<int>(told.size()), MPI_BYTE, r, kAbandonedTag, comm, &request);
    const bool sent = poll_until(
        [&] {
          int done = 0;
          return MPI_Test(&request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done != 0;
        },
        std::chrono::steady_clock::now() + std::chrono::milliseconds(200));
    if (!sent) MPI_Cancel(&request);
    throw PeerLostFailure(r, fmt::format("rank {} {} while this rank waits for it in collective #{} (mpi): the ranks "
                                         "ran different numbers of steps (uneven data? see idist::join)",
                                         r, d.note, calls - 1));
  }
}

std::string Departures::await_the_others(MPI_Comm comm, int size, std::uint64_t calls,
                                         std::chrono::milliseconds timeout) {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized != 0 || comm == MPI_COMM_NULL) return "";
  std::string abandoned;
  poll_until(
      [&] {
        int flag = 0;
        MPI_Status status;
        if (MPI_Iprobe(MPI_ANY_SOURCE, kAbandonedTag, comm, &flag, &status) == MPI_SUCCESS && flag != 0) {
          int bytes = 0;
          MPI_Get_count(&status, MPI_BYTE, &bytes);
          abandoned.assign(static_cast<std::size_t>(std::max(bytes, 0)), '\0');
          MPI_Recv(abandoned.data(), bytes, MPI_BYTE, status.MPI_SOURCE, kAbandonedTag, comm, MPI_STATUS_IGNORE);
          return true;
        }
        read_notices(comm);
        return static_cast<int>(departed_.size()) >= size - 1;
      },
      std::chrono::steady_clock::now() + timeout,
      BackoffPolicy{.spin = {}, .yield = std::chrono::milliseconds(1), .nap = std::chrono::milliseconds(1)});
  if (abandoned.empty())
    for (const auto& [r, d] : departed_)
      if (d.calls > calls) return fmt::format("{}\tcollective #{}", r, calls);  // the first it never began here
  return abandoned;
}

}  // namespace idist::detail::mpi
