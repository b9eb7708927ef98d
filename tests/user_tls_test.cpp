// A program's own OpenSSL code in a process that links libforeman (issue 30
// point 8; README "What libforeman changes in the whole process"):
// libforeman interposes SSL_read, SSL_write, SSL_accept and SSL_connect (each
// clears the calling thread's error queue, then calls libssl's:
// actors/tls_error_queue.cpp). These tests check that a user's TLS client
// and server, written against libssl alone, still handshake and exchange
// bytes through those definitions, and that the one documented difference
// holds: an error left on the queue before such a call is gone after it.
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <doctest/doctest.h>

#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "foreman/status.hpp"

namespace {

// Every blocking socket call of these tests gives up after this long.
constexpr int kSocketTimeoutSecs = 10;

struct SslFree {
  void operator()(SSL_CTX* p) const { SSL_CTX_free(p); }
  void operator()(SSL* p) const { SSL_free(p); }
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  void operator()(X509* p) const { X509_free(p); }
};
template <typename T>
using Owned = std::unique_ptr<T, SslFree>;

// A fresh P-256 key and a self-signed certificate for CN=127.0.0.1, valid
// for a day: the test's own server identity, which its client trusts.
void MakeIdentity(Owned<EVP_PKEY>* key, Owned<X509>* cert) {
  key->reset(EVP_EC_gen("P-256"));
  REQUIRE(*key != nullptr);
  cert->reset(X509_new());
  REQUIRE(*cert != nullptr);
  X509* c = cert->get();
  REQUIRE(X509_set_version(c, 2) == 1);
  REQUIRE(ASN1_INTEGER_set(X509_get_serialNumber(c), 1) == 1);
  REQUIRE(X509_gmtime_adj(X509_getm_notBefore(c), -60) != nullptr);
  REQUIRE(X509_gmtime_adj(X509_getm_notAfter(c), 86400) != nullptr);
  REQUIRE(X509_set_pubkey(c, key->get()) == 1);
  X509_NAME* name = X509_get_subject_name(c);
  REQUIRE(X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("127.0.0.1"),
                                     -1, -1, 0) == 1);
  REQUIRE(X509_set_issuer_name(c, name) == 1);
  REQUIRE(X509_sign(c, key->get(), EVP_sha256()) > 0);
}

void SetTimeouts(int fd) {
  timeval tv{kSocketTimeoutSecs, 0};
  REQUIRE(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0);
  REQUIRE(setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) == 0);
}

// The shared object that defines `symbol` for this process's lookups.
std::string DefiningObject(const char* symbol) {
  void* fn = dlsym(RTLD_DEFAULT, symbol);
  Dl_info info{};
  if (fn == nullptr || dladdr(fn, &info) == 0 || info.dli_fname == nullptr) return "(none)";
  return info.dli_fname;
}

}  // namespace

TEST_CASE("the four interposed SSL functions this process calls are libforeman's (the premise of the next case)") {
  // Link a foreman symbol so that libforeman is loaded, as in a user's program.
  CHECK(foreman::Status().ok());
  for (const char* symbol : {"SSL_read", "SSL_write", "SSL_accept", "SSL_connect"}) {
    CAPTURE(symbol);
    const std::string object = DefiningObject(symbol);
    CHECK_MESSAGE(object.find("libforeman") != std::string::npos, object);
  }
  // Functions libforeman does not define still come from libssl.
  CHECK_MESSAGE(DefiningObject("SSL_CTX_new").find("libssl") != std::string::npos, DefiningObject("SSL_CTX_new"));
}

TEST_CASE("a user's own TLS server and client (libssl only) handshake and echo through libforeman's SSL_* ") {
  Owned<EVP_PKEY> key;
  Owned<X509> cert;
  MakeIdentity(&key, &cert);

  Owned<SSL_CTX> server_ctx(SSL_CTX_new(TLS_server_method()));
  REQUIRE(server_ctx != nullptr);
  REQUIRE(SSL_CTX_use_certificate(server_ctx.get(), cert.get()) == 1);
  REQUIRE(SSL_CTX_use_PrivateKey(server_ctx.get(), key.get()) == 1);
  Owned<SSL_CTX> client_ctx(SSL_CTX_new(TLS_client_method()));
  REQUIRE(client_ctx != nullptr);
  REQUIRE(X509_STORE_add_cert(SSL_CTX_get_cert_store(client_ctx.get()), cert.get()) == 1);
  SSL_CTX_set_verify(client_ctx.get(), SSL_VERIFY_PEER, nullptr);

  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(listener >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(listen(listener, 1) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  SetTimeouts(listener);

  // The server: one connection, one TLS handshake, echo what it reads.
  std::string server_error;
  std::thread server([&] {
    const int fd = accept(listener, nullptr, nullptr);
    if (fd < 0) {
      server_error = "accept failed (no client within the timeout?)";
      return;
    }
    SetTimeouts(fd);
    Owned<SSL> ssl(SSL_new(server_ctx.get()));
    SSL_set_fd(ssl.get(), fd);
    char buf[64] = {};
    int n = 0;
    if (SSL_accept(ssl.get()) != 1) {
      server_error = "SSL_accept failed";
    } else if ((n = SSL_read(ssl.get(), buf, sizeof buf)) <= 0) {
      server_error = "SSL_read failed";
    } else if (SSL_write(ssl.get(), buf, n) != n) {
      server_error = "SSL_write failed";
    } else {
      SSL_shutdown(ssl.get());
    }
    close(fd);
  });

  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  SetTimeouts(fd);
  const bool connected = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  std::string client_error;
  std::string echoed;
  bool queue_cleared = false;
  if (!connected) {
    client_error = "connect failed";
  } else {
    Owned<SSL> ssl(SSL_new(client_ctx.get()));
    SSL_set_fd(ssl.get(), fd);
    if (SSL_connect(ssl.get()) != 1) {
      client_error = "SSL_connect failed (" + std::to_string(ERR_peek_last_error()) + ")";
    } else if (SSL_get_verify_result(ssl.get()) != X509_V_OK) {
      client_error = "the server's certificate did not verify";
    } else {
      const std::string hello = "hello from the user's own TLS code";
      // An error the program left on its queue: libforeman's SSL_write
      // clears it first (the one documented change), and the write works.
      ERR_raise(ERR_LIB_USER, 1);
      if (SSL_write(ssl.get(), hello.data(), static_cast<int>(hello.size())) != static_cast<int>(hello.size())) {
        client_error = "SSL_write failed";
      } else {
        queue_cleared = ERR_peek_error() == 0;
        char buf[64] = {};
        const int n = SSL_read(ssl.get(), buf, sizeof buf);
        if (n > 0) echoed.assign(buf, static_cast<std::size_t>(n));
        else client_error = "SSL_read failed";
      }
      SSL_shutdown(ssl.get());
    }
  }
  close(fd);
  server.join();
  close(listener);
  CHECK_MESSAGE(server_error.empty(), server_error);
  REQUIRE_MESSAGE(client_error.empty(), client_error);
  CHECK(echoed == "hello from the user's own TLS code");
  CHECK(queue_cleared);
}
