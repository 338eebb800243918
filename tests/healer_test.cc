// Healer with real Gloo groups whose ranks are threads: the heal state's bytes, the agreement on
// the newest survivor's state, and the survivors' wait for a replacement that ends at its
// timeout or at a stop request, carrying the cause.
#include "src/dense_worker/healer.h"

#include <atomic>
#include <functional>
#include <future>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "deadline.h"
#include "gtest/gtest.h"
#include "hyrec/common/subprocess.h"

namespace hyrec::dense_worker {
namespace {

nn_sync::SyncOptions Options(int rank, int world, int port) {
  nn_sync::SyncOptions o;
  o.rank = rank;
  o.world_size = world;
  o.master_port = port;
  o.timeout = absl::Seconds(20);
  return o;
}

HealState Sample() {
  HealState h;
  h.dense.model = std::string("model\0bytes", 11);
  h.dense.optimizer = "optimizer";
  h.sequence_origin = 1ULL << 40;
  h.run_tag = 77;
  h.base_step = 100;
  h.base_samples = 6400;
  h.run_samples = 320;
  h.last_batch_id = 41;
  h.last_cut_step = UINT64_MAX;
  h.delta_sequence = 3;
  h.cuts = 5;
  h.best_checkpoint = "ckpt-000000000004-77";
  return h;
}

TEST(HealState, TravelsWholeAndMalformedBytesAreDataLoss) {
  const HealState h = Sample();
  const std::string bytes = EncodeHealState(h);
  absl::StatusOr<HealState> back = DecodeHealState(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->dense.model, h.dense.model);
  EXPECT_EQ(back->dense.optimizer, h.dense.optimizer);
  EXPECT_EQ(back->sequence_origin, h.sequence_origin);
  EXPECT_EQ(back->run_tag, h.run_tag);
  EXPECT_EQ(back->base_step, h.base_step);
  EXPECT_EQ(back->base_samples, h.base_samples);
  EXPECT_EQ(back->run_samples, h.run_samples);
  EXPECT_EQ(back->last_batch_id, h.last_batch_id);
  EXPECT_EQ(back->last_cut_step, h.last_cut_step);
  EXPECT_EQ(back->delta_sequence, h.delta_sequence);
  EXPECT_EQ(back->cuts, h.cuts);
  EXPECT_EQ(back->best_checkpoint, h.best_checkpoint);
  HealState none;
  absl::StatusOr<HealState> fresh = DecodeHealState(EncodeHealState(none));
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(fresh->last_batch_id, -1);

  EXPECT_EQ(DecodeHealState(bytes.substr(0, bytes.size() - 1)).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeHealState(bytes + "x").status().code(), absl::StatusCode::kDataLoss);
}

TEST(Healer, AWorkerAloneOrWithoutATimeoutOrAskedToStopDoesNotHeal) {
  HealerOptions o;
  o.timeout = absl::Seconds(30);
  EXPECT_FALSE(Healer(nullptr, o).CanHeal());
  const absl::Status cause = absl::UnavailableError("peer gone");
  EXPECT_EQ(Healer(nullptr, o).Regroup(cause), cause);
}

// Runs `agree` on a Healer of every rank of a new group of `world` threads, each with its
// completed steps; returns each rank's agreement (or why it had none).
std::vector<absl::StatusOr<Healer::Agreement>> AgreeInGroup(
    const std::vector<int64_t>& completed, const std::function<absl::StatusOr<HealState>(int rank)>& capture) {
  const int world = static_cast<int>(completed.size());
  const int port = hyrec::PickFreeLoopbackPort();
  std::vector<absl::StatusOr<Healer::Agreement>> agreed(world, absl::UnknownError("not run"));
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      auto sync = nn_sync::DenseSync::Create(Options(r, world, port));
      if (!sync.ok()) {
        agreed[r] = sync.status();
        return;
      }
      HealerOptions o;
      o.rank = r;
      o.timeout = absl::Seconds(20);
      Healer healer(sync->get(), o);
      EXPECT_TRUE(healer.CanHeal());
      agreed[r] = healer.Agree(completed[r], [&, r] { return capture(r); });
    });
  }
  for (std::thread& t : ranks) t.join();
  return agreed;
}

// Ranks at steps {5, 6, 6, -1}: rank 1 (the lowest of the newest) sends; only it captures; every
// rank, the replacement (-1) too, gets its state.
TEST(Healer, EveryRankAgreesOnTheLowestNewestSurvivorsState) {
  std::atomic<int> captures{0};
  const std::vector<absl::StatusOr<Healer::Agreement>> agreed =
      AgreeInGroup({5, 6, 6, -1}, [&](int rank) -> absl::StatusOr<HealState> {
        ++captures;
        HealState h = Sample();
        h.run_tag = static_cast<uint32_t>(rank);
        return h;
      });
  EXPECT_EQ(captures.load(), 1);
  for (size_t r = 0; r < agreed.size(); ++r) {
    ASSERT_TRUE(agreed[r].ok()) << "rank " << r << ": " << agreed[r].status();
    EXPECT_EQ(agreed[r]->source, 1);
    EXPECT_EQ(agreed[r]->newest, 6);
    EXPECT_EQ(agreed[r]->state.run_tag, 1u);
    EXPECT_EQ(agreed[r]->state.best_checkpoint, Sample().best_checkpoint);
  }
}

TEST(Healer, AGroupWithoutTrainedStateCannotAgree) {
  for (const auto& a : AgreeInGroup({-1, -1}, [](int) { return absl::StatusOr<HealState>(HealState()); })) {
    EXPECT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition) << a.status();
  }
}

// The survivor of a group of two whose peer leaves, waiting with `options`; returns the wait's
// status and how long it took. `during` runs in the wait.
absl::Status WaitAlone(HealerOptions options, absl::Duration* took, const std::function<void()>& during) {
  const int port = hyrec::PickFreeLoopbackPort();
  std::promise<void> created;
  std::future<void> survivor_created = created.get_future();
  absl::Status result;
  std::thread survivor([&] {
    auto sync = nn_sync::DenseSync::Create(Options(0, 2, port));
    created.set_value();
    if (!sync.ok()) {
      result = sync.status();
      return;
    }
    Healer healer(sync->get(), options);
    const absl::Time start = absl::Now();
    result = healer.Regroup(absl::UnavailableError("the allreduce of step 9 failed"));
    *took = absl::Now() - start;
  });
  {
    auto lost = nn_sync::DenseSync::Create(Options(1, 2, port));
    survivor_created.wait_for(std::chrono::seconds(30));
    EXPECT_TRUE(lost.ok()) << lost.status();
  }  // Rank 1 is gone.
  during();
  survivor.join();
  return result;
}

TEST(Healer, WaitingForAReplacementEndsAtTheTimeoutWithTheCause) {
  HealerOptions o;
  o.timeout = absl::Seconds(3);
  o.slice = absl::Milliseconds(500);
  absl::Duration took;
  const absl::Status s = WaitAlone(o, &took, [] {});
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "the allreduce of step 9 failed; healing the group failed: ")) << s;
  EXPECT_GE(took, absl::Seconds(3) - absl::Milliseconds(50));
  EXPECT_LT(took, hyrec::testing::Bounded(absl::Seconds(3)));
}

TEST(Healer, AStopRequestEndsTheWait) {
  std::atomic<bool> stop{false};
  HealerOptions o;
  o.timeout = absl::Seconds(600);
  o.slice = absl::Milliseconds(200);
  o.stop = &stop;
  absl::Duration took;
  const absl::Status s = WaitAlone(o, &took, [&] {
    absl::SleepFor(absl::Milliseconds(500));
    stop = true;
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "the allreduce of step 9 failed")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "stopped while waiting for the replacement")) << s;
  EXPECT_LT(took, hyrec::testing::Bounded(absl::Seconds(1)));
}

}  // namespace
}  // namespace hyrec::dense_worker
