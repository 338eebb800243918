// The services against hostile peers (docs/security.md): real `hyrec-ps` and `hyrec-loader`
// processes on loopback with mTLS, reached by clients holding the wrong CA, no certificate, a
// forged or expired token, or another role's identity; and the listener's own defences.
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "data.grpc.pb.h"
#include "deadline.h"
#include "embedding.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "hyrec/common/certs.h"
#include "hyrec/common/process_info.h"
#include "hyrec/common/subprocess.h"
#include "hyrec/data_loader/data_service.h"
#include "hyrec/embedding_ps/client.h"
#include "hyrec/job/job_plan.h"
#include "run_command.h"
#include "src/common/rpc.h"
#include "src/nn_sync/rendezvous.h"

namespace hyrec {
namespace {

namespace fs = std::filesystem;
using proto::EmbeddingService;

std::string FreshDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/security_test_" + name;
  fs::remove_all(dir);
  return dir;
}

std::string WriteCerts(const std::string& name, int workers = 2) {
  const std::string dir = FreshDir(name);
  CertificateRequest request;
  request.dir = dir;
  request.identities = JobIdentities(workers, /*ps=*/1, /*loaders=*/1);
  const absl::Status written = WriteJobCertificates(request);
  EXPECT_TRUE(written.ok()) << written;
  return dir;
}

std::string Job(const std::string& certs, bool tokens) {
  const std::string path = ::testing::TempDir() + "/security_test_job.yaml";
  std::ofstream(path)
      << "loader:\n  source:\n    format: synthetic\n    synthetic: {num_samples: 2000, vocabulary: 500, seed: 3}\n"
      << "  batch_size: 50\n  threads: 1\n  epochs: 1\n"
      << "ps: {shards: 1}\ntrain: {workers: 2}\n"
      << "security: {mode: mtls, dir: " << certs << ", tokens: " << (tokens ? "true" : "false") << "}\n";
  return path;
}

struct Server {
  std::unique_ptr<Subprocess> process;
  std::string address;
};

Server Start(std::vector<std::string> argv) {
  Server s;
  auto process = Subprocess::Spawn(argv);
  EXPECT_TRUE(process.ok()) << process.status();
  if (!process.ok()) return s;
  s.process = std::move(*process);
  auto port = WaitForListeningPort(*s.process, absl::Seconds(30));
  EXPECT_TRUE(port.ok()) << port.status();
  s.address = absl::StrCat("127.0.0.1:", port.ok() ? *port : 0);
  return s;
}

Server StartPs(const std::string& job) {
  return Start({HYREC_PS_BINARY, "--config=" + job, "--shard_index=0", "--port=0", "--log_level=error"});
}

// A raw stub to shard 0 as `identity` (its certificate under `certs`), optionally with a token.
std::unique_ptr<EmbeddingService::Stub> Stub(const std::string& address, const SecurityOptions& security) {
  auto credentials = rpc::ChannelCredentials(security);
  EXPECT_TRUE(credentials.ok()) << credentials.status();
  grpc::ChannelArguments args;
  rpc::SetServerName(security, Identity{Role::kPs, 0}, &args);
  return EmbeddingService::NewStub(grpc::CreateCustomChannel(address, *credentials, args));
}

SecurityOptions As(const std::string& certs, const Identity& identity) { return SecurityInDirectory(certs, identity); }

grpc::Status Update(EmbeddingService::Stub& stub, uint32_t worker, uint64_t sequence, float grad) {
  proto::UpdateRequest request;
  request.set_table("f0");
  const uint64_t id = 7;
  request.set_ids(std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
  std::string grads(16 * sizeof(float), '\0');
  for (int j = 0; j < 16; ++j) std::memcpy(grads.data() + j * sizeof(float), &grad, sizeof(float));
  request.set_grads(grads);
  request.set_worker_id(worker);
  request.set_sequence(sequence);
  proto::UpdateResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  return stub.Update(&context, request, &response);
}

std::vector<float> Row(EmbeddingService::Stub& stub) {
  proto::LookupRequest request;
  request.set_table("f0");
  const uint64_t id = 7;
  request.set_ids(std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
  proto::LookupResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  const grpc::Status status = stub.Lookup(&context, request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  std::vector<float> row(response.values().size() / sizeof(float));
  std::memcpy(row.data(), response.values().data(), row.size() * sizeof(float));
  return row;
}

TEST(CertsTest, KeysArePrivateAndTheCaIsNeverReplaced) {
  const std::string dir = WriteCerts("files");
  for (const char* name : {"ca.key", "worker-0.key", "ps-0.key", "admin.key", "token.secret"}) {
    struct stat st {};
    ASSERT_EQ(::stat((dir + "/" + name).c_str(), &st), 0) << name;
    EXPECT_EQ(st.st_mode & 0777, 0600u) << name;
  }
  CertificateRequest again;
  again.dir = dir;
  again.identities = {Identity{Role::kWorker, 5}};
  EXPECT_TRUE(absl::IsAlreadyExists(WriteJobCertificates(again)));
  again.reuse_ca = true;
  EXPECT_TRUE(WriteJobCertificates(again).ok());
  EXPECT_TRUE(fs::exists(dir + "/worker-5.pem"));
}

TEST(CertsTest, TokensVerifyOnlyWithTheirSecretAndBeforeTheirExpiry) {
  const absl::Time now = absl::Now();
  const std::string token = IssueToken("secret", Identity{Role::kWorker, 3}, now + absl::Hours(1));
  auto identity = VerifyToken("secret", token, now);
  ASSERT_TRUE(identity.ok()) << identity.status();
  EXPECT_EQ(IdentityName(*identity), "worker-3");
  EXPECT_TRUE(absl::IsUnauthenticated(VerifyToken("other", token, now).status()));
  EXPECT_TRUE(absl::IsUnauthenticated(VerifyToken("secret", token, now + absl::Hours(2)).status()));
  std::string forged = token;
  forged.replace(forged.find("worker-3"), 8, "worker-0");
  EXPECT_TRUE(absl::IsUnauthenticated(VerifyToken("secret", forged, now).status()));
  EXPECT_TRUE(absl::IsUnauthenticated(VerifyToken("secret", "garbage", now).status()));
  EXPECT_TRUE(absl::IsUnauthenticated(VerifyToken("", token, now).status()));
}

TEST(SecurityTest, ThePsServesOnlyTheJobsIdentitiesEachInItsRole) {
  const std::string certs = WriteCerts("ps");
  Server ps = StartPs(Job(certs, /*tokens=*/false));
  ASSERT_NE(ps.process, nullptr);
  auto worker0 = Stub(ps.address, As(certs, {Role::kWorker, 0}));
  const std::vector<float> before = Row(*worker0);
  ASSERT_EQ(before.size(), 16u);

  // No TLS at all, and TLS with another job's CA: no call gets through.
  {
    auto plain = EmbeddingService::NewStub(grpc::CreateChannel(ps.address, grpc::InsecureChannelCredentials()));
    EXPECT_FALSE(Update(*plain, 0, 1, 1.0f).ok());
    const std::string stranger = WriteCerts("stranger");
    auto foreign = Stub(ps.address, As(stranger, {Role::kWorker, 0}));
    EXPECT_FALSE(Update(*foreign, 0, 1, 1.0f).ok());
  }
  // The job's loader and admin may not write rows; worker 1 may not write under worker 0's id.
  auto loader = Stub(ps.address, As(certs, {Role::kLoader, 0}));
  EXPECT_EQ(Update(*loader, 0, 1, 1.0f).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  auto admin = Stub(ps.address, As(certs, {Role::kAdmin, 0}));
  EXPECT_EQ(Update(*admin, 0, 1, 1.0f).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  auto worker1 = Stub(ps.address, As(certs, {Role::kWorker, 1}));
  EXPECT_EQ(Update(*worker1, /*worker=*/0, /*sequence=*/1, 0.0f).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Update(*worker1, 0, UINT64_MAX, 0.0f).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Row(*worker0), before);

  // Worker 0's own update (the sequence the stranger tried to spend) is applied, not a duplicate.
  ASSERT_TRUE(Update(*worker0, 0, 1, 1.0f).ok());
  EXPECT_NE(Row(*worker0), before);
  EXPECT_EQ(Row(*admin).size(), 16u);  // Admin reads.
  ps.process->Signal(SIGTERM);
  EXPECT_EQ(*ps.process->Wait(absl::Seconds(10)), 0);
}

// Whether a Health call as `security` gets through (a fresh channel, so a new handshake).
bool Reaches(const std::string& address, const SecurityOptions& security) {
  auto stub = Stub(address, security);
  proto::HealthResponse health;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return stub->Health(&context, proto::HealthRequest(), &health).ok();
}

TEST(SecurityTest, AServerTakesNewCertificatesWithoutARestart) {
  const std::string certs = WriteCerts("rotate");
  const std::string old_copy = FreshDir("rotate_old");
  fs::copy(certs, old_copy);
  Server ps = StartPs(Job(certs, /*tokens=*/false));
  ASSERT_NE(ps.process, nullptr);
  ASSERT_TRUE(Reaches(ps.address, As(old_copy, {Role::kWorker, 0})));
  // A new CA and certificates written over the files the PS reads.
  const std::string next = WriteCerts("rotate_next");
  for (const char* name : {"ca.pem", "ps-0.pem", "ps-0.key"}) {
    fs::copy_file(next + "/" + name, certs + "/" + name, fs::copy_options::overwrite_existing);
  }
  bool rotated = false;
  for (const absl::Time until = absl::Now() + absl::Seconds(20); !rotated && absl::Now() < until;) {
    rotated = Reaches(ps.address, As(next, {Role::kWorker, 0}));
    if (!rotated) absl::SleepFor(absl::Milliseconds(500));
  }
  EXPECT_TRUE(rotated);
  EXPECT_FALSE(Reaches(ps.address, As(old_copy, {Role::kWorker, 0})));  // The old CA's clients are out.
}

TEST(SecurityTest, TokensNameTheCallerAndBadOnesAreRefused) {
  const std::string certs = WriteCerts("tokens");
  Server ps = StartPs(Job(certs, /*tokens=*/true));
  ASSERT_NE(ps.process, nullptr);
  std::ifstream secret_file(certs + "/token.secret");
  std::string secret;
  secret_file >> secret;
  auto with_token = [&](const std::string& token) {
    const std::string path = certs + "/test.token";
    std::ofstream(path) << token << "\n";
    SecurityOptions security = As(certs, {Role::kAdmin, 0});
    security.token_file = path;
    return Stub(ps.address, security);
  };
  // The admin certificate with worker 0's token: the token's identity may update as worker 0.
  auto as_worker = with_token(IssueToken(secret, {Role::kWorker, 0}, absl::Now() + absl::Hours(1)));
  EXPECT_TRUE(Update(*as_worker, 0, 1, 0.5f).ok());
  auto expired = with_token(IssueToken(secret, {Role::kWorker, 0}, absl::Now() - absl::Seconds(1)));
  EXPECT_EQ(Update(*expired, 0, 2, 0.5f).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  auto forged = with_token(IssueToken("not the job's secret", {Role::kWorker, 0}, absl::Now() + absl::Hours(1)));
  EXPECT_EQ(Update(*forged, 0, 3, 0.5f).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // The token file is read again when it changes: a rotated (here: expired) token takes over.
  {
    const std::string path = certs + "/rotating.token";
    std::ofstream(path) << IssueToken(secret, {Role::kWorker, 0}, absl::Now() + absl::Hours(1)) << "\n";
    SecurityOptions security = As(certs, {Role::kAdmin, 0});
    security.token_file = path;
    security.reload_interval = absl::Milliseconds(50);
    auto rotating = Stub(ps.address, security);
    EXPECT_TRUE(Update(*rotating, 0, 10, 0.5f).ok());
    absl::SleepFor(absl::Milliseconds(20));  // A modification time the reader can tell apart.
    std::ofstream(path) << IssueToken(secret, {Role::kWorker, 0}, absl::Now() - absl::Seconds(5)) << "\n";
    absl::SleepFor(absl::Milliseconds(200));
    EXPECT_EQ(Update(*rotating, 0, 11, 0.5f).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  // A token file that cannot be read fails the call; it never falls back to the certificate.
  SecurityOptions missing = As(certs, {Role::kWorker, 0});
  missing.token_file = certs + "/no-such.token";
  EXPECT_FALSE(rpc::ChannelCredentials(missing).ok());
}

TEST(SecurityTest, AWorkersBatchesGoToThatWorkerOnly) {
  const std::string certs = WriteCerts("loader");
  const std::string job = Job(certs, /*tokens=*/false);
  Server loader = Start({HYREC_LOADER_BINARY, "--config=" + job, "--port=0", "--log_level=error"});
  ASSERT_NE(loader.process, nullptr);
  data_loader::StreamClientOptions thief;
  thief.security = As(certs, {Role::kWorker, 1});
  auto stolen = data_loader::ConnectBatchStream(loader.address, /*worker=*/0, thief);
  ASSERT_TRUE(stolen.ok()) << stolen.status();
  data_loader::Batch batch;
  const absl::Status refused = (*stolen)->Next(&batch, absl::Seconds(10));
  EXPECT_TRUE(absl::IsPermissionDenied(refused)) << refused;
  stolen->reset();
  data_loader::StreamClientOptions owner;
  owner.security = As(certs, {Role::kWorker, 0});
  auto stream = data_loader::ConnectBatchStream(loader.address, 0, owner);
  ASSERT_TRUE(stream.ok()) << stream.status();
  data_loader::StreamClientOptions other;  // The loader reads once every worker's stream is open.
  other.security = As(certs, {Role::kWorker, 1});
  auto second = data_loader::ConnectBatchStream(loader.address, 1, other);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE((*stream)->Next(&batch, absl::Seconds(10)).ok());
  EXPECT_EQ(batch.batch_id, 0u);
}

TEST(SecurityTest, ARoleWithoutItsFilesFailsAtStartNamingTheFile) {
  const std::string job = Job(FreshDir("nothing"), false);
  const testing::CommandResult r =
      testing::RunCommand({HYREC_PS_BINARY, "--config=" + job, "--shard_index=0", "--port=0"});
  EXPECT_EQ(r.code, 2) << r.all();
  EXPECT_TRUE(absl::StrContains(r.err, "ca.pem")) << r.err;
}

TEST(ListenerTest, ASecondServerOnATakenPortFailsToStart) {
  Server first = Start({HYREC_PS_BINARY, "--tables=t:4", "--security=none", "--port=0", "--log_level=error"});
  ASSERT_NE(first.process, nullptr);
  const std::string port = first.address.substr(first.address.rfind(':') + 1);
  const testing::CommandResult second =
      testing::RunCommand({HYREC_PS_BINARY, "--tables=t:4", "--security=none", "--port=" + port});
  EXPECT_NE(second.code, 0);
  EXPECT_TRUE(absl::StrContains(second.err, "cannot listen")) << second.err;
}

int Connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

TEST(ListenerTest, RunningOutOfDescriptorsLeavesThePsServingAfterwards) {
  Server ps = Start({"/bin/sh", "-c",
                     std::string("ulimit -n 256 && exec ") + HYREC_PS_BINARY +
                         " --tables=t:4 --security=none --port=0 --threads=2 --log_level=error"});
  ASSERT_NE(ps.process, nullptr);
  const int port = std::stoi(ps.address.substr(ps.address.rfind(':') + 1));
  std::vector<int> idle;
  for (int i = 0; i < 400; ++i) {
    const int fd = Connect(port);
    if (fd >= 0) idle.push_back(fd);
  }
  absl::SleepFor(absl::Seconds(1));
  for (int fd : idle) ::close(fd);
  embedding_ps::ClientOptions options;
  options.call_timeout = absl::Seconds(20);
  auto client = embedding_ps::ConnectEmbeddingClient({ps.address}, options);
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<float> row(4);
  const std::vector<uint64_t> ids = {1};
  EXPECT_TRUE((*client)->Lookup("t", ids, absl::MakeSpan(row)).ok());
  auto stats = (*client)->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_GT((*stats)[0].refused_connections + (*stats)[0].accept_errors, 0u);
}

uint64_t PeakRssKiB(pid_t pid) { return ProcessStatusBytes(pid, "VmHWM").value_or(0) / 1024; }

TEST(HardeningTest, OversizedRequestsAreRefusedBeforeAnythingIsAllocated) {
  Server ps = Start({HYREC_PS_BINARY, "--tables=big:1024", "--security=none", "--port=0", "--log_level=error"});
  ASSERT_NE(ps.process, nullptr);
  auto stub = EmbeddingService::NewStub(grpc::CreateChannel(ps.address, grpc::InsecureChannelCredentials()));
  std::vector<uint64_t> ids(200'000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = i;
  const std::string id_bytes(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(uint64_t));
  {  // 200k ids x 1024 floats would be an 800 MB answer: refused, and no row is created.
    proto::LookupRequest request;
    request.set_table("big");
    request.set_ids(id_bytes);
    proto::LookupResponse response;
    grpc::ClientContext context;
    EXPECT_EQ(stub->Lookup(&context, request, &response).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  {  // 200k ids with no gradients: once 800 MB of decoded gradients; now refused at the length.
    proto::UpdateRequest request;
    request.set_table("big");
    request.set_ids(id_bytes);
    proto::UpdateResponse response;
    grpc::ClientContext context;
    EXPECT_EQ(stub->Update(&context, request, &response).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  proto::StatsResponse stats;
  grpc::ClientContext context;
  ASSERT_TRUE(stub->Stats(&context, proto::StatsRequest(), &stats).ok());
  EXPECT_EQ(stats.rows(), 0u);
  EXPECT_EQ(stats.rejected_requests(), 2u);
  EXPECT_LT(PeakRssKiB(ps.process->pid()), 200u * 1024) << "KiB";
}

int Threads(pid_t pid) {
  int threads = -1;
  const absl::StatusOr<std::string> field = ProcessStatusField(pid, "Threads");
  return field.ok() && absl::SimpleAtoi(*field, &threads) ? threads : -1;
}

// A PS whose stderr nobody reads (its pipe fills after 64 KiB): thousands of refused calls
// neither pile up blocked threads nor keep SIGTERM from stopping it.
TEST(HardeningTest, AFloodOfRefusedCallsLeavesThreadsBoundedAndSigtermWorking) {
  SpawnOptions spawn;
  spawn.capture_stderr = true;  // And never read.
  auto process =
      Subprocess::Spawn({HYREC_PS_BINARY, "--tables=t:4", "--security=none", "--port=0", "--threads=4"}, spawn);
  ASSERT_TRUE(process.ok()) << process.status();
  auto port = WaitForListeningPort(**process, absl::Seconds(30));
  ASSERT_TRUE(port.ok()) << port.status();
  auto stub = EmbeddingService::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", *port), grpc::InsecureChannelCredentials()));
  std::vector<std::thread> clients;
  std::atomic<int> refused{0};
  for (int c = 0; c < 8; ++c) {
    clients.emplace_back([&] {
      for (int i = 0; i < 400; ++i) {
        proto::LookupRequest request;
        request.set_table("no such table, and a long name to fill the log faster");
        proto::LookupResponse response;
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
        if (stub->Lookup(&context, request, &response).error_code() == grpc::StatusCode::NOT_FOUND) ++refused;
      }
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(refused.load(), 3200);
  EXPECT_LT(Threads((*process)->pid()), 64);
  (*process)->Signal(SIGTERM);
  auto code = (*process)->Wait(absl::Seconds(15));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
}

// Any local process can open connections that fail their TLS handshake; gRPC logs each. With
// stderr a pipe nobody reads, those lines must neither block the PS (it goes on serving the
// job's workers) nor keep it from exiting on SIGTERM.
TEST(HardeningTest, AFloodOfFailedHandshakesNeitherBlocksNorStopsThePs) {
  const std::string certs = WriteCerts("handshake_flood");
  const std::string job = Job(certs, /*tokens=*/false);
  SpawnOptions spawn;
  spawn.capture_stderr = true;  // And never read.
  auto process =
      Subprocess::Spawn({HYREC_PS_BINARY, "--config=" + job, "--shard_index=0", "--port=0", "--log_level=info"}, spawn);
  ASSERT_TRUE(process.ok()) << process.status();
  auto port = WaitForListeningPort(**process, absl::Seconds(30));
  ASSERT_TRUE(port.ok()) << port.status();
  // Far more than a pipe holds: each failed handshake is a log line of gRPC's.
  const std::string garbage = "GET / HTTP/1.1\r\nHost: x\r\n\r\n" + std::string(200, 'x');
  std::vector<std::thread> floods;
  const absl::Time give_up = absl::Now() + absl::Seconds(20);  // A blocked server fails the test, not hangs it.
  for (int c = 0; c < 4; ++c) {
    floods.emplace_back([&] {
      for (int i = 0; i < 500 && absl::Now() < give_up; ++i) {
        const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
        timeval timeout{1, 0};  // Connect, write and read.
        ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
        ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_port = htons(static_cast<uint16_t>(*port));
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
          ::close(fd);
          continue;
        }
        (void)!::write(fd, garbage.data(), garbage.size());
        char buffer[256];
        (void)!::read(fd, buffer, sizeof(buffer));  // Until the server closes it.
        ::close(fd);
      }
    });
  }
  for (std::thread& t : floods) t.join();
  auto stub = Stub(absl::StrCat("127.0.0.1:", *port), As(certs, Identity{Role::kWorker, 0}));
  EXPECT_EQ(Row(*stub).size(), 16u);  // Still serving, within the call's deadline.
  (*process)->Signal(SIGTERM);
  auto code = (*process)->Wait(absl::Seconds(15));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
}

#ifdef HYREC_WORKER_BINARY
// A loader that answers Info as the job's would, then streams one batch whose inverse index
// points past the table's unique ids.
class MalformedLoader final : public proto::DataService::Service {
 public:
  grpc::Status Info(grpc::ServerContext*, const proto::LoaderInfoRequest*, proto::LoaderInfoResponse* out) override {
    out->set_num_workers(1);
    out->set_num_slots(2);
    out->set_num_dense(2);
    out->set_num_tables(2);
    out->set_num_shards(1);
    out->add_start_positions();
    return grpc::Status::OK;
  }
  grpc::Status StreamBatches(grpc::ServerContext*, const proto::StreamRequest*,
                             grpc::ServerWriter<proto::BatchProto>* writer) override {
    auto u32 = [](std::vector<uint32_t> v) {
      return std::string(reinterpret_cast<const char*>(v.data()), 4 * v.size());
    };
    auto u64 = [](std::vector<uint64_t> v) {
      return std::string(reinterpret_cast<const char*>(v.data()), 8 * v.size());
    };
    auto f32 = [](std::vector<float> v) { return std::string(reinterpret_cast<const char*>(v.data()), 4 * v.size()); };
    proto::BatchProto b;
    b.set_batch_id(0);
    b.set_batch_size(2);
    b.set_num_dense(2);
    b.set_labels(f32({0, 1}));
    b.set_dense(f32({0.1f, 0.2f, 0.3f, 0.4f}));
    for (int s = 0; s < 2; ++s) {
      proto::SlotIdsProto* slot = b.add_slots();
      slot->set_offsets(u32({0, 1, 2}));
      slot->set_ids(u64({1, 2}));
      proto::TableIdsProto* table = b.add_tables();
      table->set_unique_ids(u64({1, 2}));
      table->set_shard_offsets(u32({0, 2}));
      for (int k = 0; k < 2; ++k) table->add_inverse(k == s ? u32({0, s == 0 ? 5u : 1u}) : std::string());
    }
    writer->Write(b);
    return grpc::Status::OK;
  }
};

// Whether a plain TCP connection to 127.0.0.1:port is accepted.
bool Listening(int port) {
  const int fd = Connect(port);
  if (fd >= 0) ::close(fd);
  return fd >= 0;
}

// The workers' rendezvous, hosted by a real `hyrec worker` 0: a client without the job's
// certificate, or with a role other than worker, cannot announce itself as rank 1 (with
// TCPStore anyone could); the real worker 1 then joins and the job trains to the end.
TEST(SecurityTest, OnlyTheJobsWorkersJoinTheDenseRendezvous) {
  const std::string certs = WriteCerts("rendezvous");
  const std::string job = Job(certs, /*tokens=*/false);
  Server ps = StartPs(job);
  Server loader = Start({HYREC_LOADER_BINARY, "--config=" + job, "--port=0", "--log_level=error"});
  ASSERT_NE(ps.process, nullptr);
  ASSERT_NE(loader.process, nullptr);
  const int master_port = PickFreeLoopbackPort();
  auto worker = [&](int rank) {
    auto p = Subprocess::Spawn({HYREC_WORKER_BINARY, "--config=" + job, absl::StrCat("--rank=", rank),
                                "--ps=" + ps.address, "--loader=" + loader.address, "--master_addr=127.0.0.1",
                                absl::StrCat("--master_port=", master_port), "--progress=none",
                                "--plot=", "--log_level=error"});
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *std::move(p) : nullptr;
  };
  std::unique_ptr<Subprocess> worker0 = worker(0);
  ASSERT_NE(worker0, nullptr);
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!Listening(master_port) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(50));
  ASSERT_TRUE(Listening(master_port)) << "worker 0 never hosted its rendezvous";

  auto announce = [&](const SecurityOptions& security) {
    nn_sync::RendezvousOptions o;
    o.port = master_port;
    o.security = security;
    o.timeout = absl::Seconds(2);
    auto rendezvous = nn_sync::JoinRendezvous(o);
    EXPECT_TRUE(rendezvous.ok()) << rendezvous.status();
    return rendezvous.ok() ? (*rendezvous)->Set("hyrec/rendezvous/1", "1") : rendezvous.status();
  };
  EXPECT_FALSE(announce(SecurityOptions{}).ok());  // No TLS.
  EXPECT_FALSE(announce(As(WriteCerts("rendezvous_stranger"), {Role::kWorker, 1})).ok());
  EXPECT_TRUE(absl::IsPermissionDenied(announce(As(certs, {Role::kLoader, 0}))));
  EXPECT_TRUE(absl::IsPermissionDenied(announce(As(certs, {Role::kAdmin, 0}))));

  std::unique_ptr<Subprocess> worker1 = worker(1);
  ASSERT_NE(worker1, nullptr);
  for (Subprocess* w : {worker0.get(), worker1.get()}) {
    auto code = w->Wait(absl::Seconds(120));
    ASSERT_TRUE(code.ok()) << code.status();
    EXPECT_EQ(*code, 0);
  }
}

TEST(HardeningTest, AWorkerRefusesAMalformedBatchFromItsLoaderWithoutCrashing) {
  const std::string job = ::testing::TempDir() + "/security_test_malformed.yaml";
  std::ofstream(job) << "loader: {source: {format: synthetic, synthetic: {num_slots: 2, num_dense: 2}}}\n"
                     << "model: {embedding_dim: 4, bottom: [8], top: [8]}\n"
                     << "ps: {shards: 1}\ntrain: {workers: 1}\nsecurity: {mode: none}\n";
  Server ps = Start({HYREC_PS_BINARY, "--config=" + job, "--shard_index=0", "--port=0", "--log_level=error"});
  ASSERT_NE(ps.process, nullptr);
  MalformedLoader service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> loader = builder.BuildAndStart();
  ASSERT_NE(port, 0);
  const testing::CommandResult r = testing::RunCommand(
      {HYREC_WORKER_BINARY, "--config=" + job, "--rank=0", "--ps=" + ps.address,
       absl::StrCat("--loader=127.0.0.1:", port), "--master_addr=127.0.0.1",
       absl::StrCat("--master_port=", PickFreeLoopbackPort()), "--progress=none", "--plot=", "--log_level=error"});
  EXPECT_GT(r.code, 0) << r.all();
  EXPECT_LT(r.code, 128) << "killed by a signal: " << r.all();
  EXPECT_TRUE(absl::StrContains(r.err, "tables[0].inverse[0][1] is 5")) << r.all();
  loader->Shutdown();
}

// A worker given another job's certificates: its PS refuses the handshake. The worker says so in
// words and exits 2 (invalid input: a retry cannot help) at once, not as a transient failure
// after its timeouts.
TEST(SecurityTest, AWorkerOfAnotherCaSaysSoAndExitsAsInvalidInput) {
  const std::string certs = WriteCerts("ca_job");
  const std::string stranger = WriteCerts("ca_stranger");
  Server ps = StartPs(Job(certs, /*tokens=*/false));
  ASSERT_NE(ps.process, nullptr);
  const absl::Time start = absl::Now();
  const testing::CommandResult r =
      testing::RunCommand({HYREC_WORKER_BINARY, "--config=" + Job(certs, false), "--rank=0", "--ps=" + ps.address,
                           absl::StrCat("--loader=127.0.0.1:", PickFreeLoopbackPort()), "--master_addr=127.0.0.1",
                           absl::StrCat("--master_port=", PickFreeLoopbackPort()), "--certs=" + stranger,
                           "--progress=none", "--plot=", "--log_level=warn"});
  EXPECT_EQ(r.code, 2) << r.all();
  EXPECT_TRUE(absl::StrContains(r.err, "certificate not signed by this job's CA")) << r.all();
  EXPECT_LT(absl::Now() - start, hyrec::testing::Bounded(absl::Seconds(5)));
  ps.process->Signal(SIGTERM);
  EXPECT_EQ(*ps.process->Wait(absl::Seconds(10)), 0);
}

// The same with the loader: a loader holding another job's certificates refuses the worker's
// handshake, and the worker says so and exits 2 within its first connect, instead of waiting
// out cluster.startup_timeout_seconds saying only "Deadline Exceeded".
TEST(SecurityTest, AWorkerWhoseLoaderHoldsAnotherCaSaysSoAtOnce) {
  const std::string certs = WriteCerts("ca_job_loader");
  const std::string stranger = WriteCerts("ca_stranger_loader");
  Server ps = StartPs(Job(certs, /*tokens=*/false));
  ASSERT_NE(ps.process, nullptr);
  Server loader = Start(
      {HYREC_LOADER_BINARY, "--config=" + Job(certs, false), "--port=0", "--log_level=error", "--certs=" + stranger});
  ASSERT_NE(loader.process, nullptr);
  const testing::CommandResult r = testing::RunCommand(
      {HYREC_WORKER_BINARY, "--config=" + Job(certs, false), "--rank=0", "--ps=" + ps.address,
       "--loader=" + loader.address, "--master_addr=127.0.0.1", absl::StrCat("--master_port=", PickFreeLoopbackPort()),
       "--progress=none", "--plot=", "--log_level=warn", "--set=train.workers=1"});
  EXPECT_EQ(r.code, 2) << r.all();
  EXPECT_TRUE(absl::StrContains(r.err, "the loader at " + loader.address)) << r.all();
  EXPECT_TRUE(absl::StrContains(r.err, "certificate not signed by this job's CA")) << r.all();
  // Said at its first connect: not after waiting out its startup timeout for a loader that is up.
  EXPECT_FALSE(absl::StrContains(r.err, "Deadline Exceeded")) << r.all();
  EXPECT_FALSE(absl::StrContains(r.err, "did not answer within")) << r.all();
  for (Server* s : {&ps, &loader}) {
    s->process->Signal(SIGTERM);
    EXPECT_EQ(*s->process->Wait(absl::Seconds(10)), 0);
  }
}
#endif

}  // namespace
}  // namespace hyrec
