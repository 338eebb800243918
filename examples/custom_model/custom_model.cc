// A custom dense model trained with hyrec's C++ API: the PS, the loader, the staleness window and
// the dense sync stay behind TrainingContext. Run: build/hyrec-custom-model
#include <cstdio>

#include "hyrec/dense_worker/process_tuning.h"
#include "hyrec/dense_worker/trainer.h"

using namespace hyrec;

// Concatenates the pooled slot embeddings with the dense features; two hidden layers.
struct WideModel : dense_worker::DenseModelImpl {
  WideModel(int dense, int slots, int dim) {
    mlp = register_module("mlp", dense_worker::Mlp(dense + slots * dim, {128, 64}, 1));
  }
  torch::Tensor forward(torch::Tensor dense, const std::vector<torch::Tensor>& pooled) override {
    std::vector<torch::Tensor> parts = {dense};
    parts.insert(parts.end(), pooled.begin(), pooled.end());
    return mlp->forward(torch::cat(parts, 1)).squeeze(1);
  }
  torch::nn::Sequential mlp{nullptr};
};

int main() {
  dense_worker::TuneTrainingProcess();                  // Idle BLAS threads sleep, freed memory stays.
  data_loader::LoaderOptions data;                      // The synthetic teacher, 26 slots.
  data.source.synthetic.num_samples = 300'000;
  data.source.synthetic.vocabulary = 1000;
  data.batch_size = 512;
  embedding_ps::StoreOptions ps_options;                // One PS table per slot, dim 8.
  dense_worker::TrainerOptions options;
  for (int s = 0; s < 26; ++s) {
    embedding_ps::TableConfig table;
    table.name = "slot" + std::to_string(s);
    table.dim = 8;
    table.optimizer.learning_rate = 0.05f;              // Adagrad on the PS.
    ps_options.tables.push_back(table);
    options.table_names.push_back(table.name);
  }
  auto ps = *embedding_ps::NewInProcessEmbeddingClient({*embedding_ps::EmbeddingShardStore::Create(ps_options)});
  auto loader = *data_loader::Loader::Start(data, {});
  auto model = std::make_shared<WideModel>(13, 26, 8);
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(2e-3));
  options.embedding_staleness = 4;                      // Hybrid: lookups run ahead of updates.

  dense_worker::TrainingContext ctx(options, loader->stream(0), ps.get(), /*sync=*/nullptr, model, &optimizer);
  for (dense_worker::TrainBatch* batch = nullptr; ctx.Next(&batch);) {
    torch::Tensor loss = torch::binary_cross_entropy_with_logits(ctx.Forward(*batch), batch->labels);
    if (!ctx.Backward(loss).ok()) return 1;
  }
  if (!ctx.Finish().ok()) return 1;

  data.source.synthetic.first_index = 1ULL << 40;       // Held out: same teacher, new samples.
  data.source.synthetic.num_samples = 50'000;
  auto held_out = *data_loader::Loader::Start(data, {});
  auto eval = *dense_worker::Evaluate(held_out->stream(0), ps.get(), options, *model);
  std::printf("held-out AUC %.4f (teacher %.4f)\n", eval.auc,
              data_loader::SyntheticSource(data.source.synthetic).TeacherAuc(50'000));
  return 0;
}
