#include "hyrec/data_loader/loader_metrics.h"

namespace hyrec::data_loader {

void PublishLoaderMetrics(const LoaderStats& s, MetricsRegistry* m) {
  if (m == nullptr) return;
  m->Describe("hyrec_loader_lines_total", MetricType::kCounter, "Lines read (file sources).");
  m->Describe("hyrec_loader_bad_lines_total", MetricType::kCounter, "Lines skipped as malformed.");
  m->Describe("hyrec_loader_samples_total", MetricType::kCounter, "Samples delivered in batches.");
  m->Describe("hyrec_loader_batches_total", MetricType::kCounter, "Batches delivered.");
  m->Set("hyrec_loader_lines_total", {}, static_cast<double>(s.lines));
  m->Set("hyrec_loader_bad_lines_total", {}, static_cast<double>(s.bad_lines));
  m->Set("hyrec_loader_samples_total", {}, static_cast<double>(s.samples));
  m->Set("hyrec_loader_batches_total", {}, static_cast<double>(s.batches));
  if (s.stream_lag >= 0) {
    m->Describe("hyrec_loader_stream_lag_records", MetricType::kGauge,
                "A stream source: the records of its topic not yet read (consumer lag).");
    m->Set("hyrec_loader_stream_lag_records", {}, static_cast<double>(s.stream_lag));
  }
}

}  // namespace hyrec::data_loader
