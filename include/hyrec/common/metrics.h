// Metrics in the Prometheus text exposition format (version 0.0.4).
//
//   MetricsRegistry metrics;
//   metrics.Describe("hyrec_samples_total", MetricType::kCounter, "Samples trained.");
//   metrics.Set("hyrec_samples_total", {}, 4096);
//   metrics.Set("hyrec_ps_rows", {{"table", "t0"}}, 1234);
//   std::string text = metrics.Render();   // what GET /metrics returns
//
// A metric family has a name, a type and a help line; each sample is a value for one set of
// labels. Values are set (a gauge's reading, or a counter's running total kept by its owner) or
// added to. Names must match [a-zA-Z_:][a-zA-Z0-9_:]*; label values are escaped on output.
// MetricsHttpServer (metrics_server.h) serves Render() over HTTP.
//
// Thread safety: every method may be called from any thread.
#ifndef HYREC_COMMON_METRICS_H_
#define HYREC_COMMON_METRICS_H_

#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace hyrec {

enum class MetricType { kGauge, kCounter, kSummary };

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

class MetricsRegistry {
 public:
  // Declares a family (once; later calls update the help text). Samples of undeclared families
  // render as untyped.
  void Describe(const std::string& name, MetricType type, const std::string& help);
  void Set(const std::string& name, const MetricLabels& labels, double value);
  void Add(const std::string& name, const MetricLabels& labels, double delta);
  // A summary without quantiles: samples <name>_sum and <name>_count.
  void SetSummary(const std::string& name, const MetricLabels& labels, double sum, double count);
  // The current value, or `missing` when never set.
  double Get(const std::string& name, const MetricLabels& labels, double missing = 0) const;

  // Every family in name order: # HELP, # TYPE, then its samples in label order.
  std::string Render() const;

  // True when `name` is a valid Prometheus metric name.
  static bool ValidName(absl::string_view name);

 private:
  struct Family {
    MetricType type = MetricType::kGauge;
    bool described = false;
    std::string help;
    std::map<MetricLabels, double> samples;
  };
  mutable std::mutex mu_;
  std::map<std::string, Family> families_;  // Guarded by mu_.
};

}  // namespace hyrec

#endif  // HYREC_COMMON_METRICS_H_
