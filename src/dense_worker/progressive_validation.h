// ProgressiveValidation: the standard measure of a model that learns from a stream. Each batch is
// scored before it is trained on (the forward pass of its own step), so every sample is held out
// from the model that scores it; the AUC and log loss over the last `window` samples so scored
// follow the model as it learns. Worker 0 keeps one over its own batches. Not thread-safe; no
// LibTorch.
//
//   ProgressiveValidation pv(100'000);
//   pv.Add(logits, labels, batch_size);   // before the batch's backward
//   Evaluation e = pv.Measure();          // e.samples: how many the window holds
#ifndef HYREC_SRC_DENSE_WORKER_PROGRESSIVE_VALIDATION_H_
#define HYREC_SRC_DENSE_WORKER_PROGRESSIVE_VALIDATION_H_

#include <cstddef>
#include <vector>

#include "hyrec/dense_worker/report.h"

namespace hyrec::dense_worker {

class ProgressiveValidation {
 public:
  // `window`: samples kept (at least 1).
  explicit ProgressiveValidation(size_t window);

  // A batch's logits, as scored before it was trained on, and its labels (0 or 1).
  void Add(const float* logits, const float* labels, size_t n);

  // AUC and mean log loss over the samples the window holds; all zeros while it holds none.
  Evaluation Measure() const;

 private:
  const size_t window_;
  std::vector<float> logits_, labels_;  // Rings of `window_`.
  size_t next_ = 0;                     // Where the next sample goes.
  size_t held_ = 0;
};

}  // namespace hyrec::dense_worker

#endif  // HYREC_SRC_DENSE_WORKER_PROGRESSIVE_VALIDATION_H_
