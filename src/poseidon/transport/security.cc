#include "poseidon/transport/security.h"

#include <sodium.h>
#include <zmq.h>

#include <vector>

#include "poseidon/common/error.h"
#include "poseidon/common/log.h"
#include "poseidon/transport/multipart.h"

namespace poseidon {

TransportSecurity parseTransportSecurity(const std::string& text, const std::string& what) {
  if (text == "curve") return TransportSecurity::kCurve;
  if (text == "none") return TransportSecurity::kNone;
  throw InvalidArgument(what + " must be curve or none, got '" + text + "'");
}

const char* transportSecurityName(TransportSecurity security) {
  return security == TransportSecurity::kNone ? "none" : "curve";
}
namespace {

// BLAKE2b-256 of (label, secret): a distinct 32-byte CURVE secret key per label.
std::string deriveSecretKey(const std::string& label, const std::string& secret) {
  unsigned char key[32];
  crypto_generichash_state st;
  crypto_generichash_init(&st, nullptr, 0, sizeof key);
  crypto_generichash_update(&st, reinterpret_cast<const unsigned char*>(label.data()), label.size());
  crypto_generichash_update(&st, reinterpret_cast<const unsigned char*>(secret.data()), secret.size());
  crypto_generichash_final(&st, key, sizeof key);
  char z85[41];
  zmq_z85_encode(z85, key, sizeof key);
  sodium_memzero(key, sizeof key);
  return std::string(z85, 40);
}

std::string publicOf(const std::string& secretZ85) {
  char pub[41];
  if (zmq_curve_public(pub, secretZ85.c_str()) != 0) throw Error("zmq_curve_public failed");
  return std::string(pub, 40);
}

}  // namespace

CurveKeys deriveCurveKeys(const std::string& secret) {
  if (secret.empty()) throw InvalidArgument("the job secret is empty");
  if (!zmq_has("curve")) throw Error("this libzmq was built without CURVE security; a job secret cannot be used");
  if (sodium_init() < 0) throw Error("libsodium failed to initialize");
  CurveKeys k;
  k.serverSecret = deriveSecretKey("poseidon/v1/server", secret);
  k.serverPublic = publicOf(k.serverSecret);
  k.clientSecret = deriveSecretKey("poseidon/v1/client", secret);
  k.clientPublic = publicOf(k.clientSecret);
  unsigned char bin[32];
  zmq_z85_decode(bin, k.clientPublic.c_str());
  k.clientPublicBinary.assign(reinterpret_cast<const char*>(bin), sizeof bin);
  return k;
}

std::string randomSecret() {
  if (sodium_init() < 0) throw Error("libsodium failed to initialize");
  unsigned char b[32];
  randombytes_buf(b, sizeof b);
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (unsigned char c : b) {
    s.push_back(hex[c >> 4]);
    s.push_back(hex[c & 15]);
  }
  return s;
}

void makeCurveServer(zmq::socket_t& socket, const CurveKeys& keys) {
  socket.set(zmq::sockopt::curve_server, 1);
  socket.set(zmq::sockopt::curve_secretkey, keys.serverSecret);
  socket.set(zmq::sockopt::zap_domain, "poseidon");
}

void makeCurveClient(zmq::socket_t& socket, const CurveKeys& keys) {
  socket.set(zmq::sockopt::curve_serverkey, keys.serverPublic);
  socket.set(zmq::sockopt::curve_publickey, keys.clientPublic);
  socket.set(zmq::sockopt::curve_secretkey, keys.clientSecret);
}

namespace {
std::atomic<uint64_t> gMonitorId{0};
}  // namespace

HandshakeMonitor::HandshakeMonitor(zmq::context_t& ctx, zmq::socket_t& watched, std::string endpoint)
    : watched_(&watched), pair_(ctx, zmq::socket_type::pair), endpoint_(std::move(endpoint)) {
  std::string address = "inproc://poseidon-handshake-monitor-" + std::to_string(gMonitorId.fetch_add(1));
  if (zmq_socket_monitor(watched.handle(), address.c_str(),
                         ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL) != 0) {
    throw IoError("cannot monitor the socket on " + endpoint_);
  }
  pair_.set(zmq::sockopt::linger, 0);
  pair_.connect(address);
}

namespace {
std::atomic<uint64_t> gRefusedNonMembers{0};

// The 1st, 10th, 100th... refusal is logged: a peer with the wrong secret retries every few hundred
// milliseconds, and one line per try buried everything else (75 lines in a 30 s rendezvous).
bool logRefusal(uint64_t n) {
  uint64_t k = n + 1;
  while (k % 10 == 0) k /= 10;
  return k == 1;
}
}  // namespace

uint64_t refusedNonMembers() { return gRefusedNonMembers.load(); }

HandshakeMonitor::~HandshakeMonitor() { stop(); }

void HandshakeMonitor::stop() {
  if (stopped_) return;
  stopped_ = true;
  zmq_socket_monitor(watched_->handle(), nullptr, 0);
  pair_.close();
}

void HandshakeMonitor::onReadable() {
  for (;;) {
    zmq::message_t event, address;
    if (!pair_.recv(event, zmq::recv_flags::dontwait)) return;
    if (event.more()) (void)pair_.recv(address, zmq::recv_flags::dontwait);
    uint64_t n = refused_.fetch_add(1);
    gRefusedNonMembers.fetch_add(1);
    if (logRefusal(n)) {
      POSEIDON_LOG(kWarning) << "refused a connection on " << endpoint_
                             << ": its handshake failed (it did not present this job's CURVE keys; " << n + 1
                             << " refused so far)";
    }
  }
}

ZapAuthenticator::ZapAuthenticator(zmq::context_t& ctx, const CurveKeys& keys)
    : socket_(ctx, zmq::socket_type::rep), expected_(keys.clientPublicBinary) {
  socket_.set(zmq::sockopt::linger, 0);
  try {
    socket_.bind("inproc://zeromq.zap.01");
  } catch (const zmq::error_t& e) {
    throw IoError(std::string("cannot start the ZAP authenticator: ") + e.what());
  }
  thread_ = std::thread([this] { run(); });
}

ZapAuthenticator::~ZapAuthenticator() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void ZapAuthenticator::run() {
  while (!stop_) {
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    try {
      zmq::poll(&item, 1, std::chrono::milliseconds(100));
    } catch (const zmq::error_t&) {
      return;  // the context is going away
    }
    if (!(item.revents & ZMQ_POLLIN)) continue;
    std::vector<zmq::message_t> parts = recvMultipart(socket_, 16);
    // version, request id, domain, address, identity, mechanism, credentials...
    bool ok = parts.size() >= 7 && parts[5].to_string() == "CURVE" && parts[6].to_string() == expected_;
    std::string address = parts.size() > 3 ? parts[3].to_string() : "?";
    if (!ok) {
      uint64_t n = refused_.fetch_add(1);
      gRefusedNonMembers.fetch_add(1);
      if (logRefusal(n)) {
        POSEIDON_LOG(kWarning) << "refused connection from " << address
                               << ": not a member of this job (wrong or no job secret; " << n + 1 << " refused so far)";
      }
    }
    std::string requestId = parts.size() > 1 ? parts[1].to_string() : "";
    socket_.send(zmq::str_buffer("1.0"), zmq::send_flags::sndmore);
    socket_.send(zmq::buffer(requestId), zmq::send_flags::sndmore);
    socket_.send(ok ? zmq::str_buffer("200") : zmq::str_buffer("400"), zmq::send_flags::sndmore);
    socket_.send(ok ? zmq::str_buffer("OK") : zmq::str_buffer("not a member of this job"), zmq::send_flags::sndmore);
    socket_.send(zmq::str_buffer(""), zmq::send_flags::sndmore);
    socket_.send(zmq::str_buffer(""), zmq::send_flags::none);
  }
}

}  // namespace poseidon
