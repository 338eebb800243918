// The training plot: held-out AUC (left axis, with the teacher's) and training loss (right axis)
// against samples trained, drawn by gnuplot when it is installed.
#ifndef HYREC_SRC_CLI_PLOT_H_
#define HYREC_SRC_CLI_PLOT_H_

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "hyrec/dense_worker/report.h"

namespace hyrec::cli {

// gnuplot's path from $PATH, or empty.
std::string FindGnuplot();

// Writes `png` with gnuplot (within a deadline); its data and script go beside it and are removed.
absl::Status PlotReport(const dense_worker::TrainReport& report, const std::string& png, const std::string& gnuplot);

// PlotReport when `png` is not empty, telling `out` what became of it.
void PlotIfAsked(const dense_worker::TrainReport& report, const std::string& png, std::ostream& out);

}  // namespace hyrec::cli

#endif  // HYREC_SRC_CLI_PLOT_H_
