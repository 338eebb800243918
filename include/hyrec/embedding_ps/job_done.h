// The end of a finished job, as worker 0 tells it to the PS shards (JobDone, proto/embedding.proto):
// a shard whose job says cluster.services_exit_when_done then exits 0; otherwise it notes it.
#ifndef HYREC_EMBEDDING_PS_JOB_DONE_H_
#define HYREC_EMBEDDING_PS_JOB_DONE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "hyrec/common/security.h"

namespace hyrec::embedding_ps {

// JobDone to the shard at each of `addresses` (in shard order), as `security`'s identity (worker
// 0 or an admin), each within `timeout`. Every shard is told; the first failure names its shard.
absl::Status TellShardsJobDone(const std::vector<std::string>& addresses, const SecurityOptions& security,
                               absl::Duration timeout);

}  // namespace hyrec::embedding_ps

#endif  // HYREC_EMBEDDING_PS_JOB_DONE_H_
