// The lock of one store stripe.
//
// A plain std::mutex (Debian's absl::Mutex runs deadlock detection on every acquisition, which
// costs more than the row work it guards), annotated for thread-safety analysis. Code that holds
// several stripes' locks at once takes them in ascending stripe order, so no two callers wait on
// each other.
#ifndef HYREC_EMBEDDING_PS_STRIPE_LOCK_H_
#define HYREC_EMBEDDING_PS_STRIPE_LOCK_H_

#include <mutex>

#include "absl/base/thread_annotations.h"

namespace hyrec::embedding_ps {

class ABSL_LOCKABLE StripeMutex {
 public:
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mu_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mu_.unlock(); }

 private:
  std::mutex mu_;
};

class ABSL_SCOPED_LOCKABLE StripeLock {
 public:
  explicit StripeLock(StripeMutex* mu) ABSL_EXCLUSIVE_LOCK_FUNCTION(mu) : mu_(mu) { mu_->Lock(); }
  ~StripeLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  StripeLock(const StripeLock&) = delete;
  StripeLock& operator=(const StripeLock&) = delete;

 private:
  StripeMutex* mu_;
};

}  // namespace hyrec::embedding_ps

#endif  // HYREC_EMBEDDING_PS_STRIPE_LOCK_H_
