#pragma once
// How the check programs report (tests/gpu/nccl_check, tests/gpu/torch_cuda_check,
// tests/torch/torch_check): one line per case, "ok   LABEL" or "FAIL LABEL: why", then
// "PROGRAM: N checks, M failed". A case passes when its body returns an empty string; an
// exception fails it with its message. Each line is flushed, so that a run cut short (a hang,
// a timeout) keeps what it had found.

#include <cstdio>
#include <exception>
#include <functional>
#include <string>

namespace check_cases {

inline int checks = 0;
inline int failures = 0;

inline void run_case(const std::string& label, const std::function<std::string()>& body) {
  ++checks;
  std::string why;
  try {
    why = body();
  } catch (const std::exception& e) {
    why = std::string("threw: ") + e.what();
  }
  if (why.empty()) {
    std::printf("ok   %s\n", label.c_str());
  } else {
    ++failures;
    std::printf("FAIL %s: %s\n", label.c_str(), why.c_str());
  }
  std::fflush(stdout);
}

// A failure found outside run_case.
inline void fail(const std::string& what) {
  ++checks;
  ++failures;
  std::printf("FAIL %s\n", what.c_str());
  std::fflush(stdout);
}

// The summary line; the exit code: 0 when nothing failed.
inline int finish(const char* program) {
  std::printf("%s: %d checks, %d failed\n", program, checks, failures);
  std::fflush(stdout);
  return failures == 0 ? 0 : 1;
}

}  // namespace check_cases
