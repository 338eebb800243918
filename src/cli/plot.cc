#include "src/cli/plot.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/common/subprocess.h"

namespace hyrec::cli {

std::string FindGnuplot() {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return "";
  for (absl::string_view dir : absl::StrSplit(path, ':')) {
    std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/gnuplot");
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

absl::Status PlotReport(const dense_worker::TrainReport& report, const std::string& png, const std::string& gnuplot) {
  const std::string auc_data = png + ".auc.dat", loss_data = png + ".loss.dat", script = png + ".gp";
  {
    std::ofstream auc(auc_data), loss(loss_data);
    for (const auto& [samples, e] : report.evals) auc << samples << " " << e.auc << "\n";
    for (const auto& [samples, l] : report.losses) loss << samples << " " << l << "\n";
    if (!auc || !loss) return absl::UnavailableError(absl::StrCat("cannot write ", auc_data, " or ", loss_data));
  }
  std::ofstream gp(script);
  gp << "set terminal png size 960,600\nset output '" << png << "'\n"
     << "set title 'hyrec train: held-out AUC and training loss'\nset xlabel 'samples trained'\n"
     << "set format x '%.1s%c'\nset ylabel 'AUC'\nset y2label 'log loss'\nset ytics nomirror\nset y2tics\n"
     << "set key bottom right\nset grid\n";
  std::string plots;
  if (!report.evals.empty()) {
    plots = "'" + auc_data + "' using 1:2 axes x1y1 with linespoints title 'held-out AUC'";
  }
  if (report.teacher_auc > 0) {
    absl::StrAppend(&plots, plots.empty() ? "" : ", ", report.teacher_auc,
                    " axes x1y1 with lines dt 2 title 'teacher AUC'");
  }
  if (!report.losses.empty()) {
    absl::StrAppend(&plots, plots.empty() ? "" : ", ", "'", loss_data,
                    "' using 1:2 axes x1y2 with lines title 'training loss'");
  }
  if (plots.empty()) return absl::FailedPreconditionError("nothing to plot (no evaluation and no loss)");
  gp << "plot " << plots << "\n";
  gp.close();
  if (!gp) return absl::UnavailableError(absl::StrCat("cannot write ", script));
  HYREC_ASSIGN_OR_RETURN(auto p, Subprocess::Spawn({gnuplot, script}));
  HYREC_ASSIGN_OR_RETURN(int code, p->Wait(absl::Seconds(60)));
  if (code != 0) return absl::InternalError(absl::StrCat("gnuplot exited with ", code, " on ", script));
  std::remove(auc_data.c_str());
  std::remove(loss_data.c_str());
  std::remove(script.c_str());
  return absl::OkStatus();
}

void PlotIfAsked(const dense_worker::TrainReport& report, const std::string& png, std::ostream& out) {
  if (png.empty() || report.resumed_at_end) return;  // Nothing trained: an earlier run's plot stays.
  const std::string gnuplot = FindGnuplot();
  if (gnuplot.empty()) {
    out << "  (gnuplot is not installed: no plot)\n";
    return;
  }
  const absl::Status plotted = PlotReport(report, png, gnuplot);
  if (plotted.ok()) {
    out << "  plot: " << png << " (held-out AUC and training loss against samples)\n";
  } else {
    out << "  plot failed: " << plotted.message() << "\n";
  }
  out.flush();
}

}  // namespace hyrec::cli
