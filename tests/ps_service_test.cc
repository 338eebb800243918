// Integration tests: real `hyrec-ps` processes on loopback, driven through the gRPC client and
// through raw stubs for malformed requests.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "deadline.h"
#include "embedding.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "http_get.h"
#include "hyrec/common/checkpoint_dir.h"
#include "hyrec/common/env.h"
#include "hyrec/common/hash.h"
#include "hyrec/common/process_info.h"
#include "hyrec/common/subprocess.h"
#include "hyrec/embedding_ps/client.h"
#include "hyrec/embedding_ps/ps_cluster.h"
#include "run_command.h"

namespace hyrec::embedding_ps {
namespace {

constexpr char kTables[] = "emb:8:adagrad:0.1,wide:3:sgd:0.5";

std::unique_ptr<PsCluster> Launch(int shards, std::vector<std::string> extra = {}) {
  PsClusterOptions options;
  options.binary = HYREC_PS_BINARY;
  options.num_shards = shards;
  options.args = {std::string("--tables=") + kTables, "--capacity_rows=100000", "--threads=4", "--log_level=error"};
  options.args.insert(options.args.end(), extra.begin(), extra.end());
  auto cluster = PsCluster::Launch(options);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  return cluster.ok() ? std::move(*cluster) : nullptr;
}

std::unique_ptr<EmbeddingClient> Connect(const PsCluster& cluster, ClientOptions options = {}) {
  auto client = ConnectEmbeddingClient(cluster.addresses(), options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? std::move(*client) : nullptr;
}

std::unique_ptr<EmbeddingClient> InProcess(int shards, Precision wire = Precision::kFp32) {
  StoreOptions options;
  options.tables = *ParseTableSpecs(kTables);
  options.capacity_rows = 100000;
  std::vector<std::shared_ptr<EmbeddingShardStore>> stores;
  for (int s = 0; s < shards; ++s) stores.push_back(*EmbeddingShardStore::Create(options));
  return *NewInProcessEmbeddingClient(stores, {}, wire);
}

// Runs the same lookups and updates (with duplicate ids) on both clients; rows must agree.
void ExpectSameBehaviour(EmbeddingClient& a, EmbeddingClient& b, float tolerance) {
  std::mt19937_64 rng(5);
  for (int step = 1; step <= 20; ++step) {
    for (const auto& [table, dim] : {std::pair<std::string, int>{"emb", 8}, {"wide", 3}}) {
      std::vector<uint64_t> ids(300);
      for (auto& id : ids) id = rng() % 2000;  // Duplicates within a request are common.
      std::vector<float> ra(ids.size() * dim), rb(ids.size() * dim);
      ASSERT_TRUE(a.Lookup(table, ids, absl::MakeSpan(ra)).ok());
      ASSERT_TRUE(b.Lookup(table, ids, absl::MakeSpan(rb)).ok());
      for (size_t k = 0; k < ra.size(); ++k) ASSERT_NEAR(ra[k], rb[k], tolerance) << table << " " << k;
      std::vector<float> grads(ids.size() * dim);
      // Never near zero: Adagrad's first step is ~lr * sign(g), which fp16 must not flip.
      for (size_t k = 0; k < grads.size(); ++k) {
        grads[k] = 0.013f * static_cast<float>((k * 7 + step) % 11) - 0.0651f;
      }
      ASSERT_TRUE(a.Update(table, ids, grads, UpdateId{1, static_cast<uint64_t>(step)}).ok());
      ASSERT_TRUE(b.Update(table, ids, grads, UpdateId{1, static_cast<uint64_t>(step)}).ok());
    }
  }
}

// Unique ids grouped by shard, as the data loader delivers them, and the shard offsets.
std::pair<std::vector<uint64_t>, std::vector<uint32_t>> GroupByShard(std::vector<uint64_t> ids, int shards) {
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  std::stable_sort(ids.begin(), ids.end(),
                   [&](uint64_t a, uint64_t b) { return ShardForId(a, shards) < ShardForId(b, shards); });
  std::vector<uint32_t> offsets(shards + 1, 0);
  for (uint64_t id : ids) ++offsets[ShardForId(id, shards) + 1];
  for (int s = 0; s < shards; ++s) offsets[s + 1] += offsets[s];
  return {ids, offsets};
}

// Multi-table calls, as a dense worker makes them: both tables of a step in one call, with one
// update id (sequences are per table, so both apply); a repeat of the call applies nothing.
void ExpectSameMultiTableBehaviour(EmbeddingClient& a, EmbeddingClient& b, float tolerance) {
  std::mt19937_64 rng(9);
  const std::vector<std::pair<std::string, int>> tables = {{"emb", 8}, {"wide", 3}};
  for (int step = 1; step <= 5; ++step) {
    std::vector<std::pair<std::vector<uint64_t>, std::vector<uint32_t>>> ids;
    std::vector<std::vector<float>> ra, rb, grads;
    for (const auto& [table, dim] : tables) {
      std::vector<uint64_t> raw(200);
      for (auto& id : raw) id = rng() % 3000;
      ids.push_back(GroupByShard(raw, a.num_shards()));
      ra.emplace_back(ids.back().first.size() * dim);
      rb.emplace_back(ids.back().first.size() * dim);
      grads.emplace_back(ids.back().first.size() * dim);
      for (size_t k = 0; k < grads.back().size(); ++k) grads.back()[k] = 0.011f * ((k + step) % 7) + 0.02f;
    }
    std::vector<EmbeddingClient::ShardedLookup> la, lb;
    std::vector<EmbeddingClient::ShardedUpdate> updates;
    for (size_t t = 0; t < tables.size(); ++t) {
      la.push_back({tables[t].first, ids[t].first, ids[t].second, absl::MakeSpan(ra[t])});
      lb.push_back({tables[t].first, ids[t].first, ids[t].second, absl::MakeSpan(rb[t])});
      updates.push_back({tables[t].first, ids[t].first, ids[t].second, grads[t]});
    }
    ASSERT_TRUE(a.LookupShardedTables(la).ok());
    ASSERT_TRUE(b.LookupShardedTables(lb).ok());
    for (size_t t = 0; t < tables.size(); ++t) {
      for (size_t k = 0; k < ra[t].size(); ++k) ASSERT_NEAR(ra[t][k], rb[t][k], tolerance) << tables[t].first;
      std::vector<float> one(ra[t].size());  // The single-table call reads the same rows.
      ASSERT_TRUE(a.LookupSharded(tables[t].first, ids[t].first, ids[t].second, absl::MakeSpan(one)).ok());
      EXPECT_EQ(one, ra[t]);
    }
    const UpdateId id{7, static_cast<uint64_t>(1000 + step)};
    for (int repeat = 0; repeat < 2; ++repeat) {  // The repeat is acknowledged, not applied.
      ASSERT_TRUE(a.UpdateShardedTables(updates, id).ok());
      ASSERT_TRUE(b.UpdateShardedTables(updates, id).ok());
    }
    for (size_t t = 0; t < tables.size(); ++t) {  // Every table moved: the same sequence applied to each.
      std::vector<float> now(ra[t].size());
      ASSERT_TRUE(a.LookupSharded(tables[t].first, ids[t].first, ids[t].second, absl::MakeSpan(now)).ok());
      for (size_t k = 0; k < now.size(); ++k) ASSERT_LT(now[k], ra[t][k]) << tables[t].first << " " << k;
    }
  }
  for (EmbeddingClient* c : {&a, &b}) {
    auto stats = c->Stats();
    ASSERT_TRUE(stats.ok());
    uint64_t duplicates = 0;
    for (const ShardStats& s : *stats) {
      for (const TableStats& t : s.store.tables) duplicates += t.duplicate_updates;
    }
    EXPECT_GE(duplicates, 10u);  // Each step's repeat, per table and shard touched.
  }
}

TEST(PsService, GrpcClientMatchesInProcessClient) {
  auto cluster = Launch(2);
  ASSERT_NE(cluster, nullptr);
  auto remote = Connect(*cluster);
  ASSERT_NE(remote, nullptr);
  auto local = InProcess(2);
  ExpectSameBehaviour(*remote, *local, 0.0f);
  ExpectSameMultiTableBehaviour(*remote, *local, 0.0f);
  auto stats = remote->Stats();
  ASSERT_TRUE(stats.ok());
  ASSERT_EQ(stats->size(), 2u);
  uint64_t rows = 0;
  for (const ShardStats& s : *stats) {
    rows += s.store.rows;
    EXPECT_GT(s.store.rows, 0u) << "shard " << s.shard_index << " got no ids";
  }
  auto local_stats = local->Stats();
  uint64_t local_rows = 0;
  for (const ShardStats& s : *local_stats) local_rows += s.store.rows;
  EXPECT_EQ(rows, local_rows);
  EXPECT_TRUE(cluster->Stop().ok());
}

TEST(PsService, UpdatesSplitAtHalfTheMessageLimitStillMatch) {
  auto cluster = Launch(2);
  ASSERT_NE(cluster, nullptr);
  ClientOptions options;
  // Half of it (4 KiB) holds one table's part for a shard (~100 ids: 4 KB of "emb" ids and rows)
  // but not both tables': each shard's updates go in two UpdateTables calls.
  options.max_message_bytes = 8 << 10;
  auto remote = Connect(*cluster, options);
  ASSERT_NE(remote, nullptr);
  auto local = InProcess(2);
  ExpectSameMultiTableBehaviour(*remote, *local, 0.0f);
  EXPECT_TRUE(cluster->Stop().ok());
}

TEST(PsService, Fp16TransportStaysWithinHalfPrecision) {
  auto cluster = Launch(2);
  ASSERT_NE(cluster, nullptr);
  ClientOptions options;
  options.precision = Precision::kFp16;
  auto remote = Connect(*cluster, options);
  ASSERT_NE(remote, nullptr);
  auto local = InProcess(2);
  // Half precision keeps ~3 decimal digits of rows and gradients; rows move by ~0.1 per step.
  ExpectSameBehaviour(*remote, *local, 2e-3f);
}

// The embedded job's in-process shards with ps.wire_precision fp16 round rows and gradients as
// the wire does: the same rows, bit for bit, as a remote client's over fp16.
TEST(PsService, Fp16TransportMatchesTheInProcessClientsRounding) {
  auto cluster = Launch(2);
  ASSERT_NE(cluster, nullptr);
  ClientOptions options;
  options.precision = Precision::kFp16;
  auto remote = Connect(*cluster, options);
  ASSERT_NE(remote, nullptr);
  auto local = InProcess(2, Precision::kFp16);
  ExpectSameBehaviour(*remote, *local, 0.0f);
  ExpectSameMultiTableBehaviour(*remote, *local, 0.0f);
  EXPECT_TRUE(cluster->Stop().ok());
}

TEST(PsService, ConnectChecksShardOrderAndTables) {
  auto cluster = Launch(2);
  ASSERT_NE(cluster, nullptr);
  std::vector<std::string> swapped = {cluster->addresses()[1], cluster->addresses()[0]};
  auto client = ConnectEmbeddingClient(swapped, ClientOptions());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kFailedPrecondition) << client.status();
  auto one = ConnectEmbeddingClient({cluster->addresses()[0]}, ClientOptions());
  EXPECT_EQ(one.status().code(), absl::StatusCode::kFailedPrecondition) << one.status();
}

class PsServiceBadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = Launch(1, {"--max_ids_per_request=1000"});
    ASSERT_NE(cluster_, nullptr);
    stub_ = proto::EmbeddingService::NewStub(
        grpc::CreateChannel(cluster_->addresses()[0], grpc::InsecureChannelCredentials()));
  }

  grpc::Status Lookup(const proto::LookupRequest& request, proto::LookupResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return stub_->Lookup(&context, request, response);
  }
  grpc::Status Update(const proto::UpdateRequest& request, proto::UpdateResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return stub_->Update(&context, request, response);
  }
  static std::string Ids(std::vector<uint64_t> ids) {
    return std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * 8);
  }
  static std::string Floats(std::vector<float> v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  }
  std::vector<float> Row(uint64_t id) {
    proto::LookupRequest request;
    request.set_table("wide");
    request.set_ids(Ids({id}));
    proto::LookupResponse response;
    EXPECT_TRUE(Lookup(request, &response).ok());
    std::vector<float> row(3);
    EXPECT_EQ(response.values().size(), 12u);
    std::memcpy(row.data(), response.values().data(), 12);
    return row;
  }
  proto::StatsResponse Stats() {
    grpc::ClientContext context;
    proto::StatsResponse response;
    EXPECT_TRUE(stub_->Stats(&context, proto::StatsRequest(), &response).ok());
    return response;
  }

  std::unique_ptr<PsCluster> cluster_;
  std::unique_ptr<proto::EmbeddingService::Stub> stub_;
};

TEST_F(PsServiceBadInput, EachBadRequestIsRefusedAndChangesNothing) {
  const std::vector<float> before = Row(11);
  struct Case {
    std::string name;
    grpc::StatusCode code;
    std::string message_part;
    proto::UpdateRequest request;
  };
  std::vector<Case> cases;
  auto good = [] {
    proto::UpdateRequest r;
    r.set_table("wide");
    r.set_ids(Ids({11, 12}));
    r.set_grads(Floats({1, 1, 1, 1, 1, 1}));
    r.set_worker_id(1);
    return r;
  };
  {
    Case c{"unknown table", grpc::StatusCode::NOT_FOUND, "unknown table 'nope'", good()};
    c.request.set_table("nope");
    cases.push_back(c);
  }
  {
    Case c{"ids not a multiple of 8", grpc::StatusCode::INVALID_ARGUMENT, "not a multiple of 8", good()};
    c.request.set_ids(Ids({11, 12}) + "abc");
    cases.push_back(c);
  }
  {
    Case c{"gradient of the wrong length", grpc::StatusCode::INVALID_ARGUMENT, "grads field holds 20 bytes", good()};
    c.request.set_grads(Floats({1, 1, 1, 1, 1}));
    cases.push_back(c);
  }
  {
    Case c{"NaN gradient", grpc::StatusCode::INVALID_ARGUMENT, "is nan", good()};
    c.request.set_grads(Floats({1, 1, 1, 1, std::numeric_limits<float>::quiet_NaN(), 1}));
    cases.push_back(c);
  }
  {
    Case c{"Inf gradient", grpc::StatusCode::INVALID_ARGUMENT, "is inf", good()};
    c.request.set_grads(Floats({std::numeric_limits<float>::infinity(), 1, 1, 1, 1, 1}));
    cases.push_back(c);
  }
  {
    Case c{"unknown precision", grpc::StatusCode::INVALID_ARGUMENT, "unknown precision 7", good()};
    c.request.set_precision(static_cast<proto::Precision>(7));
    cases.push_back(c);
  }
  {
    Case c{"too many ids", grpc::StatusCode::RESOURCE_EXHAUSTED, "at most 1000", good()};
    c.request.set_ids(Ids(std::vector<uint64_t>(1001, 5)));
    c.request.set_grads(Floats(std::vector<float>(3003, 0.0f)));
    cases.push_back(c);
  }
  for (size_t k = 0; k < cases.size(); ++k) {
    SCOPED_TRACE(cases[k].name);
    cases[k].request.set_sequence(100 + k);
    proto::UpdateResponse response;
    grpc::Status status = Update(cases[k].request, &response);
    EXPECT_EQ(status.error_code(), cases[k].code) << status.error_message();
    EXPECT_NE(status.error_message().find(cases[k].message_part), std::string::npos) << status.error_message();
    EXPECT_EQ(Row(11), before);  // Nothing written; the server still answers.
  }
  proto::LookupRequest lookup;
  lookup.set_table("wide");
  lookup.set_ids("1234567");
  proto::LookupResponse lookup_response;
  EXPECT_EQ(Lookup(lookup, &lookup_response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  lookup.set_ids(Ids(std::vector<uint64_t>(1001, 1)));
  EXPECT_EQ(Lookup(lookup, &lookup_response).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);

  // A good request with a sequence number used by a refused one still applies.
  proto::UpdateRequest ok = good();
  ok.set_sequence(100);
  proto::UpdateResponse response;
  ASSERT_TRUE(Update(ok, &response).ok());
  EXPECT_FALSE(response.duplicate());
  EXPECT_EQ(response.applied(), 2u);
  EXPECT_NE(Row(11), before);
  // Repeating it is acknowledged as a duplicate and not applied again.
  const std::vector<float> after = Row(11);
  ASSERT_TRUE(Update(ok, &response).ok());
  EXPECT_TRUE(response.duplicate());
  EXPECT_EQ(Row(11), after);

  proto::StatsResponse stats = Stats();
  EXPECT_EQ(stats.rejected_requests(), cases.size() + 2);
  for (const proto::TableStats& t : stats.tables()) {
    if (t.name() == "wide") {
      EXPECT_EQ(t.rejected_nonfinite(), 2u);
      EXPECT_EQ(t.duplicate_updates(), 1u);
    }
  }
}

TEST_F(PsServiceBadInput, UpdateTablesValidatesEveryUpdateBeforeApplyingAny) {
  const std::vector<float> before = Row(11);
  proto::UpdateTablesRequest request;
  for (int k = 0; k < 2; ++k) {
    proto::UpdateRequest* u = request.add_updates();
    u->set_table("wide");
    u->set_ids(Ids({11}));
    u->set_grads(Floats({1, 1, 1}));
    u->set_worker_id(1);
    u->set_sequence(7 + k);
  }
  request.mutable_updates(1)->set_table("nope");
  proto::UpdateTablesResponse response;
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    const grpc::Status status = stub_->UpdateTables(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << status.error_message();
    EXPECT_NE(status.error_message().find("update 1 (table 'nope')"), std::string::npos) << status.error_message();
    EXPECT_NE(status.error_message().find("nothing was applied"), std::string::npos) << status.error_message();
  }
  EXPECT_EQ(Row(11), before);  // The valid first update was not applied either.
  {
    grpc::ClientContext context;
    const grpc::Status status = stub_->UpdateTables(&context, proto::UpdateTablesRequest(), &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  }
  // Both valid: each applied once and answered in order; the first again is a duplicate.
  request.mutable_updates(1)->set_table("wide");
  request.mutable_updates(1)->set_ids(Ids({12}));
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->UpdateTables(&context, request, &response).ok());
  }
  ASSERT_EQ(response.updates_size(), 2);
  EXPECT_EQ(response.updates(0).applied(), 1u);
  EXPECT_EQ(response.updates(1).applied(), 1u);
  EXPECT_NE(response.incarnation(), 0u);
  EXPECT_NE(Row(11), before);
  const std::vector<float> after = Row(11);
  request.mutable_updates()->DeleteSubrange(1, 1);
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->UpdateTables(&context, request, &response).ok());
  }
  ASSERT_EQ(response.updates_size(), 1);
  EXPECT_TRUE(response.updates(0).duplicate());
  EXPECT_EQ(Row(11), after);
}

TEST_F(PsServiceBadInput, LookupTablesAnswersEachOrRefusesTheCall) {
  proto::LookupTablesRequest request;
  for (const char* table : {"wide", "emb"}) {
    proto::LookupRequest* l = request.add_lookups();
    l->set_table(table);
    l->set_ids(Ids({11, 12}));
  }
  const auto call = [&](const proto::LookupTablesRequest& r, proto::LookupTablesResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return stub_->LookupTables(&context, r, response);
  };
  request.mutable_lookups(1)->set_data_time(1'700'000'000);  // Raises emb's data time only.
  proto::LookupTablesResponse response;
  ASSERT_TRUE(call(request, &response).ok());
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    proto::StatsResponse stats;
    ASSERT_TRUE(stub_->Stats(&context, proto::StatsRequest(), &stats).ok());
    for (const proto::TableStats& t : stats.tables()) {
      EXPECT_EQ(t.data_time(), t.name() == "emb" ? 1'700'000'000u : 0u) << t.name();
      EXPECT_EQ(t.eviction_policy(), "lru");
    }
  }
  // A data time more than a day ahead of the shard's clock refuses the call and moves no table's.
  const uint64_t now = static_cast<uint64_t>(absl::ToUnixSeconds(absl::Now()));
  request.mutable_lookups(1)->set_data_time(now + 3 * 86400);
  proto::LookupTablesResponse refused;
  const grpc::Status ahead = call(request, &refused);
  EXPECT_EQ(ahead.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << ahead.error_message();
  EXPECT_NE(ahead.error_message().find("lookup 1: data_time"), std::string::npos) << ahead.error_message();
  {
    grpc::ClientContext context;
    proto::StatsResponse stats;
    ASSERT_TRUE(stub_->Stats(&context, proto::StatsRequest(), &stats).ok());
    for (const proto::TableStats& t : stats.tables()) {
      EXPECT_EQ(t.data_time(), t.name() == "emb" ? 1'700'000'000u : 0u) << t.name();
    }
  }
  request.mutable_lookups(1)->set_data_time(0);
  ASSERT_EQ(response.lookups_size(), 2);
  EXPECT_EQ(response.lookups(0).dim(), 3u);
  EXPECT_EQ(response.lookups(1).dim(), 8u);
  EXPECT_EQ(response.lookups(0).values().size(), 2u * 3 * 4);
  std::vector<float> first(3);
  std::memcpy(first.data(), response.lookups(0).values().data(), 12);
  EXPECT_EQ(first, Row(11));
  EXPECT_NE(response.incarnation(), 0u);

  request.mutable_lookups(1)->set_table("nope");
  grpc::Status status = call(request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << status.error_message();
  EXPECT_NE(status.error_message().find("lookup 1"), std::string::npos) << status.error_message();
  request.mutable_lookups(1)->set_table("emb");
  request.mutable_lookups(1)->set_ids("1234567");
  status = call(request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  status = call(proto::LookupTablesRequest(), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
}

// The peak resident memory of process `pid` (VmHWM), in bytes; 0 when it cannot be read.
uint64_t PeakResidentBytes(int pid) { return ProcessStatusBytes(pid, "VmHWM").value_or(0); }

// A 250 MB LookupTables or UpdateTables call of tiny parts (an empty part is 2 bytes on the wire,
// 125 million of them) is refused by counting its parts before any is decoded: the shard's peak
// memory grows by about the message, not by an object per part, and it serves on.
TEST_F(PsServiceBadInput, AManyPartCallIsRefusedBeforeItsPartsAreDecoded) {
  grpc::GenericStub generic(grpc::CreateChannel(cluster_->addresses()[0], grpc::InsecureChannelCredentials()));
  constexpr size_t kBytes = 250u << 20;
  std::string tiny_parts;
  tiny_parts.reserve(kBytes);
  while (tiny_parts.size() < kBytes) tiny_parts.append("\x0a\x00", 2);  // Field 1, an empty message.
  const uint64_t before = PeakResidentBytes(cluster_->shard(0).pid());
  ASSERT_GT(before, 0u);
  for (const char* method :
       {"/hyrec.proto.EmbeddingService/LookupTables", "/hyrec.proto.EmbeddingService/UpdateTables"}) {
    SCOPED_TRACE(method);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    grpc::Slice slice(tiny_parts);
    grpc::ByteBuffer request(&slice, 1), response;
    std::mutex mu;
    std::condition_variable done;
    bool finished = false;
    grpc::Status status;
    generic.UnaryCall(&context, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
      std::lock_guard<std::mutex> lock(mu);
      status = std::move(s);
      finished = true;
      done.notify_all();
    });
    std::unique_lock<std::mutex> lock(mu);
    done.wait(lock, [&] { return finished; });
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
    EXPECT_NE(status.error_message().find("parts (at most 4 per table of the shard, and 16)"), std::string::npos)
        << status.error_message();
  }
  const uint64_t after = PeakResidentBytes(cluster_->shard(0).pid());
  RecordProperty("peak_growth_mb", static_cast<int>((after - before) >> 20));
  EXPECT_LT(after - before, uint64_t{1} << 30) << "peak " << before << " -> " << after << " bytes";
  EXPECT_EQ(Row(11).size(), 3u);   // It serves on.
  proto::LookupTablesRequest two;  // A call of a part per table is answered as before.
  for (const char* table : {"wide", "emb"}) {
    proto::LookupRequest* l = two.add_lookups();
    l->set_table(table);
    l->set_ids(Ids({11}));
  }
  grpc::ClientContext context;
  proto::LookupTablesResponse answer;
  EXPECT_TRUE(stub_->LookupTables(&context, two, &answer).ok());
  EXPECT_EQ(answer.lookups_size(), 2);
}

TEST(PsService, KilledShardGivesAnErrorWithinTheDeadline) {
  auto cluster = Launch(2);
  ASSERT_NE(cluster, nullptr);
  ClientOptions options;
  options.call_timeout = absl::Seconds(2);
  options.attempt_timeout = absl::Milliseconds(500);
  auto client = Connect(*cluster, options);
  ASSERT_NE(client, nullptr);
  std::vector<uint64_t> ids(20000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = i;
  std::vector<float> out(ids.size() * 8);
  ASSERT_TRUE(client->Lookup("emb", ids, absl::MakeSpan(out)).ok());
  // Kill shard 1 while requests are in flight.
  std::atomic<bool> stop{false};
  absl::Status last;
  absl::Duration slowest;
  std::thread caller([&] {
    std::vector<float> rows(ids.size() * 8);
    while (!stop) {
      const absl::Time t0 = absl::Now();
      absl::Status s = client->Lookup("emb", ids, absl::MakeSpan(rows));
      slowest = std::max(slowest, absl::Now() - t0);
      if (!s.ok()) {
        last = s;
        return;
      }
    }
  });
  absl::SleepFor(absl::Milliseconds(100));
  cluster->shard(1).Signal(SIGKILL);
  caller.join();
  stop = true;
  EXPECT_FALSE(last.ok());
  EXPECT_TRUE(last.code() == absl::StatusCode::kUnavailable || last.code() == absl::StatusCode::kDeadlineExceeded)
      << last;
  EXPECT_NE(last.message().find("PS shard 1"), std::string::npos) << last;
  EXPECT_LT(slowest, hyrec::testing::Bounded(options.call_timeout));
  // Ids on the surviving shard are still served.
  std::vector<uint64_t> on_zero;
  for (uint64_t id = 0; on_zero.size() < 10; ++id)
    if (ShardForId(id, 2) == 0) on_zero.push_back(id);
  std::vector<float> rows(on_zero.size() * 8);
  EXPECT_TRUE(client->Lookup("emb", on_zero, absl::MakeSpan(rows)).ok());
}

// kill(SIGSTOP) returns before the target stops; /proc shows state 'T' once it has.
bool WaitUntilStopped(pid_t pid) {
  for (int i = 0; i < 500; ++i) {
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    std::getline(stat, line);
    const size_t paren = line.rfind(')');
    if (paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'T') return true;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return false;
}

TEST(PsService, FrozenShardGivesDeadlineExceededWithinTheDeadline) {
  auto cluster = Launch(2);
  ASSERT_NE(cluster, nullptr);
  ClientOptions options;
  options.call_timeout = absl::Seconds(1);
  options.attempt_timeout = absl::Milliseconds(300);
  auto client = Connect(*cluster, options);
  ASSERT_NE(client, nullptr);
  cluster->shard(0).Signal(SIGSTOP);
  ASSERT_TRUE(WaitUntilStopped(cluster->shard(0).pid()));
  std::vector<uint64_t> ids(100);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = i;
  std::vector<float> grads(ids.size() * 3, 0.1f);
  const absl::Time t0 = absl::Now();
  absl::Status s = client->Update("wide", ids, grads, UpdateId{1, 1});
  const absl::Duration took = absl::Now() - t0;
  cluster->shard(0).Signal(SIGCONT);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_LT(took, hyrec::testing::Bounded(options.call_timeout));
  // Once thawed, the PS may still run the queued attempts; whatever it ran, resending the same
  // update id must leave the rows changed exactly once (SGD, lr 0.5: init - 0.05).
  ASSERT_TRUE(client->Update("wide", ids, grads, UpdateId{1, 1}).ok());
  absl::SleepFor(absl::Milliseconds(300));
  std::vector<float> rows(ids.size() * 3);
  ASSERT_TRUE(client->Lookup("wide", ids, absl::MakeSpan(rows)).ok());
  TableConfig wide = (*ParseTableSpecs(kTables))[1];
  std::vector<float> init(3);
  for (size_t i = 0; i < ids.size(); ++i) {
    InitialRow(wide, ids[i], init.data());
    for (int j = 0; j < 3; ++j) ASSERT_FLOAT_EQ(rows[i * 3 + j], init[j] - 0.5f * 0.1f) << "id " << ids[i];
  }
}

TEST(PsService, ClientRefusesNonFiniteGradientsBeforeSending) {
  auto cluster = Launch(2);
  ASSERT_NE(cluster, nullptr);
  auto client = Connect(*cluster);
  std::vector<uint64_t> ids = {1, 2, 3, 4};
  std::vector<float> before(12), after(12);
  ASSERT_TRUE(client->Lookup("wide", ids, absl::MakeSpan(before)).ok());
  std::vector<float> grads(12, 1.0f);
  grads[11] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(client->Update("wide", ids, grads, UpdateId{1, 1}).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(client->Lookup("wide", ids, absl::MakeSpan(after)).ok());
  EXPECT_EQ(before, after);  // No shard applied its part.
  // In a multi-table update, a NaN in one table stops every table's.
  std::vector<float> emb_before(4 * 8), emb_after(4 * 8);
  ASSERT_TRUE(client->Lookup("emb", ids, absl::MakeSpan(emb_before)).ok());
  auto [sharded, offsets] = GroupByShard(ids, 2);
  std::vector<float> emb_grads(4 * 8, 1.0f), wide_grads(12, 1.0f);
  wide_grads[5] = std::numeric_limits<float>::infinity();
  const std::vector<EmbeddingClient::ShardedUpdate> updates = {{"emb", sharded, offsets, emb_grads},
                                                               {"wide", sharded, offsets, wide_grads}};
  absl::Status s = client->UpdateShardedTables(updates, UpdateId{1, 2});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("table 'wide'"), std::string::npos) << s;
  ASSERT_TRUE(client->Lookup("emb", ids, absl::MakeSpan(emb_after)).ok());
  EXPECT_EQ(emb_before, emb_after);
}

TEST(PsBinary, ServesPrometheusMetricsPerTable) {
  auto ps = Subprocess::Spawn({HYREC_PS_BINARY, "--tables=emb:8:sgd:0.1,other:4", "--security=none", "--port=0",
                               "--metrics_port=0", "--shard_index=0", "--log_level=error"});
  ASSERT_TRUE(ps.ok()) << ps.status();
  int port = 0, metrics_port = 0;
  while (port == 0) {
    auto line = (*ps)->ReadLine(absl::Seconds(30));
    ASSERT_TRUE(line.ok()) << line.status();
    if (absl::StrContains(*line, "metrics on")) metrics_port = std::stoi(line->substr(line->rfind(':') + 1));
    if (absl::StrContains(*line, "listening on")) port = std::stoi(line->substr(line->rfind(':') + 1));
  }
  ASSERT_GT(metrics_port, 0);
  auto client = ConnectEmbeddingClient({absl::StrCat("127.0.0.1:", port)}, ClientOptions());
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<float> rows(3 * 8);
  ASSERT_TRUE((*client)->Lookup("emb", {1, 2, 3}, absl::MakeSpan(rows)).ok());
  // Read at the scrape: the lookup just made is already counted.
  HttpResponse r = HttpGet(metrics_port, "/metrics");
  ASSERT_EQ(r.status, 200);
  const std::string& body = r.body;
  EXPECT_TRUE(absl::StrContains(body, "# TYPE hyrec_ps_rows gauge")) << body;
  EXPECT_TRUE(absl::StrContains(body, "hyrec_ps_rows{shard=\"0\",table=\"emb\"} 3\n")) << body;
  EXPECT_TRUE(absl::StrContains(body, "hyrec_ps_lookups_total{shard=\"0\",table=\"emb\"} 3\n")) << body;
  EXPECT_TRUE(absl::StrContains(body, "hyrec_ps_rows{shard=\"0\",table=\"other\"} 0\n")) << body;
  EXPECT_TRUE(absl::StrContains(body, "hyrec_ps_evictions_total{shard=\"0\",table=\"emb\",policy=\"lru\"} 0\n"))
      << body;
  (*ps)->Signal(SIGTERM);
  auto code = (*ps)->Wait(absl::Seconds(10));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
}

TEST(PsService, StopsCleanlyOnSigterm) {
  auto cluster = Launch(1);
  ASSERT_NE(cluster, nullptr);
  cluster->shard(0).Signal(SIGTERM);
  auto code = cluster->shard(0).Wait(absl::Seconds(10));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
}

// The launcher and the PS binary report bad flags and configs clearly and exit non-zero.
std::string RunAndCapture(const std::vector<std::string>& argv, int* exit_code) {
  const hyrec::testing::CommandResult r = hyrec::testing::RunCommand(argv);
  *exit_code = r.code;
  return r.all();
}

TEST(PsBinary, ReportsBadFlagsAndConfigs) {
  int code = 0;
  std::string out = RunAndCapture({HYREC_LAUNCHER_BINARY, "nosuchrole"}, &code);
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("unknown role 'nosuchrole'"), std::string::npos) << out;

  out = RunAndCapture({HYREC_LAUNCHER_BINARY, "ps", "--tables=emb:abc"}, &code);
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("dim 'abc' is not an integer"), std::string::npos) << out;

  out = RunAndCapture({HYREC_PS_BINARY, "--tables=emb:8:rmsprop"}, &code);
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("unknown optimizer 'rmsprop'"), std::string::npos) << out;

  const std::string path = ::testing::TempDir() + "/ps_bad.yaml";
  const std::string loader = "loader: {source: {format: synthetic, synthetic: {num_slots: 1}}}\n";
  std::ofstream(path) << loader << "tables:\n  - name: emb\n    features: [f0]\n    optimiser:\n      kind: sgd\n";
  out = RunAndCapture({HYREC_PS_BINARY, "--config=" + path}, &code);
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("tables[0].optimiser (line 5): unknown key; did you mean 'optimizer'?"), std::string::npos) << out;

  std::ofstream(path) << loader
                      << "tables:\n  - name: emb\n    features: [f0]\n    optimizer: {kind: adam, beta1: 1.5}\n";
  out = RunAndCapture({HYREC_PS_BINARY, "--config=" + path}, &code);
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("beta1"), std::string::npos) << out;
  EXPECT_NE(out.find("line 3"), std::string::npos) << out;

  // Settings the job file holds are not flags beside it.
  std::ofstream(path) << loader;
  out = RunAndCapture({HYREC_PS_BINARY, "--config=" + path, "--capacity_rows=5"}, &code);
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("--capacity_rows with --config: the job file sets it"), std::string::npos) << out;
  out = RunAndCapture({HYREC_PS_BINARY, "--config=" + path, "--shard_index=2"}, &code);
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("--shard_index 2: the job has 2 PS shards"), std::string::npos) << out;
  out = RunAndCapture({HYREC_PS_BINARY, "--port=70000"}, &code);
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find("--port=70000: not in [-1, 65535]"), std::string::npos) << out;
}

TEST(PsBinary, ServesTheTablesOfItsShardOfTheJob) {
  const std::string path = ::testing::TempDir() + "/ps_good.yaml";
  std::ofstream(path) << "loader: {source: {format: synthetic, synthetic: {num_slots: 2}}}\n"
                         "security: {mode: none}\n"
                         "ps: {shards: 2, capacity_rows: 5000, num_stripes: 4}\n"
                         "tables:\n"
                         "  - name: emb\n    features: [f0]\n    dim: 8\n    seed: 3\n"
                         "    initializer: {kind: normal, stddev: 0.1}\n"
                         "    optimizer: {kind: ftrl, learning_rate: 0.05, ftrl_l1: 0.001}\n"
                         "    admission: {min_count: 2}\n"
                         "  - {name: other, features: [f1], dim: 4, capacity_rows: 10}\n";
  PsClusterOptions options;
  options.binary = HYREC_PS_BINARY;
  options.job_config = path;
  options.num_shards = 2;
  options.args = {"--log_level=error"};
  auto cluster = PsCluster::Launch(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto client = ConnectEmbeddingClient((*cluster)->addresses(), ClientOptions());
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<float> row(8);
  ASSERT_TRUE((*client)->Lookup("emb", {77}, absl::MakeSpan(row)).ok());
  EXPECT_EQ(row, std::vector<float>(8, 0.0f));  // Not admitted yet.
  ASSERT_TRUE((*client)->Lookup("emb", {77}, absl::MakeSpan(row)).ok());
  TableConfig t;
  t.name = "emb";
  t.dim = 8;
  t.seed = 3;
  t.initializer.kind = InitializerKind::kNormal;
  t.initializer.stddev = 0.1f;
  std::vector<float> expected(8);
  InitialRow(t, 77, expected.data());
  EXPECT_EQ(row, expected);
  auto stats = (*client)->Stats();
  ASSERT_TRUE(stats.ok());
  ASSERT_EQ(stats->size(), 2u);
  for (const ShardStats& s : *stats) {
    EXPECT_EQ(s.num_shards, 2);
    EXPECT_EQ(s.store.capacity_rows, 5000u);
    EXPECT_EQ(s.store.tables[0].optimizer, "ftrl");
    EXPECT_EQ(s.store.tables[1].capacity_rows, 5u);  // 10 over 2 shards.
  }
  EXPECT_EQ((*stats)[0].store.tables[0].admission_rejections + (*stats)[1].store.tables[0].admission_rejections, 1u);
}

// Cuts over gRPC: a shard writes only under its job's checkpoint.dir, refuses names that are not
// plain directory names, and a hand-started shard resumes from what shards of another count wrote.
TEST(PsBinary, CutsOnlyUnderItsRootAndResumesResharded) {
  const std::string root = ::testing::TempDir() + "/ps_cut_root";
  std::filesystem::remove_all(root);
  auto job = [&](int shards) {
    const std::string path = ::testing::TempDir() + absl::StrCat("/ps_cut_", shards, ".yaml");
    std::ofstream(path) << "loader: {source: {format: synthetic, synthetic: {num_slots: 1}}}\n"
                        << "security: {mode: none}\n"
                        << "ps: {shards: " << shards << "}\n"
                        << "tables: [{name: emb, features: [f0], dim: 4, optimizer: adagrad}]\n"
                        << "checkpoint: {dir: " << root << "}\n";
    return path;
  };
  auto launch = [&](int shards, std::vector<std::string> args) {
    PsClusterOptions options;
    options.binary = HYREC_PS_BINARY;
    options.job_config = job(shards);
    options.num_shards = shards;
    options.args = std::move(args);
    options.args.push_back("--log_level=error");
    return PsCluster::Launch(options);
  };
  auto two = launch(2, {});
  ASSERT_TRUE(two.ok()) << two.status();
  auto client = ConnectEmbeddingClient((*two)->addresses(), ClientOptions());
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<uint64_t> ids;
  for (uint64_t i = 1; i <= 200; ++i) ids.push_back(i * 13);
  std::vector<float> rows(ids.size() * 4);
  ASSERT_TRUE((*client)->Lookup("emb", ids, absl::MakeSpan(rows)).ok());
  ASSERT_TRUE((*client)->Update("emb", ids, std::vector<float>(rows.size(), 0.25f), UpdateId{1, 1}).ok());
  ASSERT_TRUE((*client)->Lookup("emb", ids, absl::MakeSpan(rows)).ok());

  auto stub =
      proto::EmbeddingService::NewStub(grpc::CreateChannel((*two)->addresses()[0], grpc::InsecureChannelCredentials()));
  for (const std::string bad : {"../outside", "", "a/b", ".."}) {
    grpc::ClientContext context;
    proto::BeginCutRequest request;
    request.set_name(bad);
    request.set_id(9);
    proto::BeginCutResponse response;
    const grpc::Status s = stub->BeginCut(&context, request, &response);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad << ": " << s.error_message();
  }
  {
    grpc::ClientContext context;
    proto::AwaitCutRequest request;
    request.set_id(12345);
    proto::AwaitCutResponse response;
    EXPECT_EQ(stub->AwaitCut(&context, request, &response).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  EXPECT_FALSE(std::filesystem::exists(::testing::TempDir() + "/outside"));
  // The job has no export.dir: the shards take no deltas.
  const absl::Status delta = (*client)->BeginCut(CutKind::kDelta, "d", 3, absl::Seconds(5));
  EXPECT_TRUE(absl::IsFailedPrecondition(delta)) << delta;

  // A real cut: both shards write their files, which a manifest then commits.
  const std::string name = CheckpointDirName(kCheckpointPrefix, 1, 1);
  ASSERT_TRUE((*client)->BeginCut(CutKind::kCheckpoint, name, 7, absl::Seconds(10)).ok());
  auto files = (*client)->AwaitCut(7, absl::Seconds(30));
  ASSERT_TRUE(files.ok()) << files.status();
  CheckpointManifest m;
  m.num_shards = 2;
  m.num_workers = 1;
  for (const ShardFileInfo& f : *files) m.files.push_back(f.file);
  ASSERT_TRUE(CommitManifest(Env::Default(), JoinPath(root, name), m).ok());
  ASSERT_TRUE((*two)->Stop().ok());

  // Three hand-started shards resume from the two shards' checkpoint: the same rows.
  auto three = launch(3, {"--resume=latest"});
  ASSERT_TRUE(three.ok()) << three.status();
  auto client3 = ConnectEmbeddingClient((*three)->addresses(), ClientOptions());
  ASSERT_TRUE(client3.ok()) << client3.status();
  std::vector<float> resumed(rows.size());
  ASSERT_TRUE((*client3)->Lookup("emb", ids, absl::MakeSpan(resumed)).ok());
  EXPECT_EQ(resumed, rows);
  auto stats = (*client3)->Stats();
  ASSERT_TRUE(stats.ok());
  uint64_t total = 0;
  for (const ShardStats& s : *stats) total += s.store.rows;
  EXPECT_EQ(total, ids.size());
  client3->reset();
  three->reset();  // Its shards own their update logs under the root until they stop.

  // A corrupt shard file: the shard refuses to start (exit 2) naming the file, never serves it.
  const std::string shard0 = JoinPath(JoinPath(root, name), m.files[0].name);
  std::string bytes = *ReadFileToString(Env::Default(), shard0, 1 << 30);
  bytes[bytes.size() / 2] ^= 1;
  ASSERT_TRUE(WriteFileAtomically(Env::Default(), shard0, bytes).ok());
  int code = 0;
  const std::string out = RunAndCapture(
      {HYREC_PS_BINARY, "--config=" + job(3), "--shard_index=0", "--port=0", "--resume=" + JoinPath(root, name)},
      &code);
  EXPECT_EQ(code, 2);
  EXPECT_NE(out.find(m.files[0].name), std::string::npos) << out;
  const std::string missing = RunAndCapture(
      {HYREC_PS_BINARY, "--config=" + job(3), "--shard_index=0", "--port=0", "--resume=" + root + "/nothing"}, &code);
  EXPECT_EQ(code, 2);
  EXPECT_NE(missing.find("not a committed checkpoint"), std::string::npos) << missing;
}

}  // namespace
}  // namespace hyrec::embedding_ps
