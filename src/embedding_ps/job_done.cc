#include "hyrec/embedding_ps/job_done.h"

#include "absl/strings/str_cat.h"
#include "embedding.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "hyrec/common/grpc_status.h"
#include "hyrec/common/status_macros.h"
#include "src/common/rpc.h"

namespace hyrec::embedding_ps {

absl::Status TellShardsJobDone(const std::vector<std::string>& addresses, const SecurityOptions& security,
                               absl::Duration timeout) {
  HYREC_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials, rpc::ChannelCredentials(security));
  absl::Status first;
  for (size_t s = 0; s < addresses.size(); ++s) {
    grpc::ChannelArguments args = rpc::ChannelArgumentsFor(security, Identity{Role::kPs, static_cast<int>(s)});
    auto stub = proto::EmbeddingService::NewStub(grpc::CreateCustomChannel(addresses[s], credentials, args));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    proto::JobDoneResponse response;
    const grpc::Status status = stub->JobDone(&context, proto::JobDoneRequest(), &response);
    if (!status.ok() && first.ok()) {
      first = absl::Status(FromGrpcStatus(status).code(), absl::StrCat("telling PS shard ", s, " at ", addresses[s],
                                                                       " the job is done: ", status.error_message()));
    }
  }
  return first;
}

}  // namespace hyrec::embedding_ps
