#include "hyrec/dense_worker/train_job.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <iomanip>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "hyrec/common/status_macros.h"
#include "hyrec/common/subprocess.h"
#include "hyrec/common/thread_priority.h"
#include "hyrec/common/yaml_config.h"
#include "hyrec/data_loader/config.h"
#include "hyrec/data_loader/synthetic.h"
#include "hyrec/dense_worker/process_tuning.h"
#include "hyrec/embedding_ps/client.h"

namespace hyrec::dense_worker {
namespace {

constexpr uint64_t kEvalFirstIndex = 1ULL << 40;  // Held-out synthetic samples start here.

absl::Status ReadIntList(const YAML::Node& node, const std::string& key, const std::string& path,
                         std::vector<int>* out) {
  const YAML::Node list = node[key];
  if (!list) return absl::OkStatus();
  if (!list.IsSequence()) {
    return absl::InvalidArgumentError(absl::StrCat(JoinKey(path, key), " (", YamlWhere(list), "): expected a list"));
  }
  out->clear();
  for (size_t i = 0; i < list.size(); ++i) {
    try {
      out->push_back(list[i].as<int>());
    } catch (const YAML::Exception&) {
      return absl::InvalidArgumentError(absl::StrCat(JoinKey(path, key), "[", i, "] (", YamlWhere(list[i]),
                                                     "): not an integer"));
    }
    if (out->back() < 1) {
      return absl::InvalidArgumentError(absl::StrCat(JoinKey(path, key), "[", i, "]: must be >= 1"));
    }
  }
  return absl::OkStatus();
}

std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(const TrainJobConfig& c, DenseModelImpl& model) {
  if (c.dense_optimizer == "sgd") {
    return std::make_unique<torch::optim::SGD>(model.parameters(), torch::optim::SGDOptions(c.dense_learning_rate));
  }
  if (c.dense_optimizer == "adagrad") {
    return std::make_unique<torch::optim::Adagrad>(model.parameters(),
                                                   torch::optim::AdagradOptions(c.dense_learning_rate));
  }
  return std::make_unique<torch::optim::Adam>(model.parameters(), torch::optim::AdamOptions(c.dense_learning_rate));
}

absl::Status CheckDeviceName(const std::string& device) {
  if (device == "cpu" || device == "cuda" || device == "auto") return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("train.device '", device, "' is not cpu, cuda or auto"));
}

}  // namespace

data_loader::LoaderOptions HeldOutLoaderOptions(const TrainJobConfig& c) {
  data_loader::LoaderOptions o = c.loader;
  o.source.synthetic.first_index = kEvalFirstIndex;
  o.source.synthetic.num_samples = c.eval_samples;
  if (c.loader.source.format != data_loader::Format::kSynthetic) o.source.files = c.eval_files;
  o.num_workers = 1;
  o.epochs = 1;
  o.shuffle = false;
  return o;
}

void PublishProgress(double samples, double samples_per_second, double loss, const MetricLabels& labels,
                     MetricsRegistry* m) {
  if (m == nullptr) return;
  m->Describe("hyrec_train_samples_total", MetricType::kCounter, "Samples trained.");
  m->Describe("hyrec_train_samples_per_second", MetricType::kGauge, "Samples trained per second since the start.");
  m->Describe("hyrec_train_loss", MetricType::kGauge, "Mean training loss over the last log interval.");
  m->Set("hyrec_train_samples_total", labels, samples);
  m->Set("hyrec_train_samples_per_second", labels, samples_per_second);
  m->Set("hyrec_train_loss", labels, loss);
}

void PublishTrainerMetrics(const TrainerStats& st, uint32_t worker, MetricsRegistry* m) {
  if (m == nullptr) return;
  const MetricLabels labels = {{"worker", std::to_string(worker)}};
  m->Describe("hyrec_ps_lookup_seconds", MetricType::kSummary, "Wall time of a batch's PS lookups (all tables).");
  m->Describe("hyrec_ps_update_seconds", MetricType::kSummary,
              "Wall time of a batch's PS update, until acknowledged (all tables).");
  m->Describe("hyrec_wait_for_rows_seconds", MetricType::kSummary,
              "Time a batch waited for its looked-up rows: PS latency not hidden by the pipeline.");
  m->Describe("hyrec_observed_staleness", MetricType::kGauge,
              "Mean batches whose updates were unacknowledged when a lookup was issued.");
  m->Describe("hyrec_worker_batches_total", MetricType::kCounter, "Batches trained by the worker.");
  m->SetSummary("hyrec_ps_lookup_seconds", labels, st.lookup_ms * st.lookup_count / 1000.0,
                static_cast<double>(st.lookup_count));
  m->SetSummary("hyrec_ps_update_seconds", labels, st.update_ms * st.update_count / 1000.0,
                static_cast<double>(st.update_count));
  m->SetSummary("hyrec_wait_for_rows_seconds", labels, st.wait_for_rows_ms * st.lookup_count / 1000.0,
                static_cast<double>(st.lookup_count));
  m->Set("hyrec_observed_staleness", labels, st.observed_staleness);
  m->Set("hyrec_worker_batches_total", labels, static_cast<double>(st.batches));
}

absl::Status PublishPsMetrics(embedding_ps::EmbeddingClient* ps, MetricsRegistry* m) {
  if (m == nullptr) return absl::OkStatus();
  HYREC_ASSIGN_OR_RETURN(std::vector<embedding_ps::ShardStats> shards, ps->Stats());
  for (const embedding_ps::ShardStats& shard : shards) {
    embedding_ps::PublishStoreMetrics(shard.store, {{"shard", std::to_string(shard.shard_index)}}, m);
  }
  return absl::OkStatus();
}

void PublishEvaluation(const Evaluation& e, MetricsRegistry* m) {
  if (m == nullptr) return;
  m->Describe("hyrec_eval_auc", MetricType::kGauge, "AUC on the held-out split, at the last evaluation.");
  m->Describe("hyrec_eval_log_loss", MetricType::kGauge, "Mean log loss on the held-out split.");
  m->Describe("hyrec_eval_samples", MetricType::kGauge, "Held-out samples of the last evaluation.");
  m->Set("hyrec_eval_auc", {}, e.auc);
  m->Set("hyrec_eval_log_loss", {}, e.log_loss);
  m->Set("hyrec_eval_samples", {}, static_cast<double>(e.samples));
}

absl::StatusOr<torch::Device> ResolveDevice(const std::string& device, int rank) {
  HYREC_RETURN_IF_ERROR(CheckDeviceName(device));
  const bool cuda = torch::cuda::is_available();
  if (device == "cpu" || (device == "auto" && !cuda)) return torch::Device(torch::kCPU);
  if (!cuda) {
    return absl::FailedPreconditionError(
        "train.device is cuda but no GPU is usable (no device, or this LibTorch was built without CUDA)");
  }
  const int gpus = static_cast<int>(torch::cuda::device_count());
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(rank % gpus));
}

std::shared_ptr<DenseModelImpl> MakeModel(const TrainJobConfig& c) {
  const int slots = c.loader.source.num_slots();
  if (c.model == "dcn") {
    DcnOptions o;
    o.num_dense = c.loader.source.num_dense();
    o.slot_dims.assign(slots, c.embedding_dim);
    o.deep = c.top;
    return std::make_shared<DcnV2Impl>(o);
  }
  DlrmOptions o;
  o.num_dense = c.loader.source.num_dense();
  o.num_slots = slots;
  o.embedding_dim = c.embedding_dim;
  o.bottom = c.bottom;
  o.top = c.top;
  return std::make_shared<DlrmImpl>(o);
}

absl::Status TrainJobConfig::Validate() const {
  HYREC_RETURN_IF_ERROR(loader.Validate());
  if (model != "dlrm" && model != "dcn") return absl::InvalidArgumentError(absl::StrCat("model.kind '", model, "' is not dlrm or dcn"));
  if (embedding_dim < 1 || embedding_dim > 1024) return absl::InvalidArgumentError("model.embedding_dim must be in [1, 1024]");
  if (top.empty()) return absl::InvalidArgumentError("model.top needs at least one layer");
  if (ps_shards < 1 || ps_shards > 64) return absl::InvalidArgumentError("ps.shards must be in [1, 64]");
  if (workers < 1 || workers > 16) return absl::InvalidArgumentError("train.workers must be in [1, 16]");
  if (embedding_staleness < 0 || embedding_staleness > 64) {
    return absl::InvalidArgumentError("train.embedding_staleness must be in [0, 64]");
  }
  if (dense_optimizer != "adam" && dense_optimizer != "adagrad" && dense_optimizer != "sgd") {
    return absl::InvalidArgumentError(absl::StrCat("train.dense_optimizer '", dense_optimizer,
                                                   "' is not adam, adagrad or sgd"));
  }
  if (!(dense_learning_rate > 0)) return absl::InvalidArgumentError("train.dense_learning_rate must be > 0");
  if (log_every_batches < 1) return absl::InvalidArgumentError("train.log_every_batches must be >= 1");
  return CheckDeviceName(device);
}

absl::StatusOr<TrainJobConfig> ParseTrainJobConfig(const YAML::Node& root, absl::string_view source_name) {
  const std::string where(source_name);
  TrainJobConfig c;
  auto fail = [&](const absl::Status& s) { return Annotate(s, where); };
  absl::Status s = CheckKeys(root, "", {"loader", "eval", "model", "ps", "train"});
  if (!s.ok()) return fail(s);
  if (!root["loader"]) return fail(absl::InvalidArgumentError("missing key 'loader'"));
  auto loader = data_loader::ParseLoaderConfig(root["loader"], "loader");
  if (!loader.ok()) return fail(loader.status());
  c.loader = *loader;
  if (const YAML::Node eval = root["eval"]) {
    s = CheckKeys(eval, "eval", {"samples", "every_batches", "files"});
    if (s.ok()) s = ReadScalar(eval, "samples", "eval", &c.eval_samples);
    if (s.ok() && eval["files"]) {
      if (!eval["files"].IsSequence()) {
        s = absl::InvalidArgumentError(absl::StrCat("eval.files (", YamlWhere(eval["files"]), "): expected a list"));
      } else {
        for (size_t i = 0; i < eval["files"].size(); ++i) c.eval_files.push_back(eval["files"][i].as<std::string>());
      }
    }
    if (s.ok()) s = ReadScalar(eval, "every_batches", "eval", &c.eval_every_batches);
    if (!s.ok()) return fail(s);
  }
  if (const YAML::Node model = root["model"]) {
    s = CheckKeys(model, "model", {"kind", "embedding_dim", "bottom", "top", "pooling"});
    if (s.ok()) s = ReadScalar(model, "kind", "model", &c.model);
    if (s.ok()) s = ReadScalar(model, "embedding_dim", "model", &c.embedding_dim);
    if (s.ok()) s = ReadIntList(model, "bottom", "model", &c.bottom);
    if (s.ok()) s = ReadIntList(model, "top", "model", &c.top);
    std::string pooling = "sum";
    if (s.ok()) s = ReadScalar(model, "pooling", "model", &pooling);
    if (!s.ok()) return fail(s);
    if (pooling == "sum") c.pooling = Pooling::kSum;
    else if (pooling == "mean") c.pooling = Pooling::kMean;
    else if (pooling == "sqrtn") c.pooling = Pooling::kSqrtN;
    else return fail(absl::InvalidArgumentError(absl::StrCat("model.pooling (", YamlWhere(model["pooling"]), "): '",
                                                             pooling, "' is not sum, mean or sqrtn")));
  }
  c.embedding_optimizer.kind = embedding_ps::OptimizerKind::kAdagrad;
  c.embedding_optimizer.learning_rate = 0.05f;
  if (const YAML::Node ps = root["ps"]) {
    s = CheckKeys(ps, "ps", {"shards", "capacity_rows", "optimizer", "learning_rate", "init_stddev"});
    if (s.ok()) s = ReadScalar(ps, "shards", "ps", &c.ps_shards);
    if (s.ok()) s = ReadScalar(ps, "capacity_rows", "ps", &c.ps_capacity_rows);
    std::string kind = "adagrad";
    if (s.ok()) s = ReadScalar(ps, "optimizer", "ps", &kind);
    if (s.ok()) s = ReadScalar(ps, "learning_rate", "ps", &c.embedding_optimizer.learning_rate);
    if (!s.ok()) return fail(s);
    auto parsed = embedding_ps::ParseOptimizerKind(kind);
    if (!parsed.ok()) return fail(Annotate(parsed.status(), absl::StrCat("ps.optimizer (", YamlWhere(ps["optimizer"]), ")")));
    c.embedding_optimizer.kind = *parsed;
    if (ps["init_stddev"]) {
      c.embedding_initializer.kind = embedding_ps::InitializerKind::kNormal;
      s = ReadScalar(ps, "init_stddev", "ps", &c.embedding_initializer.stddev);
      if (!s.ok()) return fail(s);
    }
  }
  if (const YAML::Node train = root["train"]) {
    s = CheckKeys(train, "train", {"workers", "embedding_staleness", "dense_optimizer", "dense_learning_rate",
                                   "log_every_batches", "seed", "device"});
    if (s.ok()) s = ReadScalar(train, "workers", "train", &c.workers);
    if (s.ok()) s = ReadScalar(train, "embedding_staleness", "train", &c.embedding_staleness);
    if (s.ok()) s = ReadScalar(train, "dense_optimizer", "train", &c.dense_optimizer);
    if (s.ok()) s = ReadScalar(train, "dense_learning_rate", "train", &c.dense_learning_rate);
    if (s.ok()) s = ReadScalar(train, "log_every_batches", "train", &c.log_every_batches);
    if (s.ok()) s = ReadScalar(train, "seed", "train", &c.seed);
    if (s.ok()) s = ReadScalar(train, "device", "train", &c.device);
    if (!s.ok()) return fail(s);
  }
  c.loader.num_workers = c.workers;
  c.loader.num_shards = c.ps_shards;
  s = c.Validate();
  if (!s.ok()) return fail(s);
  return c;
}

absl::StatusOr<TrainReport> RunTrainJob(const TrainJobConfig& c, std::ostream* log, bool terminal,
                                        MetricsRegistry* metrics,
                                        const std::vector<data_loader::BatchStream*>& streams) {
  HYREC_RETURN_IF_ERROR(c.Validate());
  if (!streams.empty() && streams.size() != static_cast<size_t>(c.workers)) {
    return absl::InvalidArgumentError(
        absl::StrCat(streams.size(), " batch streams given for ", c.workers, " workers"));
  }
  TuneTrainingProcess();  // Idle BLAS threads sleep, freed tensors stay mapped (process_tuning.h).
  const int num_tables = c.loader.num_tables();
  // PS: one table per loader table, all shards in this process.
  embedding_ps::StoreOptions store_options;
  for (int t = 0; t < num_tables; ++t) {
    embedding_ps::TableConfig table;
    table.name = absl::StrCat("t", t);
    table.dim = c.embedding_dim;
    table.seed = static_cast<uint64_t>(t);  // As `hyrec ps --tables` numbers them.
    table.optimizer = c.embedding_optimizer;
    table.initializer = c.embedding_initializer;
    store_options.tables.push_back(table);
  }
  store_options.capacity_rows = c.ps_capacity_rows;
  std::vector<std::shared_ptr<embedding_ps::EmbeddingShardStore>> stores;
  for (int s = 0; s < c.ps_shards; ++s) {
    HYREC_ASSIGN_OR_RETURN(auto store, embedding_ps::EmbeddingShardStore::Create(store_options));
    stores.push_back(std::move(store));
  }
  HYREC_ASSIGN_OR_RETURN(auto ps, embedding_ps::NewInProcessEmbeddingClient(stores));

  TrainerOptions trainer_options;
  for (int t = 0; t < num_tables; ++t) trainer_options.table_names.push_back(absl::StrCat("t", t));
  trainer_options.slot_tables = c.loader.slot_tables;
  trainer_options.pooling.assign(c.loader.source.num_slots(), c.pooling);
  trainer_options.embedding_staleness = c.embedding_staleness;
  HYREC_ASSIGN_OR_RETURN(trainer_options.device, ResolveDevice(c.device, 0));
  if (trainer_options.device.is_cuda() && c.workers > static_cast<int>(torch::cuda::device_count())) {
    return absl::FailedPreconditionError(absl::StrCat("train.workers is ", c.workers, " on cuda but there are ",
                                                      torch::cuda::device_count(),
                                                      " GPUs (NCCL needs one GPU per worker)"));
  }

  // The loader shares the machine with the dense step: its threads run on the cores it leaves idle.
  data_loader::LoaderOptions loader_options = c.loader;
  loader_options.thread_nice = kIdleNice;
  std::unique_ptr<data_loader::Loader> loader;
  if (streams.empty()) {
    HYREC_ASSIGN_OR_RETURN(loader, data_loader::Loader::Start(loader_options, {}));
  }
  const bool synthetic = c.loader.source.format == data_loader::Format::kSynthetic;
  TrainReport report;
  if (synthetic) report.teacher_auc = data_loader::SyntheticSource(c.loader.source.synthetic).TeacherAuc(c.eval_samples);
  if (metrics != nullptr && synthetic) {
    metrics->Describe("hyrec_teacher_auc", MetricType::kGauge, "Synthetic data: the teacher's AUC, the best reachable.");
    metrics->Set("hyrec_teacher_auc", {}, report.teacher_auc);
  }

  auto evaluate = [&](DenseModelImpl& model) -> absl::StatusOr<Evaluation> {
    if (!synthetic && c.eval_files.empty()) return Evaluation();
    HYREC_ASSIGN_OR_RETURN(auto eval_loader, data_loader::Loader::Start(HeldOutLoaderOptions(c), {}));
    return Evaluate(eval_loader->stream(0), ps.get(), trainer_options, model);
  };

  const int port = hyrec::PickFreeLoopbackPort();
  std::mutex mu;
  absl::Status failure;
  std::vector<std::shared_ptr<DenseModelImpl>> models(c.workers);
  std::vector<TrainerStats> stats(c.workers);
  double loss_window = 0;
  uint64_t loss_count = 0, samples_done = 0;
  const uint64_t total_samples =
      synthetic ? c.loader.source.synthetic.num_samples * std::max<uint64_t>(c.loader.epochs, 1) : 0;
  const absl::Time start = absl::Now();
  absl::Time warm_start = absl::InfinitePast();
  uint64_t warm_samples = 0;
  std::vector<std::thread> workers;
  for (int w = 0; w < c.workers; ++w) {
    workers.emplace_back([&, w] {
      // Workers are threads: with several, give each one intra-op thread (a per-thread setting).
      // With one, LibTorch's default is kept: setting it explicitly was measured 2x slower here.
      if (c.workers > 1) torch::set_num_threads(1);
      auto fail = [&](const absl::Status& s) {
        std::lock_guard<std::mutex> lock(mu);
        if (failure.ok()) failure = Annotate(s, absl::StrCat("worker ", w));
        if (loader != nullptr) loader->Stop();  // Unblocks the other workers' streams.
      };
      std::shared_ptr<DenseModelImpl> model;
      {
        std::lock_guard<std::mutex> lock(mu);  // Module initialization uses the global generator.
        torch::manual_seed(c.seed);
        model = MakeModel(c);
      }
      TrainerOptions options = trainer_options;
      options.worker_id = static_cast<uint32_t>(w);
      if (options.device.is_cuda()) options.device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(w));
      model->to(options.device);
      models[w] = model;
      std::unique_ptr<nn_sync::DenseSync> sync;
      if (c.workers > 1 || options.device.is_cuda()) {
        nn_sync::SyncOptions sync_options;
        sync_options.rank = w;
        sync_options.world_size = c.workers;
        sync_options.master_port = port;
        sync_options.device_is_cuda = options.device.is_cuda();
        auto created = nn_sync::DenseSync::Create(sync_options);
        if (!created.ok()) return fail(created.status());
        sync = std::move(*created);
        absl::Status s = sync->BroadcastParameters(model->parameters());
        if (!s.ok()) return fail(s);
        sync->AttachToParameters(model->parameters());
      }
      auto optimizer = MakeOptimizer(c, *model);
      TrainingContext ctx(options, loader != nullptr ? loader->stream(w) : streams[w], ps.get(), sync.get(), model,
                          optimizer.get());
      for (TrainBatch* batch = nullptr; ctx.Next(&batch);) {
        torch::Tensor loss = torch::binary_cross_entropy_with_logits(ctx.Forward(*batch), batch->labels);
        const double loss_value = loss.item<double>();
        if (!std::isfinite(loss_value)) return fail(absl::InternalError("the loss became NaN/Inf"));
        absl::Status s = ctx.Backward(loss);
        if (!s.ok()) return fail(s);
        if (w != 0) continue;
        std::lock_guard<std::mutex> lock(mu);
        loss_window += loss_value;
        ++loss_count;
        samples_done = ctx.stats().samples * c.workers;
        if (ctx.stats().batches == TrainReport::kWarmupBatches) {
          warm_start = absl::Now();
          warm_samples = samples_done;
        }
        if (ctx.stats().batches % c.log_every_batches == 0) {
          const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
          const double rate = samples_done / std::max(seconds, 1e-9);
          report.mean_loss_last = loss_window / loss_count;
          report.losses.emplace_back(samples_done, report.mean_loss_last);
          const TrainerStats st = ctx.stats();
          if (metrics != nullptr) {
            PublishProgress(static_cast<double>(samples_done), rate, report.mean_loss_last, {}, metrics);
            PublishTrainerMetrics(st, options.worker_id, metrics);
            (void)PublishPsMetrics(ps.get(), metrics);
          }
          std::ostringstream line;
          line << "samples " << samples_done;
          if (total_samples > 0) line << "/" << total_samples;
          line << "  " << std::fixed << std::setprecision(0) << rate << " samples/s  loss "
               << std::setprecision(4) << report.mean_loss_last;
          if (!terminal) {  // Log lines carry the PS figures; the live line stays short.
            line << "  lookup " << std::setprecision(1) << st.lookup_ms << " ms  update " << st.update_ms
                 << " ms  waited " << st.wait_for_rows_ms << " ms  staleness " << std::setprecision(2)
                 << st.observed_staleness;
          }
          if (total_samples > 0 && rate > 0) {
            line << "  ETA " << std::setprecision(0) << std::max(0.0, (total_samples - samples_done) / rate) << " s";
          }
          if (log != nullptr) *log << (terminal ? "\r" : "") << line.str() << (terminal ? "   " : "\n") << std::flush;
          loss_window = 0;
          loss_count = 0;
        }
        if (c.eval_every_batches > 0 && ctx.stats().batches % c.eval_every_batches == 0 && c.workers == 1) {
          auto e = evaluate(*model);
          if (e.ok()) {
            report.evals.emplace_back(samples_done, *e);
            PublishEvaluation(*e, metrics);
            if (log != nullptr) {
              *log << (terminal ? "\r" : "") << "eval at " << samples_done << " samples: AUC " << std::fixed
                   << std::setprecision(4) << e->auc << "  log loss " << e->log_loss << (terminal ? "   \n" : "\n")
                   << std::flush;
            }
          }
        }
      }
      absl::Status s = ctx.Finish();
      if (!s.ok()) return fail(s);
      std::lock_guard<std::mutex> lock(mu);
      stats[w] = ctx.stats();
    });
  }
  for (auto& t : workers) t.join();
  if (!failure.ok()) return failure;
  if (terminal && log != nullptr) *log << "\n";
  const absl::Time end = absl::Now();
  const double seconds = absl::ToDoubleSeconds(end - start);
  for (const TrainerStats& s : stats) report.samples += s.samples;
  report.samples_per_second = report.samples / std::max(seconds, 1e-9);
  if (warm_start != absl::InfinitePast() && report.samples > warm_samples) {
    report.steady_samples_per_second =
        (report.samples - warm_samples) / std::max(absl::ToDoubleSeconds(end - warm_start), 1e-9);
  }
  report.stats = stats[0];
  if (loss_count > 0) {  // The last, partial log interval.
    report.mean_loss_last = loss_window / loss_count;
    report.losses.emplace_back(report.samples, report.mean_loss_last);
  }
  HYREC_ASSIGN_OR_RETURN(report.final_eval, evaluate(*models[0]));
  report.evals.emplace_back(report.samples, report.final_eval);
  if (metrics != nullptr) {
    PublishProgress(static_cast<double>(report.samples), report.samples_per_second, report.mean_loss_last, {},
                    metrics);
    PublishTrainerMetrics(report.stats, 0, metrics);
    PublishEvaluation(report.final_eval, metrics);
    HYREC_RETURN_IF_ERROR(PublishPsMetrics(ps.get(), metrics));
  }
  return report;
}

}  // namespace hyrec::dense_worker
