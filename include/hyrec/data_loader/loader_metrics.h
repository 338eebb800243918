// The loader's figures on a metrics registry (/metrics): what `hyrec loader --metrics_port`
// serves, and the embedded job beside its own.
#ifndef HYREC_DATA_LOADER_LOADER_METRICS_H_
#define HYREC_DATA_LOADER_LOADER_METRICS_H_

#include "hyrec/common/metrics.h"
#include "hyrec/data_loader/loader.h"

namespace hyrec::data_loader {

// hyrec_loader_lines_total, _bad_lines_total, _samples_total, _batches_total and, for a stream
// source once known, hyrec_loader_stream_lag_records.
void PublishLoaderMetrics(const LoaderStats& stats, MetricsRegistry* metrics);

}  // namespace hyrec::data_loader

#endif  // HYREC_DATA_LOADER_LOADER_METRICS_H_
