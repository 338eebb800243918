// hyrec-worker (`hyrec worker`): one dense worker of a cluster. Reads its batches from a
// `hyrec loader`, looks rows up and pushes gradients to `hyrec ps` shards, and syncs the dense
// gradients with the other workers through c10d (Gloo on CPU). Rank and world size come from
// flags or from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT. Rank 0 evaluates at the end.
//
//   hyrec worker --config=job.yaml --ps=ps-0:7000,ps-1:7000 --loader=loader:7100
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_split.h"
#include "hyrec/common/metrics_server.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/common/yaml_config.h"
#include "hyrec/data_loader/data_service.h"
#include "hyrec/data_loader/synthetic.h"
#include "hyrec/dense_worker/process_tuning.h"
#include "hyrec/dense_worker/train_job.h"

ABSL_FLAG(int, metrics_port, -1,
          "Serve Prometheus metrics (samples, loss, PS latency, staleness, PS rows and evictions) "
          "at http://0.0.0.0:<port>/metrics; 0: any free port; -1: off.");
ABSL_FLAG(std::string, config, "", "The job's YAML (model, train and eval sections are used).");
ABSL_FLAG(std::string, ps, "", "PS addresses in shard order, comma-separated.");
ABSL_FLAG(std::string, loader, "", "Address of the hyrec loader.");
ABSL_FLAG(int, rank, -1, "This worker's rank (default: $RANK, else 0).");
ABSL_FLAG(int, world_size, -1, "Number of workers (default: $WORLD_SIZE, else 1).");
ABSL_FLAG(std::string, master_addr, "", "Rendezvous host (default: $MASTER_ADDR, else 127.0.0.1).");
ABSL_FLAG(int, master_port, -1, "Rendezvous port (default: $MASTER_PORT, else 29500).");

namespace {

using namespace hyrec;

absl::Status Run() {
  HYREC_ASSIGN_OR_RETURN(YAML::Node root, LoadYamlFile(absl::GetFlag(FLAGS_config)));
  HYREC_ASSIGN_OR_RETURN(auto job, dense_worker::ParseTrainJobConfig(root, absl::GetFlag(FLAGS_config)));
  nn_sync::SyncOptions sync_options;
  HYREC_RETURN_IF_ERROR(sync_options.ReadEnvironment([](const char* name) { return std::getenv(name); }));
  if (absl::GetFlag(FLAGS_rank) >= 0) sync_options.rank = absl::GetFlag(FLAGS_rank);
  if (absl::GetFlag(FLAGS_world_size) >= 0) sync_options.world_size = absl::GetFlag(FLAGS_world_size);
  if (!absl::GetFlag(FLAGS_master_addr).empty()) sync_options.master_addr = absl::GetFlag(FLAGS_master_addr);
  if (absl::GetFlag(FLAGS_master_port) >= 0) sync_options.master_port = absl::GetFlag(FLAGS_master_port);
  HYREC_RETURN_IF_ERROR(sync_options.Validate());
  const int rank = sync_options.rank;

  std::vector<std::string> ps_addresses = absl::StrSplit(absl::GetFlag(FLAGS_ps), ',', absl::SkipEmpty());
  HYREC_ASSIGN_OR_RETURN(auto ps, embedding_ps::ConnectEmbeddingClient(ps_addresses, embedding_ps::ClientOptions()));
  HYREC_ASSIGN_OR_RETURN(auto stream, data_loader::ConnectBatchStream(absl::GetFlag(FLAGS_loader), rank, {}));
  std::unique_ptr<nn_sync::DenseSync> sync;
  torch::manual_seed(job.seed);
  std::shared_ptr<dense_worker::DenseModelImpl> model = dense_worker::MakeModel(job);
  HYREC_ASSIGN_OR_RETURN(const torch::Device device, dense_worker::ResolveDevice(job.device, rank));
  model->to(device);
  sync_options.device_is_cuda = device.is_cuda();
  if (sync_options.world_size > 1 || device.is_cuda()) {
    HYREC_ASSIGN_OR_RETURN(sync, nn_sync::DenseSync::Create(sync_options));
    HYREC_RETURN_IF_ERROR(sync->BroadcastParameters(model->parameters()));
    sync->AttachToParameters(model->parameters());
  }
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(job.dense_learning_rate));
  dense_worker::TrainerOptions options;
  for (int t = 0; t < job.loader.num_tables(); ++t) options.table_names.push_back("t" + std::to_string(t));
  options.slot_tables = job.loader.slot_tables;
  options.pooling.assign(job.loader.source.num_slots(), job.pooling);
  options.embedding_staleness = job.embedding_staleness;
  options.worker_id = static_cast<uint32_t>(rank);
  options.device = device;
  MetricsRegistry metrics;
  std::unique_ptr<MetricsHttpServer> metrics_server;
  if (absl::GetFlag(FLAGS_metrics_port) >= 0) {
    HYREC_ASSIGN_OR_RETURN(metrics_server, MetricsHttpServer::Start("0.0.0.0", absl::GetFlag(FLAGS_metrics_port), &metrics));
    std::printf("worker %d: metrics on port %d\n", rank, metrics_server->port());
    std::fflush(stdout);
  }
  const absl::Time start = absl::Now();
  dense_worker::TrainingContext ctx(options, stream.get(), ps.get(), sync.get(), model, &optimizer);
  for (dense_worker::TrainBatch* batch = nullptr; ctx.Next(&batch);) {
    torch::Tensor loss = torch::binary_cross_entropy_with_logits(ctx.Forward(*batch), batch->labels);
    HYREC_RETURN_IF_ERROR(ctx.Backward(loss));
    const dense_worker::TrainerStats st = ctx.stats();
    if (st.batches % job.log_every_batches == 0) {
      const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
      if (metrics_server != nullptr) {
        dense_worker::PublishProgress(static_cast<double>(st.samples), st.samples / seconds, loss.item<double>(),
                                      {{"worker", std::to_string(rank)}}, &metrics);
        dense_worker::PublishTrainerMetrics(st, options.worker_id, &metrics);
        (void)dense_worker::PublishPsMetrics(ps.get(), &metrics);
      }
      if (rank == 0) {
        std::printf("worker 0: %llu samples, %.0f samples/s, loss %.4f, lookup %.1f ms, update %.1f ms, "
                    "staleness %.2f\n",
                    static_cast<unsigned long long>(st.samples), st.samples / seconds, loss.item<double>(),
                    st.lookup_ms, st.update_ms, st.observed_staleness);
        std::fflush(stdout);
      }
    }
  }
  HYREC_RETURN_IF_ERROR(ctx.Finish());
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const auto stats = ctx.stats();
  if (rank != 0) return absl::OkStatus();
  std::printf("summary: %llu samples on worker 0, %.0f samples/s per worker\n",
              static_cast<unsigned long long>(stats.samples), stats.samples / seconds);
  if (job.loader.source.format == data_loader::Format::kSynthetic) {
    HYREC_ASSIGN_OR_RETURN(auto eval_loader,
                           data_loader::Loader::Start(dense_worker::HeldOutLoaderOptions(job), {}));
    HYREC_ASSIGN_OR_RETURN(auto e, dense_worker::Evaluate(eval_loader->stream(0), ps.get(), options, *model));
    dense_worker::PublishEvaluation(e, &metrics);
    std::printf("  held-out AUC %.4f, log loss %.4f (%llu samples)\n", e.auc, e.log_loss,
                static_cast<unsigned long long>(e.samples));
    std::printf("  teacher AUC  %.4f\n", data_loader::SyntheticSource(job.loader.source.synthetic).TeacherAuc(job.eval_samples));
  }
  std::printf("  PS lookup %.2f ms, update %.2f ms per batch; waited %.2f ms per batch for rows; observed "
              "staleness %.2f batches\n",
              stats.lookup_ms, stats.update_ms, stats.wait_for_rows_ms, stats.observed_staleness);
  std::fflush(stdout);
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  hyrec::dense_worker::TuneTrainingProcess();  // Before any thread runs BLAS or allocates.
  absl::SetProgramUsageMessage("hyrec worker: one dense worker of a cluster");
  absl::ParseCommandLine(argc, argv);
  absl::Status status = Run();
  if (!status.ok()) {
    std::cerr << "hyrec worker: " << status.message() << "\n";
    return 1;
  }
  return 0;
}
