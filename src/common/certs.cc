#include "hyrec/common/certs.h"

#include <fcntl.h>
#include <openssl/bn.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "hyrec/common/env.h"
#include "hyrec/common/status_macros.h"

namespace hyrec {
namespace {

struct KeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
struct CertFree {
  void operator()(X509* cert) const { X509_free(cert); }
};
struct BioFree {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
using Key = std::unique_ptr<EVP_PKEY, KeyFree>;
using Cert = std::unique_ptr<X509, CertFree>;
using Bio = std::unique_ptr<BIO, BioFree>;

absl::Status OpenSslError(absl::string_view what) {
  const unsigned long code = ERR_get_error();
  char text[256] = "unknown error";
  if (code != 0) ERR_error_string_n(code, text, sizeof(text));
  ERR_clear_error();
  return absl::InternalError(absl::StrCat(what, ": ", text));
}

std::string BioText(BIO* bio) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  return std::string(data, n > 0 ? static_cast<size_t>(n) : 0);
}

// Writes `text` to `path` through a temporary file created with `mode`, synced, then renamed:
// a key is never readable by others, not even for a moment.
absl::Status WritePrivateFile(const std::string& path, const std::string& text, mode_t mode) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return absl::PermissionDeniedError(absl::StrCat("cannot create ", tmp, ": ", std::strerror(errno)));
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return absl::ResourceExhaustedError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(error)));
    }
    done += static_cast<size_t>(n);
  }
  const bool synced = ::fchmod(fd, mode) == 0 && ::fsync(fd) == 0;
  ::close(fd);
  if (!synced || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    ::unlink(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot write ", path, ": ", std::strerror(error)));
  }
  return absl::OkStatus();
}

absl::StatusOr<Key> NewKey() {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  if (key == nullptr) return OpenSslError("generating an ECDSA P-256 key");
  return Key(key);
}

absl::Status AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* extension = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (extension == nullptr) return OpenSslError(absl::StrCat("certificate extension ", value));
  const int added = X509_add_ext(cert, extension, -1);
  X509_EXTENSION_free(extension);
  if (added != 1) return OpenSslError(absl::StrCat("adding certificate extension ", value));
  return absl::OkStatus();
}

// A certificate for `common_name`'s `key`, signed by the issuer (self-signed when it is null: the CA).
absl::StatusOr<Cert> NewCertificate(const std::string& common_name, EVP_PKEY* key, X509* issuer, EVP_PKEY* issuer_key,
                                    absl::Duration validity) {
  const bool ca = issuer == nullptr;
  Cert cert(X509_new());
  if (cert == nullptr) return OpenSslError("X509_new");
  X509* c = cert.get();
  unsigned char serial[16];
  if (RAND_bytes(serial, sizeof(serial)) != 1) return OpenSslError("random serial number");
  serial[0] &= 0x7f;
  BIGNUM* number = BN_bin2bn(serial, sizeof(serial), nullptr);
  const bool serial_set = number != nullptr && BN_to_ASN1_INTEGER(number, X509_get_serialNumber(c)) != nullptr;
  BN_free(number);
  X509_NAME* name = X509_get_subject_name(c);
  const auto* cn = reinterpret_cast<const unsigned char*>(common_name.c_str());
  const auto* org = reinterpret_cast<const unsigned char*>("hyrec");
  if (!serial_set || X509_set_version(c, 2) != 1 || X509_gmtime_adj(X509_getm_notBefore(c), -3600) == nullptr ||
      X509_gmtime_adj(X509_getm_notAfter(c), absl::ToInt64Seconds(validity)) == nullptr ||
      X509_set_pubkey(c, key) != 1 || X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, org, -1, -1, 0) != 1 ||
      X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, cn, -1, -1, 0) != 1 ||
      X509_set_issuer_name(c, ca ? name : X509_get_subject_name(issuer)) != 1) {
    return OpenSslError(absl::StrCat("building the certificate of ", common_name));
  }
  X509* signer = ca ? c : issuer;
  HYREC_RETURN_IF_ERROR(AddExtension(c, signer, NID_subject_key_identifier, "hash"));
  if (ca) {
    HYREC_RETURN_IF_ERROR(AddExtension(c, signer, NID_basic_constraints, "critical,CA:TRUE,pathlen:0"));
    HYREC_RETURN_IF_ERROR(AddExtension(c, signer, NID_key_usage, "critical,keyCertSign,cRLSign"));
  } else {
    HYREC_RETURN_IF_ERROR(AddExtension(c, signer, NID_basic_constraints, "critical,CA:FALSE"));
    HYREC_RETURN_IF_ERROR(AddExtension(c, signer, NID_key_usage, "critical,digitalSignature"));
    HYREC_RETURN_IF_ERROR(AddExtension(c, signer, NID_ext_key_usage, "serverAuth,clientAuth"));
    HYREC_RETURN_IF_ERROR(AddExtension(c, signer, NID_subject_alt_name, "DNS:" + common_name));
    HYREC_RETURN_IF_ERROR(AddExtension(c, signer, NID_authority_key_identifier, "keyid:always"));
  }
  if (X509_sign(c, ca ? key : issuer_key, EVP_sha256()) <= 0) {
    return OpenSslError(absl::StrCat("signing the certificate of ", common_name));
  }
  return cert;
}

absl::StatusOr<std::string> CertificatePem(X509* cert) {
  Bio bio(BIO_new(BIO_s_mem()));
  if (bio == nullptr || PEM_write_bio_X509(bio.get(), cert) != 1) return OpenSslError("encoding a certificate");
  return BioText(bio.get());
}

absl::StatusOr<std::string> KeyPem(EVP_PKEY* key) {
  Bio bio(BIO_new(BIO_s_mem()));
  if (bio == nullptr || PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    return OpenSslError("encoding a private key");
  }
  return BioText(bio.get());
}

absl::Status WriteIdentity(const std::string& dir, const std::string& name, EVP_PKEY* key, X509* cert) {
  HYREC_ASSIGN_OR_RETURN(std::string key_pem, KeyPem(key));
  HYREC_ASSIGN_OR_RETURN(std::string cert_pem, CertificatePem(cert));
  HYREC_RETURN_IF_ERROR(WritePrivateFile(JoinPath(dir, name + ".key"), key_pem, 0600));
  return WritePrivateFile(JoinPath(dir, name + ".pem"), cert_pem, 0644);
}

absl::Status LoadCa(const std::string& dir, Key* key, Cert* cert) {
  Env* env = Env::Default();
  HYREC_ASSIGN_OR_RETURN(std::string key_pem, ReadFileToString(env, JoinPath(dir, "ca.key"), 1 << 20));
  HYREC_ASSIGN_OR_RETURN(std::string cert_pem, ReadFileToString(env, JoinPath(dir, "ca.pem"), 1 << 20));
  Bio key_bio(BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size())));
  Bio cert_bio(BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size())));
  key->reset(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  cert->reset(PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr));
  // Files that do not parse are the operator's input, named with what they should hold.
  if (*key == nullptr) {
    const absl::Status error = OpenSslError("");
    return absl::InvalidArgumentError(absl::StrCat(dir, "/ca.key is not a PEM private key (OpenSSL", error.message(),
                                                   "); restore the CA's key, or make a new CA in another --dir"));
  }
  if (*cert == nullptr) {
    const absl::Status error = OpenSslError("");
    return absl::InvalidArgumentError(
        absl::StrCat(dir, "/ca.pem is not a PEM certificate (OpenSSL", error.message(),
                     "); restore the CA's certificate, or make a new CA in another --dir"));
  }
  if (X509_check_private_key(cert->get(), key->get()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(dir, "/ca.key is not the key of ", dir, "/ca.pem"));
  }
  return absl::OkStatus();
}

std::string Signature(absl::string_view secret, absl::string_view payload) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(payload.data()), payload.size(), digest, &length);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest), length));
}

}  // namespace

std::vector<Identity> JobIdentities(int workers, int ps, int loaders) {
  std::vector<Identity> out;
  for (int i = 0; i < workers; ++i) out.push_back({Role::kWorker, i});
  for (int i = 0; i < ps; ++i) out.push_back({Role::kPs, i});
  for (int i = 0; i < loaders; ++i) out.push_back({Role::kLoader, i});
  out.push_back({Role::kAdmin, 0});
  return out;
}

absl::Status WritePrivateTextFile(const std::string& path, const std::string& text) {
  return WritePrivateFile(path, text, 0600);
}

absl::Status WriteJobCertificates(const CertificateRequest& request) {
  if (request.dir.empty()) return absl::InvalidArgumentError("no directory for the certificates");
  if (::mkdir(request.dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::PermissionDeniedError(absl::StrCat("cannot create ", request.dir, ": ", std::strerror(errno)));
  }
  Key ca_key;
  Cert ca_cert;
  const bool have_ca = Env::Default()->FileExists(JoinPath(request.dir, "ca.key"));
  if (have_ca && !request.reuse_ca) {
    return absl::AlreadyExistsError(absl::StrCat(request.dir,
                                                 "/ca.key exists: its certificates would no longer verify against a "
                                                 "new CA; add identities to it (--add) or choose another directory"));
  }
  if (have_ca) {
    HYREC_RETURN_IF_ERROR(LoadCa(request.dir, &ca_key, &ca_cert));
  } else {
    HYREC_ASSIGN_OR_RETURN(ca_key, NewKey());
    HYREC_ASSIGN_OR_RETURN(ca_cert, NewCertificate("hyrec job CA", ca_key.get(), nullptr, nullptr, request.validity));
    HYREC_RETURN_IF_ERROR(WriteIdentity(request.dir, "ca", ca_key.get(), ca_cert.get()));
  }
  for (const Identity& identity : request.identities) {
    const std::string name = IdentityName(identity);
    HYREC_ASSIGN_OR_RETURN(Key key, NewKey());
    HYREC_ASSIGN_OR_RETURN(Cert cert, NewCertificate(name, key.get(), ca_cert.get(), ca_key.get(), request.validity));
    HYREC_RETURN_IF_ERROR(WriteIdentity(request.dir, name, key.get(), cert.get()));
  }
  if (request.token_secret && !Env::Default()->FileExists(JoinPath(request.dir, "token.secret"))) {
    unsigned char secret[32];
    if (RAND_bytes(secret, sizeof(secret)) != 1) return OpenSslError("random token secret");
    const std::string hex =
        absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(secret), sizeof(secret)));
    HYREC_RETURN_IF_ERROR(WritePrivateFile(JoinPath(request.dir, "token.secret"), hex + "\n", 0600));
  }
  return absl::OkStatus();
}

std::string IssueToken(absl::string_view secret, const Identity& identity, absl::Time expiry) {
  const std::string payload = absl::StrCat("hyrec1.", IdentityName(identity), ".", absl::ToUnixSeconds(expiry));
  return absl::StrCat(payload, ".", Signature(secret, payload));
}

absl::StatusOr<Identity> VerifyToken(absl::string_view secret, absl::string_view token, absl::Time now) {
  token = absl::StripAsciiWhitespace(token);
  const size_t last = token.rfind('.');
  std::vector<absl::string_view> parts = absl::StrSplit(token, '.');
  if (parts.size() != 4 || parts[0] != "hyrec1" || last == absl::string_view::npos) {
    return absl::UnauthenticatedError("the token is not a hyrec token (hyrec1.<identity>.<expiry>.<signature>)");
  }
  if (secret.empty()) return absl::UnauthenticatedError("this server accepts no tokens (no token secret)");
  const std::string expected = Signature(secret, token.substr(0, last));
  if (parts[3].size() != expected.size() || CRYPTO_memcmp(parts[3].data(), expected.data(), expected.size()) != 0) {
    return absl::UnauthenticatedError("the token's signature is not this job's");
  }
  int64_t expiry = 0;
  if (!absl::SimpleAtoi(parts[2], &expiry)) return absl::UnauthenticatedError("the token's expiry is not a number");
  if (now >= absl::FromUnixSeconds(expiry)) {
    return absl::UnauthenticatedError(
        absl::StrCat("the token expired at ", absl::FormatTime(absl::FromUnixSeconds(expiry), absl::UTCTimeZone())));
  }
  absl::StatusOr<Identity> identity = ParseIdentityName(parts[1]);
  if (!identity.ok()) return absl::UnauthenticatedError(identity.status().message());
  return identity;
}

absl::StatusOr<Identity> VerifyBearerToken(absl::string_view secret, absl::string_view authorization, absl::Time now) {
  if (!absl::ConsumePrefix(&authorization, "Bearer ")) {
    return absl::UnauthenticatedError("the authorization header is not \"Bearer <token>\"");
  }
  return VerifyToken(secret, authorization, now);
}

}  // namespace hyrec
