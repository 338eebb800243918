#include "src/cli/restart_policy.h"

#include <algorithm>

namespace hyrec::cli {

RestartPolicy::RestartPolicy(RestartPolicyOptions options)
    : options_(options), rng_(options.seed != 0 ? options.seed : std::random_device()()) {
  options_.jitter = std::clamp(options_.jitter, 0.0, 0.99);
  options_.max_doublings = std::clamp(options_.max_doublings, 0, 30);
}

RestartPolicy::Decision RestartPolicy::Take(const std::string& role, absl::Time now) {
  Decision decision;
  if (auto pending = due_.find(role); pending != due_.end()) {
    if (now < pending->second) {
      decision.verdict = Verdict::kLater;
      return decision;
    }
    due_.erase(pending);
    roles_[role].started = now;  // Until Started says when it began serving.
    decision.verdict = Verdict::kYes;
    return decision;
  }
  if (restarts() >= options_.budget) return decision;
  auto [state, first] = roles_.try_emplace(role);
  const int streak = state->second.streak;
  if (!first && now - state->second.started < options_.steady_run) {
    state->second.streak = std::min(streak + 1, options_.max_doublings);
  } else {
    state->second.streak = 0;
  }
  std::uniform_real_distribution<double> spread(1.0 - options_.jitter, 1.0 + options_.jitter);
  decision.backoff = options_.first_backoff * (int64_t{1} << state->second.streak) * spread(rng_);
  decision.counted = true;
  decision.verdict = Verdict::kLater;
  due_[role] = now + decision.backoff;
  history_.push_back({role, now, decision.backoff, state->second.streak});
  return decision;
}

void RestartPolicy::Started(const std::string& role, absl::Time now) { roles_[role].started = now; }

std::vector<std::string> RestartPolicy::Pending() const {
  std::vector<std::string> roles;
  for (const auto& [role, due] : due_) roles.push_back(role);
  return roles;
}

}  // namespace hyrec::cli
