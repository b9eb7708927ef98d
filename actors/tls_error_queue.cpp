// OpenSSL's error queue around CAF 0.17.6's TLS I/O (issue 13 point 5).
//
// OpenSSL's rule (SSL_get_error(3)): "The current thread's error queue must
// be empty before the TLS/SSL I/O operation is attempted, or SSL_get_error()
// will not work reliably." CAF 0.17.6's openssl session
// (libcaf_openssl/src/openssl/session.cpp) never clears it before SSL_read,
// SSL_write, SSL_accept or SSL_connect, and drains it after a failure only
// inside CAF_LOG_INFO, which Debian's build compiles out. All TLS
// connections of a node are served by the multiplexer's one thread, so the
// error a failed handshake leaves (a peer without a certificate of the CA,
// a bare TCP connect-and-close, `foreman cluster status` with the wrong
// certificate) stays on that thread, and SSL_get_error then misreports every
// other connection's ordinary "want read" as a failure: measured, a ps
// stopped answering its workers (1 apply in 500 ms after a connect-and-close,
// about 1700 before) while their links stayed up, so anyone who could reach
// the port could stall training without a certificate.
//
// The fix, until CAF does it: libforeman defines these four functions,
// clears the calling thread's error queue, and calls libssl's. The dynamic
// linker binds libcaf_openssl's calls to the first definition in the
// process's global scope, which is this one when libforeman is loaded
// before libssl (always, for a program linked against libforeman: libssl is
// one of its dependencies, which come after it). Loaded with dlopen and
// RTLD_LOCAL, libforeman would not interpose, and the stall would come back
// (tests/cluster_server_test.cpp catches it in the suite). Clearing an
// error queue that the next call would overwrite anyway is what OpenSSL
// asks every caller to do, so other users of libssl in the process are not
// affected in any way they could rely on.
#include <dlfcn.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <cstdio>
#include <cstdlib>

namespace {

// libssl's definition of `name`: the next one after libforeman's in the
// lookup order. Aborts with a message if there is none (libssl is a
// dependency of libforeman, so it is always loaded).
template <typename Fn>
Fn RealSslFunction(const char* name) {
  void* fn = dlsym(RTLD_NEXT, name);
  if (fn == nullptr) {
    std::fprintf(stderr, "foreman: %s: libssl's definition not found (%s)\n", name, dlerror());
    std::abort();
  }
  return reinterpret_cast<Fn>(fn);
}

}  // namespace

extern "C" {

int SSL_read(SSL* ssl, void* buf, int num) {
  static const auto real = RealSslFunction<int (*)(SSL*, void*, int)>("SSL_read");
  ERR_clear_error();
  return real(ssl, buf, num);
}

int SSL_write(SSL* ssl, const void* buf, int num) {
  static const auto real = RealSslFunction<int (*)(SSL*, const void*, int)>("SSL_write");
  ERR_clear_error();
  return real(ssl, buf, num);
}

int SSL_accept(SSL* ssl) {
  static const auto real = RealSslFunction<int (*)(SSL*)>("SSL_accept");
  ERR_clear_error();
  return real(ssl);
}

int SSL_connect(SSL* ssl) {
  static const auto real = RealSslFunction<int (*)(SSL*)>("SSL_connect");
  ERR_clear_error();
  return real(ssl);
}

}  // extern "C"
