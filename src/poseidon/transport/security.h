// Job membership: ZeroMQ CURVE keys derived from a shared job secret.
//
// Every rank of a job knows the secret (POSEIDON_SECRET or
// POSEIDON_SECRET_FILE; `poseidon launch` and `poseidon train` make a random
// one for the ranks they start). From it each derives the same two CURVE
// keypairs: the servers' (every bound socket: data endpoints and the
// coordinator) and the clients' (every connecting socket). A ZAP handler on
// each node admits a connection only if its CURVE client key is the job's;
// anything else never completes the handshake, so its frames reach no
// decoder and touch no state. Refusals are counted and logged.
//
// Why CURVE rather than an HMAC handshake of our own: the transport already
// implements it (libzmq with libsodium), it authenticates every connection
// before a single message is delivered, it encrypts the gradients on the
// wire as a bonus, and the secret itself never travels.
#pragma once

#include <atomic>
#include <string>
#include <thread>
#include <zmq.hpp>

#include "poseidon/transport/security_mode.h"

namespace poseidon {

struct CurveKeys {
  std::string serverPublic, serverSecret, clientPublic, clientSecret;  // Z85, 40 characters each
  std::string clientPublicBinary;                                      // 32 bytes, as ZAP reports it
};

// Throws Error when libzmq was built without CURVE, or the secret is empty.
CurveKeys deriveCurveKeys(const std::string& secret);
// A fresh random secret (64 hex characters) for the ranks a launcher starts.
std::string randomSecret();

void makeCurveServer(zmq::socket_t& socket, const CurveKeys& keys);
void makeCurveClient(zmq::socket_t& socket, const CurveKeys& keys);

// Connections this process refused for a wrong or missing job secret, by every authenticator and
// monitor below: a rendezvous that times out names them (two ranks with different secrets look like
// a rank that never came).
uint64_t refusedNonMembers();

// Logs and counts connections to a CURVE server socket whose handshake failed
// before authentication (peers without the job's server key: plain ZeroMQ,
// CURVE with another secret, raw TCP). Poll socket() with the owner's other
// sockets and call onReadable() when it is readable; owner's thread only.
class HandshakeMonitor {
 public:
  HandshakeMonitor(zmq::context_t& ctx, zmq::socket_t& watched, std::string endpoint);
  ~HandshakeMonitor();
  zmq::socket_t& socket() { return pair_; }
  void onReadable();
  uint64_t refused() const { return refused_.load(); }
  void stop();

 private:
  zmq::socket_t* watched_;
  zmq::socket_t pair_;
  std::string endpoint_;
  std::atomic<uint64_t> refused_{0};
  bool stopped_ = false;
};

// Answers ZAP requests for one ZeroMQ context (RFC 27). Create it before any
// CURVE server socket of that context binds.
class ZapAuthenticator {
 public:
  ZapAuthenticator(zmq::context_t& ctx, const CurveKeys& keys);
  ~ZapAuthenticator();
  ZapAuthenticator(const ZapAuthenticator&) = delete;
  ZapAuthenticator& operator=(const ZapAuthenticator&) = delete;
  uint64_t refused() const { return refused_.load(); }

 private:
  void run();
  zmq::socket_t socket_;
  std::string expected_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> refused_{0};
  std::thread thread_;
};

}  // namespace poseidon
