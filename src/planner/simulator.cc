#include "hyrec/planner/simulator.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <memory>
#include <queue>
#include <unordered_map>
#include <utility>
#include <vector>

#include "hyrec/common/staleness_window.h"

namespace hyrec::planner {
namespace {

// Linux's CFS weights of nice 0 and nice 10 (kernel/sched/core.c, sched_prio_to_weight).
constexpr double kNice0 = 1024;
constexpr double kNice10 = 110;

// What a CPU task's core-milliseconds count toward.
enum Account { kDense, kWorkerCpu, kPsCpu, kLoaderCpu, kRelayCpu, kAccounts };

// A machine's cores, shared by its runnable tasks as CFS shares them: each thread gets cores in
// proportion to its weight, at most one.
struct Pool {
  double cores = 1;
  std::vector<int> tasks;  // Running task ids.
  double used_ms = 0;      // Core-milliseconds run, in the timed part.
};

struct Task {
  double remaining = 0;  // Core-milliseconds left.
  double threads = 1;
  double weight = kNice0;
  double rate = 0;  // Cores it runs on now (all its threads).
  int pool = 0;
  Account account = kDense;
  std::function<void()> done;
};

// A machine's egress: messages leave one after another at its bandwidth.
struct Link {
  double free_at = 0;
  double busy_ms = 0;  // In the timed part.
};

struct Worker {
  int pool = 0;
  int link = -1;
  int loader = 0;  // The loader machine of its stream.
  uint64_t next_index = 0;
  uint64_t trained = 0;
  std::deque<uint64_t> window;
  std::vector<char> rows_ready;
  std::vector<char> acked;
  std::vector<int> shards_left;  // Per batch: shards yet to answer the lookup, then the update.
  std::vector<double> lookup_start, update_start;
  uint64_t acked_prefix = 0;  // Every batch below is acknowledged.
  // Where the training thread is (Simulation::Continue) and what it waits for.
  enum Phase {
    kFillBeforeTake,
    kWaitRows,
    kFillBeforeTrain,
    kTraining,
    kTrained,
    kFillAfterUpdate,
    kFinished
  } phase = kFillBeforeTake;
  uint64_t current = 0;  // The batch taken from the window.
  enum Wait { kNone, kAcks, kLoader, kRows, kBarrier, kDone } wait = kNone;
  uint64_t wait_arg = 0;
  double wait_start = 0;
  int ready_batches = 0;     // From the loader, not yet taken.
  int promised_batches = 0;  // Ready or being made.
  uint64_t batches_made = 0;
  double warm_time = -1;
  double end_time = 0;
};

class Simulation {
 public:
  Simulation(const StepCosts& c, const SimulationOptions& o) : c_(c), o_(o) {}

  SimulationResult Run() {
    Place();
    for (int w = 0; w < o_.workers; ++w) {
      workers_[w].rows_ready.assign(o_.batches, 0);
      workers_[w].acked.assign(o_.batches, 0);
      workers_[w].shards_left.assign(o_.batches, 0);
      workers_[w].lookup_start.assign(o_.batches, 0);
      workers_[w].update_start.assign(o_.batches, 0);
    }
    for (int l = 0; l < static_cast<int>(loader_idle_.size()); ++l) {
      loader_idle_[l] = o_.loader_threads;
      FeedLoader(l);
    }
    for (int w = 0; w < o_.workers; ++w) Continue(w);
    Loop();
    return Result();
  }

 private:
  // ---- Placement -------------------------------------------------------------------------------
  void Place() {
    workers_.resize(o_.workers);
    const int loaders = o_.one_machine ? 1 : std::max(1, o_.loader_machines);
    loader_idle_.assign(loaders, 0);
    loader_next_.assign(loaders, 0);
    if (o_.one_machine) {
      AddPool(o_.usable_cores > 0 ? o_.usable_cores : o_.machine_cores);
      ps_pool_.assign(o_.shards, 0);
      loader_pool_.assign(1, 0);
      return;
    }
    for (int w = 0; w < o_.workers; ++w) {
      workers_[w].pool = AddPool(o_.worker_cores);
      workers_[w].link = AddLink();
      workers_[w].loader = w % loaders;
    }
    const int ps_machines = std::max(1, std::min(o_.ps_machines, o_.shards));
    std::vector<int> machine_pool, machine_link;
    for (int m = 0; m < ps_machines; ++m) {
      machine_pool.push_back(AddPool(o_.ps_cores));
      machine_link.push_back(AddLink());
    }
    for (int s = 0; s < o_.shards; ++s) {
      ps_pool_.push_back(machine_pool[s * ps_machines / o_.shards]);
      ps_link_.push_back(machine_link[s * ps_machines / o_.shards]);
    }
    ps_machine_links_ = machine_link;
    for (int l = 0; l < loaders; ++l) {
      loader_pool_.push_back(AddPool(o_.loader_cores));
      loader_link_.push_back(AddLink());
    }
  }
  int AddPool(double cores) {
    pools_.emplace_back();
    pools_.back().cores = std::max(0.1, cores);
    return static_cast<int>(pools_.size()) - 1;
  }
  int AddLink() {
    links_.emplace_back();
    return static_cast<int>(links_.size()) - 1;
  }

  // ---- Events, CPU and network -----------------------------------------------------------------
  void At(double time, std::function<void()> f) { events_.push({time, seq_++, std::move(f)}); }

  void RunCpu(int pool, Account account, double ms, double weight, std::function<void()> done) {
    if (ms <= 0) {
      At(now_, std::move(done));
      return;
    }
    int id;
    if (!free_tasks_.empty()) {
      id = free_tasks_.back();
      free_tasks_.pop_back();
    } else {
      id = static_cast<int>(tasks_.size());
      tasks_.emplace_back();
    }
    tasks_[id] = Task{ms, 1, weight, 0, pool, account, std::move(done)};
    pools_[pool].tasks.push_back(id);
    Share(pool);
  }

  // Water-filling: the heaviest threads reach a whole core first.
  void Share(int p) {
    Pool& pool = pools_[p];
    std::vector<int>& ids = pool.tasks;
    std::sort(ids.begin(), ids.end(), [&](int a, int b) { return tasks_[a].weight > tasks_[b].weight; });
    double cores = pool.cores;
    double weight = 0, threads = 0;
    for (int id : ids) weight += tasks_[id].weight * tasks_[id].threads;
    for (int id : ids) threads += tasks_[id].threads;
    if (threads <= cores) {
      for (int id : ids) tasks_[id].rate = tasks_[id].threads;
      return;
    }
    size_t i = 0;
    for (; i < ids.size(); ++i) {
      const Task& t = tasks_[ids[i]];
      if (cores / weight * t.weight < 1) break;  // Lighter threads than this one share what is left.
      tasks_[ids[i]].rate = t.threads;
      cores -= t.threads;
      weight -= t.weight * t.threads;
    }
    for (; i < ids.size(); ++i) tasks_[ids[i]].rate = tasks_[ids[i]].threads * tasks_[ids[i]].weight * cores / weight;
  }

  // Sends `bytes` out of `link` (-1: no link of its own) and calls `f` when they arrived, a
  // one-way delay later.
  void Send(int link, double bytes, std::function<void()> f) {
    double arrive = now_;
    if (link >= 0 && o_.network_gbps > 0) {
      Link& l = links_[link];
      const double start = std::max(now_, l.free_at);
      const double ms = bytes * kLinkFraming * 8 / (o_.network_gbps * 1e9) * 1e3;
      l.free_at = start + ms;
      if (timing_) l.busy_ms += ms;
      arrive = l.free_at;
    }
    At(arrive + o_.added_rtt_ms / 2, std::move(f));
  }

  void Loop() {
    while (true) {
      double next = events_.empty() ? kNever : events_.top().time;
      int finishing = -1;
      for (const Pool& pool : pools_) {
        for (int id : pool.tasks) {
          const double t = now_ + tasks_[id].remaining / tasks_[id].rate;
          if (t < next) {
            next = t;
            finishing = id;
          }
        }
      }
      if (next == kNever) return;
      Advance(next);
      if (finishing >= 0) {
        Task& t = tasks_[finishing];
        std::vector<int>& ids = pools_[t.pool].tasks;
        ids.erase(std::find(ids.begin(), ids.end(), finishing));
        std::function<void()> done = std::move(t.done);
        Share(t.pool);
        free_tasks_.push_back(finishing);
        done();
      } else {
        Event e = events_.top();
        events_.pop();
        e.f();
      }
    }
  }

  void Advance(double to) {
    const double dt = to - now_;
    if (dt > 0) {
      for (Pool& pool : pools_) {
        for (int id : pool.tasks) {
          Task& t = tasks_[id];
          t.remaining = std::max(0.0, t.remaining - t.rate * dt);
          if (timing_) {
            pool.used_ms += t.rate * dt;
            account_ms_[t.account] += t.rate * dt;
          }
        }
      }
      if (timing_) {
        for (const Worker& w : workers_) {
          if (w.wait == Worker::kNone) dense_busy_ms_ += dt;
        }
      }
    }
    now_ = to;
  }

  // ---- The loader ------------------------------------------------------------------------------
  void FeedLoader(int l) {
    while (loader_idle_[l] > 0) {
      int chosen = -1;
      for (int k = 0; k < o_.workers; ++k) {
        const int w = (loader_next_[l] + k) % o_.workers;
        Worker& wk = workers_[w];
        if (wk.loader == l && wk.promised_batches < o_.prefetch_batches &&
            wk.batches_made < static_cast<uint64_t>(o_.batches)) {
          chosen = w;
          break;
        }
      }
      if (chosen < 0) return;
      loader_next_[l] = (chosen + 1) % o_.workers;
      --loader_idle_[l];
      Worker& wk = workers_[chosen];
      ++wk.promised_batches;
      ++wk.batches_made;
      RunCpu(loader_pool_[l], kLoaderCpu, c_.loader_ms, kNice0, [this, l, chosen] {
        ++loader_idle_[l];
        const int link = loader_link_.empty() ? -1 : loader_link_[l];
        Send(link, c_.batch_bytes, [this, chosen] {
          ++workers_[chosen].ready_batches;
          if (workers_[chosen].wait == Worker::kLoader) Resume(chosen);
        });
        FeedLoader(l);
      });
    }
  }

  // ---- A worker's training thread --------------------------------------------------------------
  // As TrainingContext runs it: Next fills the window, takes its oldest batch, waits for its rows
  // and fills the window again; the batch trains; Backward pushes its update and fills the window.
  // Filling blocks the thread while the window rule waits for acknowledgements or the loader has
  // no batch ready.
  void Continue(int w) {
    Worker& wk = workers_[w];
    for (;;) {
      switch (wk.phase) {
        case Worker::kFillBeforeTake:
          if (!Fill(w)) return;
          if (wk.window.empty()) {
            wk.phase = Worker::kFinished;
            wk.wait = Worker::kDone;
            wk.end_time = now_;
            return;
          }
          wk.current = wk.window.front();
          wk.window.pop_front();
          wk.phase = Worker::kWaitRows;
          break;
        case Worker::kWaitRows:
          if (!wk.rows_ready[wk.current]) return Block(w, Worker::kRows, wk.current);
          wk.phase = Worker::kFillBeforeTrain;
          break;
        case Worker::kFillBeforeTrain:
          if (!Fill(w)) return;
          wk.phase = Worker::kTraining;
          return Train(w, wk.current);
        case Worker::kTrained:
          Update(w, wk.current);
          wk.phase = Worker::kFillAfterUpdate;
          break;
        case Worker::kFillAfterUpdate:
          if (!Fill(w)) return;
          wk.phase = Worker::kFillBeforeTake;
          break;
        default:
          return;
      }
    }
  }

  // Issues the lookups the window allows; false when the thread blocked (Block says on what).
  bool Fill(int w) {
    Worker& wk = workers_[w];
    const StalenessWindow rule(o_.staleness);
    while (wk.window.size() < rule.depth() && wk.next_index < static_cast<uint64_t>(o_.batches)) {
      const uint64_t m = wk.next_index;
      if (wk.trained < rule.TrainedBefore(m)) return true;
      const uint64_t need = rule.AckedBefore(m);
      if (wk.acked_prefix < need) {
        Block(w, Worker::kAcks, need);
        return false;
      }
      if (wk.ready_batches == 0) {
        Block(w, Worker::kLoader, 0);
        return false;
      }
      --wk.ready_batches;
      --wk.promised_batches;
      FeedLoader(wk.loader);
      staleness_sum_ += static_cast<double>(m) - static_cast<double>(wk.acked_prefix);
      ++lookups_;
      ++wk.next_index;
      wk.window.push_back(m);
      Lookup(w, m);
    }
    return true;
  }

  void Block(int w, Worker::Wait why, uint64_t arg) {
    Worker& wk = workers_[w];
    wk.wait = why;
    wk.wait_arg = arg;
    wk.wait_start = now_;
  }

  // What the training thread waited for arrived (or may have): account the wait, go on.
  void Resume(int w) {
    Worker& wk = workers_[w];
    const double waited = now_ - wk.wait_start;
    switch (wk.wait) {
      case Worker::kAcks:
        if (wk.acked_prefix < wk.wait_arg) return;
        wait_acks_ms_ += waited;
        break;
      case Worker::kLoader:
        wait_loader_ms_ += waited;
        break;
      case Worker::kRows:
        if (!wk.rows_ready[wk.wait_arg]) return;
        wait_rows_ms_ += waited;
        break;
      default:
        return;
    }
    wk.wait = Worker::kNone;
    Continue(w);
  }

  void Train(int w, uint64_t n) {
    Worker& wk = workers_[w];
    wk.wait = Worker::kNone;
    RunCpu(wk.pool, kDense, c_.train_ms, kNice0, [this, w, n] {
      if (o_.workers == 1) return Trained(w);
      Block(w, Worker::kBarrier, n);
      if (++barrier_[n] < o_.workers) return;
      barrier_.erase(n);
      // The allreduce: each worker sends and receives 2 (W-1)/W of the dense gradients.
      const double bytes = 2.0 * (o_.workers - 1) / o_.workers * c_.dense_bytes;
      auto left = std::make_shared<int>(o_.workers);
      for (int v = 0; v < o_.workers; ++v) {
        Send(workers_[v].link, bytes, [this, left] {
          if (--*left > 0) return;
          for (int u = 0; u < o_.workers; ++u) {
            workers_[u].wait = Worker::kNone;
            Trained(u);
          }
        });
      }
    });
  }

  void Trained(int w) {
    Worker& wk = workers_[w];
    ++wk.trained;
    if (wk.trained == static_cast<uint64_t>(o_.warmup_batches)) {
      wk.warm_time = now_;
      if (w == 0) timing_ = true, timing_start_ = now_;
    }
    wk.phase = Worker::kTrained;
    Continue(w);
  }

  double ClientMs(double all_shards) const {
    const double rows = std::max(0.0, all_shards - c_.shards * c_.rpc_client_ms);
    return c_.rpc_client_ms + rows / o_.shards;
  }
  double ServerMs(double all_shards) const {
    const double rows = std::max(0.0, all_shards - c_.shards * c_.rpc_server_ms);
    return c_.rpc_server_ms + rows / o_.shards;
  }
  // The delaying relay between a worker and a shard (SimulationOptions::relay) forwarding a
  // message of the batch's `all_shards_bytes` shared by the shards, then `f`.
  void Relay(double all_shards_bytes, std::function<void()> f) {
    const double bytes = 2 * (c_.id_bytes + c_.row_bytes);
    if (!o_.relay || c_.relay_ms <= 0 || bytes <= 0) return f();
    RunCpu(0, kRelayCpu, c_.relay_ms * all_shards_bytes / bytes / o_.shards, kNice0, std::move(f));
  }
  double ClientWeight() const { return o_.one_machine ? kNice10 : kNice0; }

  // One RPC of batch n to every shard: the client's half before, the shard, its half after.
  void Lookup(int w, uint64_t n) {
    Worker& wk = workers_[w];
    wk.shards_left[n] = o_.shards;
    wk.lookup_start[n] = now_;
    const double client = ClientMs(c_.lookup_client_ms) / 2;
    const double server = ServerMs(c_.lookup_server_ms);
    for (int s = 0; s < o_.shards; ++s) {
      RunCpu(wk.pool, kWorkerCpu, client, ClientWeight(), [this, w, n, s, client, server] {
        Send(workers_[w].link, c_.id_bytes / o_.shards, [this, w, n, s, client, server] {
          Relay(c_.id_bytes, [this, w, n, s, client, server] {
            RunCpu(ps_pool_[s], kPsCpu, server, kNice0, [this, w, n, s, client] {
              Send(ps_link_.empty() ? -1 : ps_link_[s], c_.row_bytes / o_.shards, [this, w, n, client] {
                Relay(c_.row_bytes, [this, w, n, client] {
                  RunCpu(workers_[w].pool, kWorkerCpu, client, ClientWeight(), [this, w, n] {
                    Worker& wk = workers_[w];
                    if (--wk.shards_left[n] > 0) return;
                    wk.rows_ready[n] = 1;
                    lookup_ms_ += now_ - wk.lookup_start[n];
                    if (wk.wait == Worker::kRows) Resume(w);
                  });
                });
              });
            });
          });
        });
      });
    }
  }

  void Update(int w, uint64_t n) {
    Worker& wk = workers_[w];
    wk.shards_left[n] = o_.shards;
    wk.update_start[n] = now_;
    const double client = ClientMs(c_.update_client_ms);
    const double server = ServerMs(c_.update_server_ms);
    for (int s = 0; s < o_.shards; ++s) {
      RunCpu(wk.pool, kWorkerCpu, client, ClientWeight(), [this, w, n, s, server] {
        Send(workers_[w].link, (c_.id_bytes + c_.row_bytes) / o_.shards, [this, w, n, s, server] {
          Relay(c_.id_bytes + c_.row_bytes, [this, w, n, s, server] {
            RunCpu(ps_pool_[s], kPsCpu, server, kNice0, [this, w, n, s] {
              Send(ps_link_.empty() ? -1 : ps_link_[s], 0, [this, w, n] {
                Worker& wk = workers_[w];
                if (--wk.shards_left[n] > 0) return;
                wk.acked[n] = 1;
                ++updates_;
                update_ms_ += now_ - wk.update_start[n];
                while (wk.acked_prefix < wk.acked.size() && wk.acked[wk.acked_prefix]) ++wk.acked_prefix;
                if (wk.wait == Worker::kAcks) Resume(w);
              });
            });
          });
        });
      });
    }
  }

  // ---- Results ---------------------------------------------------------------------------------
  SimulationResult Result() {
    SimulationResult r;
    double end = 0;
    for (const Worker& wk : workers_) end = std::max(end, wk.end_time);
    const double span = end - timing_start_;
    const double batches = static_cast<double>(o_.workers) * o_.batches;
    const double timed = static_cast<double>(o_.workers) * (o_.batches - o_.warmup_batches);
    if (span > 0 && timed > 0) r.samples_per_second = timed * c_.batch_size / span * 1e3;
    r.wait_for_rows_ms = wait_rows_ms_ / batches;
    r.wait_for_acks_ms = wait_acks_ms_ / batches;
    r.wait_for_loader_ms = wait_loader_ms_ / batches;
    r.observed_staleness = lookups_ > 0 ? staleness_sum_ / lookups_ : 0;
    r.lookup_ms = lookup_ms_ / batches;
    r.update_ms = updates_ > 0 ? update_ms_ / updates_ : 0;
    if (span <= 0) return r;
    r.utilization.push_back({Resource::kDenseStep, dense_busy_ms_ / (o_.workers * span)});
    if (o_.one_machine) {
      r.utilization.push_back({Resource::kCpu, pools_[0].used_ms / (pools_[0].cores * span)});
    } else {
      auto pool_busy = [&](const std::vector<int>& pools, Account account, double threads_cap) {
        double cores = 0;
        std::vector<int> seen;
        for (int p : pools) {
          if (std::find(seen.begin(), seen.end(), p) != seen.end()) continue;
          seen.push_back(p);
          cores += std::min(pools_[p].cores, threads_cap);
        }
        return cores > 0 ? account_ms_[account] / (cores * span) : 0;
      };
      r.utilization.push_back({Resource::kPsCpu, pool_busy(ps_pool_, kPsCpu, 1e9)});
      r.utilization.push_back({Resource::kLoader, pool_busy(loader_pool_, kLoaderCpu, o_.loader_threads)});
      std::vector<int> worker_pools;
      for (const Worker& wk : workers_) worker_pools.push_back(wk.pool);
      r.utilization.push_back({Resource::kWorkerCpu, pool_busy(worker_pools, kWorkerCpu, 1e9)});
      auto link_busy = [&](const std::vector<int>& links) {
        double busy = 0;
        for (int l : links) busy += links_[l].busy_ms;
        return links.empty() ? 0 : busy / (links.size() * span);
      };
      std::vector<int> worker_links;
      for (const Worker& wk : workers_) worker_links.push_back(wk.link);
      r.utilization.push_back({Resource::kPsNetwork, link_busy(ps_machine_links_)});
      r.utilization.push_back({Resource::kWorkerNetwork, link_busy(worker_links)});
    }
    std::stable_sort(r.utilization.begin(), r.utilization.end(),
                     [](const auto& a, const auto& b) { return a.busy > b.busy; });
    r.bottleneck = r.utilization.front().busy >= 0.85 ? r.utilization.front().resource : Resource::kLatency;
    return r;
  }

  static constexpr double kNever = 1e300;
  struct Event {
    double time;
    uint64_t seq;
    std::function<void()> f;
    bool operator<(const Event& o) const { return time != o.time ? time > o.time : seq > o.seq; }
  };

  const StepCosts c_;
  const SimulationOptions o_;
  double now_ = 0;
  uint64_t seq_ = 0;
  std::priority_queue<Event> events_;
  std::vector<Pool> pools_;
  std::vector<Task> tasks_;
  std::vector<int> free_tasks_;
  std::vector<Link> links_;
  std::vector<Worker> workers_;
  std::vector<int> ps_pool_, ps_link_, ps_machine_links_;
  std::vector<int> loader_pool_, loader_link_, loader_idle_, loader_next_;
  std::unordered_map<uint64_t, int> barrier_;
  bool timing_ = false;
  double timing_start_ = 0;
  double account_ms_[kAccounts] = {};
  double dense_busy_ms_ = 0;
  double wait_rows_ms_ = 0, wait_acks_ms_ = 0, wait_loader_ms_ = 0;
  double staleness_sum_ = 0;
  uint64_t lookups_ = 0, updates_ = 0;
  double lookup_ms_ = 0, update_ms_ = 0;
};

}  // namespace

SimulationResult Simulate(const StepCosts& costs, const SimulationOptions& options) {
  SimulationOptions o = options;
  o.workers = std::max(1, o.workers);
  o.shards = std::max(1, o.shards);
  o.batches = std::max(o.batches, o.warmup_batches + 1);
  o.loader_threads = std::max(1, o.loader_threads);
  o.prefetch_batches = std::max(1, o.prefetch_batches);
  return Simulation(costs, o).Run();
}

double UsableCores(const StepCosts& costs, SimulationOptions calibration) {
  calibration.one_machine = true;
  calibration.usable_cores = 0;
  const SimulationResult all = Simulate(costs, calibration);
  if (costs.samples_per_second > 0) {
    if (all.samples_per_second <= costs.samples_per_second) return 0;
    // The predicted rate grows with the cores: bisect for the measured one.
    double low = 0.1, high = calibration.machine_cores;
    for (int i = 0; i < 20; ++i) {
      calibration.usable_cores = (low + high) / 2;
      (Simulate(costs, calibration).samples_per_second < costs.samples_per_second ? low : high) =
          calibration.usable_cores;
    }
    return (low + high) / 2;
  }
  for (const SimulationResult::Use& u : all.utilization) {
    if (u.resource == Resource::kCpu && u.busy >= 0.9 && costs.cores_used > 0) {
      return std::min<double>(costs.cores_used, calibration.machine_cores);
    }
  }
  return 0;
}

}  // namespace hyrec::planner
