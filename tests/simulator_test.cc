// The simulator (include/hyrec/planner/simulator.h) on cases whose answer follows from the costs
// alone: a synchronous worker's round trip, a dense-bound hybrid one, CPU sharing, the window's
// staleness, and the named bottleneck of a cluster bound by each of its parts.
#include "hyrec/planner/simulator.h"

#include "gtest/gtest.h"

namespace hyrec::planner {
namespace {

// A batch of 1,000 samples: 10 ms of dense step; lookups and updates of 1 ms on each side.
StepCosts Costs() {
  StepCosts c;
  c.batch_size = 1000;
  c.train_ms = 10;
  c.lookup_client_ms = 1;
  c.update_client_ms = 1;
  c.lookup_server_ms = 1;
  c.update_server_ms = 1;
  c.loader_ms = 1;
  c.shards = 1;
  c.id_bytes = 8e4;
  c.row_bytes = 6.4e5;
  c.batch_bytes = 2e5;
  c.dense_bytes = 4e6;
  return c;
}

SimulationOptions Cluster() {
  SimulationOptions o;
  o.one_machine = false;
  o.worker_cores = 8;
  o.ps_cores = 8;
  o.loader_cores = 8;
  o.batches = 200;
  return o;
}

TEST(SimulatorTest, ASynchronousWorkerWaitsForEveryRoundTrip) {
  SimulationOptions o = Cluster();
  o.staleness = 0;
  o.added_rtt_ms = 20;
  const SimulationResult r = Simulate(Costs(), o);
  // A batch: wait for the previous update (client 1, rtt 20, server 1), look up (client 0.5, rtt
  // 20, server 1, client 0.5), train 10: 54 ms.
  EXPECT_NEAR(r.samples_per_second, 1000 / 0.054, 1000 / 0.054 * 0.01);
  EXPECT_EQ(r.observed_staleness, 0);
  EXPECT_NEAR(r.wait_for_rows_ms, 22, 0.5);
  EXPECT_NEAR(r.wait_for_acks_ms, 22, 0.5);
  EXPECT_EQ(r.bottleneck, Resource::kLatency);
}

TEST(SimulatorTest, AHybridWorkerHidesTheRoundTripAndIsBoundByItsDenseStep) {
  SimulationOptions o = Cluster();
  o.staleness = 4;
  o.added_rtt_ms = 5;
  const SimulationResult r = Simulate(Costs(), o);
  EXPECT_NEAR(r.samples_per_second, 1000 / 0.010, 1000 / 0.010 * 0.01);
  EXPECT_LT(r.wait_for_rows_ms, 0.1);  // The first batch's lookup, with nothing to hide behind.
  EXPECT_EQ(r.bottleneck, Resource::kDenseStep);
  // The window looks two batches ahead and the updates lag by their round trip: staleness
  // between 1 and the bound.
  EXPECT_GE(r.observed_staleness, 1);
  EXPECT_LE(r.observed_staleness, 4);
}

TEST(SimulatorTest, ARoundTripLongerThanTheWindowShowsThroughTheStaleness) {
  SimulationOptions o = Cluster();
  o.staleness = 4;
  o.added_rtt_ms = 60;  // Longer than the two dense steps the lookahead covers.
  const SimulationResult r = Simulate(Costs(), o);
  EXPECT_LT(r.samples_per_second, 0.8 * 1000 / 0.010);
  EXPECT_GT(r.wait_for_rows_ms, 10);
  EXPECT_EQ(r.bottleneck, Resource::kLatency);
}

TEST(SimulatorTest, RolesSharingOneCoreShareItsTime) {
  SimulationOptions o;
  o.one_machine = true;
  o.machine_cores = 1;
  o.staleness = 8;
  o.batches = 200;
  const StepCosts c = Costs();
  const SimulationResult r = Simulate(c, o);
  // Every CPU figure of a batch, one after another on the one core.
  const double cpu_ms =
      c.train_ms + c.lookup_client_ms + c.update_client_ms + c.lookup_server_ms + c.update_server_ms + c.loader_ms;
  EXPECT_NEAR(r.samples_per_second, 1000 / cpu_ms * 1e3, 1000 / cpu_ms * 1e3 * 0.02);
  EXPECT_EQ(r.bottleneck, Resource::kCpu);
  // Two cores: the dense step on one, the rest (5 ms) beside it, but for the moments when two
  // other threads run with it.
  o.machine_cores = 2;
  EXPECT_NEAR(Simulate(c, o).samples_per_second, 1000 / 0.010, 1000 / 0.010 * 0.03);
  // 1.2 usable cores of the two: the 15 ms of a batch take 12.5 ms.
  o.usable_cores = 1.2;
  EXPECT_NEAR(Simulate(c, o).samples_per_second, 1000 / 0.0125, 1000 / 0.0125 * 0.02);
}

TEST(SimulatorTest, EachPartOfAClusterIsNamedWhenItBoundsTheRate) {
  SimulationOptions o = Cluster();
  StepCosts c = Costs();
  c.lookup_server_ms = c.update_server_ms = 40;  // One core a call: 80 ms a batch on a shard.
  o.workers = 16;
  o.shards = 1;
  o.ps_cores = 4;
  SimulationResult r = Simulate(c, o);
  EXPECT_EQ(r.bottleneck, Resource::kPsCpu);
  // 16 workers' 80 ms of PS CPU a batch on 4 cores: 320 ms for 16 batches.
  EXPECT_NEAR(r.samples_per_second, 16 * 1000 / 0.320, 16 * 1000 / 0.320 * 0.05);

  c = Costs();
  c.dense_bytes = 0;
  o = Cluster();
  o.workers = 8;
  o.network_gbps = 1;  // 8 workers' rows (0.64 MB each, and their framing) out of one PS machine: 43 ms a step.
  r = Simulate(c, o);
  EXPECT_EQ(r.bottleneck, Resource::kPsNetwork);
  const double step_seconds = 8 * 6.4e5 * kLinkFraming * 8 / 1e9;
  EXPECT_NEAR(r.samples_per_second, 8 * 1000 / step_seconds, 8 * 1000 / step_seconds * 0.05);

  o = Cluster();
  o.workers = 8;
  o.loader_threads = 2;  // 8 workers' batches of 10 ms on 2 loader threads: 40 ms a step.
  c = Costs();
  c.loader_ms = 10;
  r = Simulate(c, o);
  EXPECT_EQ(r.bottleneck, Resource::kLoader);
  EXPECT_NEAR(r.samples_per_second, 8 * 1000 / 0.040, 8 * 1000 / 0.040 * 0.05);

  o = Cluster();
  o.workers = 4;
  o.network_gbps = 1;
  o.ps_machines = 4;
  o.shards = 4;
  c = Costs();
  c.dense_bytes = 1e7;  // The allreduce: 2 x 3/4 x 10 MB out of each worker, 120 ms.
  r = Simulate(c, o);
  EXPECT_EQ(r.bottleneck, Resource::kWorkerNetwork);
}

TEST(SimulatorTest, WorkersStepTogether) {
  SimulationOptions o = Cluster();
  o.workers = 4;
  const SimulationResult r = Simulate(Costs(), o);
  EXPECT_NEAR(r.samples_per_second, 4 * 1000 / 0.010, 4 * 1000 / 0.010 * 0.02);
}

}  // namespace
}  // namespace hyrec::planner

namespace hyrec::planner {
namespace {

// The cores a measured run could use: those with which the simulation reproduces its rate.
TEST(SimulatorTest, UsableCoresReproduceTheCalibrationRunsRate) {
  SimulationOptions o;
  o.one_machine = true;
  o.machine_cores = 2;
  o.staleness = 8;
  StepCosts c = Costs();
  c.samples_per_second = 80000;  // Slower than two cores allow (100,000).
  const double usable = UsableCores(c, o);
  EXPECT_GT(usable, 1);
  EXPECT_LT(usable, 2);
  o.usable_cores = usable;
  EXPECT_NEAR(Simulate(c, o).samples_per_second, 80000, 800);
  c.samples_per_second = 150000;  // Faster than the simulation with every core: all of them.
  EXPECT_EQ(UsableCores(c, o), 0);
}

}  // namespace
}  // namespace hyrec::planner
