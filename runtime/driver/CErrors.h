//===- CErrors.h - Errors across the runtime's C interfaces -----*- C++ -*-===//
//
// Every C entry point of the runtime (runtime/cuda/CudaC.h) returns 0, or 1
// with the reason in the caller's `error` buffer: no exception crosses into C
// or Python.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_RUNTIME_DRIVER_CERRORS_H
#define CELLC_RUNTIME_DRIVER_CERRORS_H

#include "runtime/driver/SequenceDriver.h"

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>

namespace cellc::driver {

/// A C call's failure, as text for `error` (catchErrors).
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// Throws a failed `status` as a Failure.
inline void check(const Status &status) {
  if (status)
    throw Failure(status.message());
}

/// The recompute mode a C caller names (null: the default's text, "").
inline Recompute modeOf(const char *text) {
  Recompute mode;
  check(Recompute::parse(text ? text : "", mode));
  return mode;
}

/// Writes `message` into `error` (truncated to `size`) and returns 1.
inline int reportError(char *error, size_t size, const std::string &message) {
  if (error && size)
    std::snprintf(error, size, "%s", message.c_str());
  return 1;
}

/// Runs `body`: 0, or 1 with the exception's message in `error`.
template <typename F> int catchErrors(char *error, size_t size, F &&body) {
  try {
    body();
    return 0;
  } catch (const std::exception &e) {
    return reportError(error, size, e.what());
  }
}

/// `text` in memory of malloc's, for a C caller to give back with the
/// interface's free_text function; null where there is no memory.
inline char *mallocText(const std::string &text) {
  char *out = static_cast<char *>(std::malloc(text.size() + 1));
  if (out)
    std::memcpy(out, text.c_str(), text.size() + 1);
  return out;
}

} // namespace cellc::driver

#endif // CELLC_RUNTIME_DRIVER_CERRORS_H
