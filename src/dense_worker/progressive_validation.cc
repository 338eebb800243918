#include "src/dense_worker/progressive_validation.h"

#include <algorithm>
#include <cmath>

#include "hyrec/data_loader/synthetic.h"

namespace hyrec::dense_worker {

ProgressiveValidation::ProgressiveValidation(size_t window)
    : window_(std::max<size_t>(1, window)), logits_(window_), labels_(window_) {}

void ProgressiveValidation::Add(const float* logits, const float* labels, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    logits_[next_] = logits[i];
    labels_[next_] = labels[i];
    next_ = (next_ + 1) % window_;
  }
  held_ = std::min(window_, held_ + n);
}

Evaluation ProgressiveValidation::Measure() const {
  Evaluation e;
  if (held_ == 0) return e;
  const std::vector<float> logits(logits_.begin(), logits_.begin() + held_);
  const std::vector<float> labels(labels_.begin(), labels_.begin() + held_);
  double loss = 0;
  for (size_t i = 0; i < held_; ++i) {  // Binary cross-entropy from the logit, stably.
    const double x = logits[i];
    loss += std::max(x, 0.0) - x * labels[i] + std::log1p(std::exp(-std::abs(x)));
  }
  e.samples = held_;
  e.auc = data_loader::ExactAuc(logits, labels);
  e.log_loss = loss / static_cast<double>(held_);
  return e;
}

}  // namespace hyrec::dense_worker
