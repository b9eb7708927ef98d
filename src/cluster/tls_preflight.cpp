// CheckTlsFiles (foreman/cluster.hpp): the TLS files checked with libssl
// before a node listens. CAF's TLS module aborts the process or hangs a
// connect on a missing or mismatched file instead of returning an error, so
// everything it would load is loaded here first, the same way: the
// certificate chain, an unencrypted PEM key, and the CA file as the trust
// store.
#include <fcntl.h>
#include <sys/stat.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "foreman/cluster.hpp"

namespace foreman {
namespace {

constexpr std::size_t kMaxPemBytes = 16u << 20;

struct Deleter {
  void operator()(BIO* p) const { BIO_free(p); }
  void operator()(X509* p) const { X509_free(p); }
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  void operator()(X509_STORE* p) const { X509_STORE_free(p); }
  void operator()(X509_STORE_CTX* p) const { X509_STORE_CTX_free(p); }
  void operator()(STACK_OF(X509) * p) const { sk_X509_pop_free(p, X509_free); }
};
template <class T>
using Ptr = std::unique_ptr<T, Deleter>;

// Empties libssl's per-thread error queue on every way out.
struct ErrorQueueGuard {
  ErrorQueueGuard() { ERR_clear_error(); }
  ~ErrorQueueGuard() { ERR_clear_error(); }
};

// "flag 'path'" for messages.
std::string Name(const char* flag, const std::string& path) { return absl::StrCat(flag, " '", path, "'"); }

// libssl's reason for the last error, as " (reason)", or "".
std::string SslReason() {
  const unsigned long code = ERR_peek_last_error();
  if (code == 0) return "";
  const char* reason = ERR_reason_error_string(code);
  return reason == nullptr ? "" : absl::StrCat(" (libssl: ", reason, ")");
}

// The whole file, or INVALID_ARGUMENT with errno's text.
StatusOr<std::string> ReadFile(const char* flag, const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(flag, " is empty: give the path of a PEM file"));
  // O_NONBLOCK: a FIFO without a writer must not hang the open. Only a
  // regular file is accepted: CAF reads the file again when a peer connects,
  // and a pipe (/dev/stdin, <(...)) would be empty by then, aborting the
  // process (the abort this preflight exists to prevent).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    return absl::InvalidArgumentError(absl::StrCat(Name(flag, path), ": cannot open: ", std::strerror(err)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        Name(flag, path), ": not a regular file (a directory, pipe or device): the TLS module reads it again on "
                          "every connection"));
  }
  std::string data;
  char buf[16384];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      return absl::InvalidArgumentError(absl::StrCat(Name(flag, path), ": cannot read: ", std::strerror(err)));
    }
    if (n == 0) break;
    data.append(buf, static_cast<std::size_t>(n));
    if (data.size() > kMaxPemBytes) {
      ::close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat(Name(flag, path), ": larger than ", kMaxPemBytes >> 20, " MiB, not a PEM file"));
    }
  }
  ::close(fd);
  return data;
}

Ptr<BIO> MemBio(const std::string& data) {
  return Ptr<BIO>(BIO_new_mem_buf(data.data(), static_cast<int>(data.size())));
}

// Refuses any passphrase prompt (and so never reads the terminal); records
// that one was asked for.
int NoPassphrase(char* /*buf*/, int /*size*/, int /*rwflag*/, void* asked) {
  *static_cast<bool*>(asked) = true;
  return -1;
}

// Every certificate of a PEM file, in order (other PEM blocks are skipped).
StatusOr<std::vector<Ptr<X509>>> ReadCertificates(const char* flag, const std::string& path, const std::string& data) {
  Ptr<BIO> bio = MemBio(data);
  if (!bio) return absl::ResourceExhaustedError("CheckTlsFiles: BIO_new_mem_buf failed");
  std::vector<Ptr<X509>> certs;
  bool asked = false;
  for (;;) {
    X509* cert = PEM_read_bio_X509(bio.get(), nullptr, NoPassphrase, &asked);
    if (cert == nullptr) break;
    certs.emplace_back(cert);
  }
  if (certs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(Name(flag, path),
                                                   ": no PEM certificate found (expected a '-----BEGIN "
                                                   "CERTIFICATE-----' block)",
                                                   SslReason()));
  }
  // After at least one certificate the loop ends at the file's end ("no
  // start line") or at a block libssl cannot parse; the TLS module would stop
  // there too, silently dropping every certificate after it.
  const unsigned long end = ERR_peek_last_error();
  if (end != 0 && !(ERR_GET_LIB(end) == ERR_LIB_PEM && ERR_GET_REASON(end) == PEM_R_NO_START_LINE)) {
    return absl::InvalidArgumentError(absl::StrCat(Name(flag, path), ": certificate block ", certs.size() + 1,
                                                   " cannot be parsed", SslReason()));
  }
  ERR_clear_error();  // the loop ends on "no start line"
  return certs;
}

std::string TimeText(const ASN1_TIME* time) {
  Ptr<BIO> bio(BIO_new(BIO_s_mem()));
  if (!bio || ASN1_TIME_print(bio.get(), time) != 1) return "(unreadable date)";
  char* text = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &text);
  return std::string(text, static_cast<std::size_t>(n));
}

}  // namespace

Status CheckTlsFiles(const std::string& cert_path, const std::string& key_path, const std::string& ca_path) {
  ErrorQueueGuard guard;
  FOREMAN_ASSIGN_OR_RETURN(const std::string cert_pem, ReadFile("--tls-cert", cert_path));
  FOREMAN_ASSIGN_OR_RETURN(const std::string key_pem, ReadFile("--tls-key", key_path));
  FOREMAN_ASSIGN_OR_RETURN(const std::string ca_pem, ReadFile("--tls-ca", ca_path));

  // The certificate, then its intermediates (as a TLS chain file).
  FOREMAN_ASSIGN_OR_RETURN(std::vector<Ptr<X509>> chain, ReadCertificates("--tls-cert", cert_path, cert_pem));
  X509* cert = chain.front().get();

  // The key: unencrypted PEM (PKCS#8 or the traditional RSA/EC forms).
  Ptr<EVP_PKEY> key;
  {
    Ptr<BIO> bio = MemBio(key_pem);
    if (!bio) return absl::ResourceExhaustedError("CheckTlsFiles: BIO_new_mem_buf failed");
    bool asked = false;
    key.reset(PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, &asked));
    if (!key && asked) {
      return absl::InvalidArgumentError(absl::StrCat(
          Name("--tls-key", key_path),
          ": the private key is encrypted (passphrase-protected), and Foreman has no passphrase support yet; "
          "give an unencrypted key, readable only by its owner (openssl pkey -in ENCRYPTED.key -out KEY.key)"));
    }
    if (!key) {
      return absl::InvalidArgumentError(absl::StrCat(Name("--tls-key", key_path),
                                                     ": no PEM private key found (expected a '-----BEGIN PRIVATE "
                                                     "KEY-----' block or its RSA/EC form)"));
    }
  }
  if (X509_check_private_key(cert, key.get()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(Name("--tls-key", key_path),
                                                   " does not match the certificate ", Name("--tls-cert", cert_path),
                                                   " (it is the key of another certificate)"));
  }

  FOREMAN_ASSIGN_OR_RETURN(std::vector<Ptr<X509>> cas, ReadCertificates("--tls-ca", ca_path, ca_pem));

  // Validity now, with the dates (X509_verify_cert would say it too, without
  // them). X509_cmp_current_time: 1 later than now, -1 not later, 0 error.
  if (X509_cmp_current_time(X509_get0_notBefore(cert)) > 0) {
    return absl::InvalidArgumentError(absl::StrCat(Name("--tls-cert", cert_path), ": the certificate is not valid before ",
                                                   TimeText(X509_get0_notBefore(cert)),
                                                   " (check this machine's clock)"));
  }
  if (X509_cmp_current_time(X509_get0_notAfter(cert)) < 0) {
    return absl::InvalidArgumentError(absl::StrCat(Name("--tls-cert", cert_path), ": the certificate expired on ",
                                                   TimeText(X509_get0_notAfter(cert)), "; issue a new one"));
  }

  // The chain against the CA file, as a peer holding the same CA file would.
  Ptr<X509_STORE> store(X509_STORE_new());
  Ptr<STACK_OF(X509)> untrusted(sk_X509_new_null());
  Ptr<X509_STORE_CTX> ctx(X509_STORE_CTX_new());
  if (!store || !untrusted || !ctx) return absl::ResourceExhaustedError("CheckTlsFiles: out of memory in libssl");
  for (const Ptr<X509>& ca : cas) {
    if (X509_STORE_add_cert(store.get(), ca.get()) != 1) ERR_clear_error();  // a duplicate CA is harmless
  }
  for (std::size_t i = 1; i < chain.size(); ++i) {
    if (X509_up_ref(chain[i].get()) != 1 || sk_X509_push(untrusted.get(), chain[i].get()) == 0) {
      return absl::ResourceExhaustedError("CheckTlsFiles: out of memory in libssl");
    }
  }
  if (X509_STORE_CTX_init(ctx.get(), store.get(), cert, untrusted.get()) != 1) {
    return absl::InternalError(absl::StrCat("CheckTlsFiles: X509_STORE_CTX_init failed", SslReason()));
  }
  if (X509_verify_cert(ctx.get()) != 1) {
    const int err = X509_STORE_CTX_get_error(ctx.get());
    return absl::InvalidArgumentError(absl::StrCat(Name("--tls-cert", cert_path), " does not verify against ",
                                                   Name("--tls-ca", ca_path), ": ", X509_verify_cert_error_string(err),
                                                   " (peers holding this CA file would refuse it)"));
  }
  return absl::OkStatus();
}

}  // namespace foreman
