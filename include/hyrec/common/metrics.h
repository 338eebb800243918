// Metrics in the Prometheus text exposition format (version 0.0.4).
//
//   MetricsRegistry metrics;
//   metrics.Describe("hyrec_samples_total", MetricType::kCounter, "Samples trained.");
//   metrics.Set("hyrec_samples_total", {}, 4096);
//   metrics.Set("hyrec_ps_rows", {{"table", "users"}}, 1234);
//   std::string text = metrics.Render();   // what GET /metrics returns
//
// A metric family has a name, a type and a help line; each sample is a value for one set of
// labels. Values are set (a gauge's reading, or a counter's running total kept by its owner) or
// added to. Names must match [a-zA-Z_:][a-zA-Z0-9_:]*; label values are escaped on output.
// Figures that are cheap to read but change all the time (a store's row counts) can instead be
// published by a collector, which Render() runs first, so every scrape sees them fresh
// (`metrics.AddCollector([&](MetricsRegistry* m) { m->Set("hyrec_ps_rows", {}, rows()); })`).
// MetricsHttpServer (metrics_server.h) serves Render() over HTTP.
//
// Thread safety: every method may be called from any thread.
#ifndef HYREC_COMMON_METRICS_H_
#define HYREC_COMMON_METRICS_H_

#include <functional>
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

  // Registers `collect`, run (outside the registry's lock, in registration order) at the start of
  // every Render(); what it captures must outlive the registry's last Render().
  void AddCollector(std::function<void(MetricsRegistry*)> collect);

  // Runs the collectors, then renders every family in name order: # HELP, # TYPE, then its
  // samples in label order.
  std::string Render();

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
  std::mutex collectors_mu_;                // Held while collectors run: one Render collects at a time.
  std::vector<std::function<void(MetricsRegistry*)>> collectors_;  // Guarded by collectors_mu_.
};

}  // namespace hyrec

#endif  // HYREC_COMMON_METRICS_H_
