// LibTorch exceptions at the dense_worker edge: every call into LibTorch or a user's model that
// can throw runs through GuardTorch, so that a shape error, an allocation failure or a user's
// exception becomes a Status naming what was being done, never std::terminate.
#ifndef HYREC_SRC_DENSE_WORKER_TORCH_STATUS_H_
#define HYREC_SRC_DENSE_WORKER_TORCH_STATUS_H_

#include <c10/util/Exception.h>

#include <exception>
#include <new>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace hyrec::dense_worker {

// The first line of a LibTorch message (the rest is its C++ stack trace).
inline std::string FirstLine(const char* what) {
  std::string message = what;
  const size_t newline = message.find('\n');
  if (newline != std::string::npos) message.resize(newline);
  return message;
}

// ResourceExhausted for allocation failures, InvalidArgument for the rest (a shape or type
// mismatch in a model is a property of the model and the job, not of the moment).
inline absl::Status TorchExceptionStatus(absl::string_view what, const std::exception& e) {
  const std::string message = FirstLine(e.what());
  const bool memory = dynamic_cast<const std::bad_alloc*>(&e) != nullptr ||
                      message.find("allocate") != std::string::npos ||
                      message.find("out of memory") != std::string::npos;
  return absl::Status(memory ? absl::StatusCode::kResourceExhausted : absl::StatusCode::kInvalidArgument,
                      absl::StrCat(what, ": ", message));
}

// Runs `f` (returning absl::Status), turning any exception into TorchExceptionStatus(what).
template <typename F>
absl::Status GuardTorch(absl::string_view what, F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    return TorchExceptionStatus(what, e);
  } catch (...) {
    return absl::InternalError(absl::StrCat(what, ": an exception that is not a std::exception"));
  }
}

}  // namespace hyrec::dense_worker

#endif  // HYREC_SRC_DENSE_WORKER_TORCH_STATUS_H_
