#include "hyrec/common/security.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "hyrec/common/env.h"

namespace hyrec {

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kWorker:
      return "worker";
    case Role::kPs:
      return "ps";
    case Role::kLoader:
      return "loader";
    case Role::kAdmin:
      return "admin";
  }
  return "?";
}

std::string IdentityName(const Identity& identity) {
  if (identity.role == Role::kAdmin) return "admin";
  return absl::StrCat(RoleName(identity.role), "-", identity.index);
}

absl::StatusOr<Identity> ParseIdentityName(absl::string_view name) {
  if (name == "admin") return Identity{Role::kAdmin, 0};
  for (Role role : {Role::kWorker, Role::kPs, Role::kLoader}) {
    const std::string prefix = absl::StrCat(RoleName(role), "-");
    if (name.size() <= prefix.size() || name.substr(0, prefix.size()) != prefix) continue;
    const absl::string_view digits = name.substr(prefix.size());
    int index = 0;
    if (digits.size() > 6 || (digits.size() > 1 && digits[0] == '0') || !absl::SimpleAtoi(digits, &index) ||
        index < 0) {
      break;
    }
    return Identity{role, index};
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'", name, "' is not a hyrec identity (worker-N, ps-N, loader-N or admin)"));
}

SecurityOptions SecurityInDirectory(const std::string& dir, const Identity& identity) {
  SecurityOptions options;
  options.enabled = true;
  const std::string name = IdentityName(identity);
  options.ca_file = JoinPath(dir, "ca.pem");
  options.cert_file = JoinPath(dir, name + ".pem");
  options.key_file = JoinPath(dir, name + ".key");
  return options;
}

}  // namespace hyrec
