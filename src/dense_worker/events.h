// Worker 0's reports as lines of text, so that a launcher that started it as a process
// (`hyrec train --processes`) shows the same progress line, evaluations, metrics and summary as
// the embedded job: EventWriter is worker 0's TrainObserver, writing one line per report to its
// stdout; EventReader turns those lines back into the same calls on the launcher's observer.
//
//   hyrec-event progress samples=512 planned=1200000 batches=1 elapsed=0.1 rate=5120 loss=0.69 ...
//   hyrec-event eval at=20480 auc=0.81 log_loss=0.45 samples=50000
//   hyrec-event finish samples=1200000 ... fingerprint=0123456789abcdef
//
// Values are written with full precision (%.17g), so what arrives equals what was sent.
#ifndef HYREC_SRC_DENSE_WORKER_EVENTS_H_
#define HYREC_SRC_DENSE_WORKER_EVENTS_H_

#include <mutex>
#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "hyrec/dense_worker/report.h"

namespace hyrec::dense_worker {

inline constexpr char kEventPrefix[] = "hyrec-event ";

class EventWriter : public TrainObserver {
 public:
  explicit EventWriter(std::ostream* out) : out_(out) {}
  void OnProgress(const Progress& progress) override;
  void OnEvaluation(uint64_t samples, const Evaluation& evaluation) override;
  void OnFinish(const TrainReport& report) override;

 private:
  void Write(const std::string& line);
  std::mutex mu_;
  std::ostream* out_;
};

// Reads a worker's event lines. Progress and evaluations go to `sink` as they come; the finish
// event is kept (with the progress and evaluations seen before it) for the launcher to pass on
// once every worker has exited.
class EventReader {
 public:
  explicit EventReader(TrainObserver* sink) : sink_(sink) {}

  // False when `line` is not an event (the caller prints it as it is); InvalidArgument for a
  // malformed event.
  absl::StatusOr<bool> Read(const std::string& line);

  bool finished() const { return finished_; }
  const TrainReport& report() const { return report_; }

 private:
  TrainObserver* sink_;
  bool finished_ = false;
  TrainReport report_;
};

}  // namespace hyrec::dense_worker

#endif  // HYREC_SRC_DENSE_WORKER_EVENTS_H_
