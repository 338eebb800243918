// TrainMain: hyrec's command line as a function, for a program of one's own that registers its
// models (model_registry.h) and then behaves exactly as `hyrec train`: the same flags, job file,
// progress line, metrics endpoint, plot, evaluations, several workers and --processes.
//
//   absl::StatusOr<std::shared_ptr<DenseModelImpl>> MakeTwoTower(const ModelContext& c);  // yours
//   int main(int argc, char** argv) {
//     absl::Status s = hyrec::dense_worker::RegisterModel("two_tower", MakeTwoTower);
//     if (!s.ok()) return 1;
//     return hyrec::dense_worker::TrainMain(argc, argv);
//   }
//
//   ./my_trainer --config=job.yaml                # model.kind: two_tower, embedded
//   ./my_trainer --config=job.yaml --processes    # every role a process: this same program
//
// The program is also every role of the job: `./my_trainer worker ...`, `./my_trainer ps ...` and
// `./my_trainer loader ...` take the flags of `hyrec worker`, `hyrec ps` and `hyrec loader`;
// --processes starts it that way, so the workers know its models. `./my_trainer train ...` is the
// same as without the word. Returns the exit code (include/hyrec/common/exit_codes.h).
#ifndef HYREC_DENSE_WORKER_TRAIN_MAIN_H_
#define HYREC_DENSE_WORKER_TRAIN_MAIN_H_

namespace hyrec::dense_worker {

int TrainMain(int argc, char** argv);

}  // namespace hyrec::dense_worker

#endif  // HYREC_DENSE_WORKER_TRAIN_MAIN_H_
