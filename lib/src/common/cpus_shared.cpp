#include "common/cpus_shared.hpp"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <mutex>

#include "idist/common/cpus_shared.hpp"
#include "idist/common/host.hpp"

namespace idist::detail {
namespace {

const std::atomic<std::uint32_t> kNo{0};
const std::atomic<std::uint32_t> kYes{1};
std::atomic<const std::atomic<std::uint32_t>*> word{&kNo};

// The notice, mapped once per process and descriptor and never unmapped: a wait on another
// thread may still read it when a later init follows another (a page, at most one per init).
const std::atomic<std::uint32_t>* map_notice(int fd) {
  static std::mutex mu;
  static int mapped_fd = -1;
  static pid_t mapped_by = 0;
  static const common::CpusSharedPage* page = nullptr;
  const std::lock_guard lock(mu);
  if (page != nullptr && mapped_fd == fd && mapped_by == ::getpid()) return &page->shared;
  // Only a file that holds a whole page: reading past the end of a mapped file is SIGBUS (a
  // stale IDIST_CPUS_SHARED_FD may name anything this process has open under that number).
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < static_cast<off_t>(sizeof(common::CpusSharedPage)))
    return &kNo;
  void* p = ::mmap(nullptr, sizeof(common::CpusSharedPage), PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return &kNo;
  const auto* found = static_cast<const common::CpusSharedPage*>(p);
  if (found->magic != common::CpusSharedPage::kMagic) {
    ::munmap(p, sizeof(common::CpusSharedPage));
    return &kNo;
  }
  page = found;
  mapped_fd = fd;
  mapped_by = ::getpid();
  return &page->shared;
}

}  // namespace

void follow_cpus_shared(const env::Contract& contract) {
  if (contract.cpus_shared == "1" ||
      (contract.cpus_shared == "auto" && contract.local_world_size > common::host_cores()))
    word = &kYes;  // the host's ranks outnumber its cores: they share them, whatever idist-run saw
  else if (contract.cpus_shared == "0" || contract.cpus_shared_fd < 0)
    word = &kNo;
  else
    word = map_notice(contract.cpus_shared_fd);
}

const std::atomic<std::uint32_t>& cpus_shared_word() { return *word.load(std::memory_order_relaxed); }

}  // namespace idist::detail
