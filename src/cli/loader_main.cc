// hyrec-loader (`hyrec loader`): the data-loader tier as a process. Streams each dense worker its
// batches over gRPC (DataService); on SIGTERM it writes every worker's stream position to
// --positions_out so a new loader can resume exactly (--resume).
//
//   hyrec loader --config=loader.yaml --port=7100
//   hyrec loader --config=loader.yaml --resume=positions.txt
#include <csignal>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "hyrec/common/signals.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/common/yaml_config.h"
#include "hyrec/data_loader/config.h"
#include "hyrec/data_loader/data_service.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, host, "0.0.0.0", "Address to listen on.");
ABSL_FLAG(int, port, 0, "Port; 0 picks a free one (printed on start).");
ABSL_FLAG(std::string, config, "", "YAML loader configuration (docs/data.md).");
ABSL_FLAG(std::string, section, "", "Read the loader configuration from this key of the file "
                                    "(e.g. 'loader' in a hyrec train job file).");
ABSL_FLAG(int, num_workers, 0, "Overrides num_workers (0: as configured).");
ABSL_FLAG(int, num_shards, 0, "Overrides num_shards (0: as configured).");
ABSL_FLAG(std::string, resume, "", "File of per-worker positions to resume from.");
ABSL_FLAG(std::string, positions_out, "", "Where to write the workers' positions on shutdown.");
ABSL_FLAG(int, replay_batches, 16,
          "Batches kept per worker after sending, so a broken stream can reconnect losslessly.");
ABSL_FLAG(std::string, log_level, "info", "spdlog level.");

namespace {

using namespace hyrec::data_loader;

absl::Status Run() {
  const std::string config = absl::GetFlag(FLAGS_config);
  if (config.empty()) return absl::InvalidArgumentError("--config is required");
  HYREC_ASSIGN_OR_RETURN(YAML::Node root, hyrec::LoadYamlFile(config));
  const std::string section = absl::GetFlag(FLAGS_section);
  if (!section.empty() && !root[section]) {
    return absl::InvalidArgumentError(absl::StrCat(config, ": no '", section, "' section"));
  }
  auto options = ParseLoaderConfig(section.empty() ? root : root[section], section);
  if (!options.ok()) return hyrec::Annotate(options.status(), config);
  if (absl::GetFlag(FLAGS_num_workers) > 0) options->num_workers = absl::GetFlag(FLAGS_num_workers);
  if (absl::GetFlag(FLAGS_num_shards) > 0) options->num_shards = absl::GetFlag(FLAGS_num_shards);
  std::vector<ReaderPosition> resume;
  if (const std::string path = absl::GetFlag(FLAGS_resume); !path.empty()) {
    std::ifstream in(path);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read --resume file '", path, "'"));
    std::stringstream text;
    text << in.rdbuf();
    auto parsed = ParsePositions(text.str());
    if (!parsed.ok()) return hyrec::Annotate(parsed.status(), path);
    resume = std::move(*parsed);
  }
  const sigset_t stop_signals = hyrec::BlockStopSignals();

  if (options->source.format == Format::kSynthetic) {
    const double auc = SyntheticSource(options->source.synthetic).TeacherAuc(200'000);
    spdlog::info("synthetic source: the teacher's AUC (the best any model can reach) is {:.4f}", auc);
  }
  HYREC_ASSIGN_OR_RETURN(auto loader, Loader::Start(*options, resume));
  Loader* raw_loader = loader.get();
  DataServerOptions server_options;
  server_options.host = absl::GetFlag(FLAGS_host);
  server_options.port = absl::GetFlag(FLAGS_port);
  server_options.replay_batches = absl::GetFlag(FLAGS_replay_batches);
  HYREC_ASSIGN_OR_RETURN(auto server, DataServer::Start(std::move(loader), *options, resume, server_options));
  std::cout << "hyrec loader for " << options->num_workers << " worker(s) listening on "
            << server_options.host << ":" << server->port() << std::endl;
  const int signal = hyrec::WaitForStopSignal(stop_signals);
  spdlog::info("signal {}: shutting down", signal);
  if (const std::string out = absl::GetFlag(FLAGS_positions_out); !out.empty()) {
    std::vector<ReaderPosition> positions;
    for (int w = 0; w < options->num_workers; ++w) positions.push_back(raw_loader->stream(w)->Position());
    std::ofstream(out) << FormatPositions(positions);
  }
  server->Shutdown(absl::Seconds(2));
  server->Wait();
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("hyrec loader: stream batches to dense workers");
  std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() > 1) {
    std::cerr << "hyrec loader: unexpected argument '" << rest[1] << "'\n";
    return 2;
  }
  spdlog::set_level(spdlog::level::from_str(absl::GetFlag(FLAGS_log_level)));
  spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [loader] [%l] %v");
  absl::Status status = Run();
  if (!status.ok()) {
    std::cerr << "hyrec loader: " << status.message() << "\n";
    return 1;
  }
  return 0;
}
