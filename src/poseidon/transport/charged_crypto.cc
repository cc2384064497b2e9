#include "poseidon/transport/charged_crypto.h"

#include <algorithm>
#include <functional>
#include <utility>

#include "poseidon/common/error.h"
#include "poseidon/common/log.h"

namespace poseidon {
namespace {
// The connection numbers of the charger's lanes (see the header).
int outboundConnection(int peer) { return 2 * peer; }
int inboundConnection(uint32_t peer) { return 2 * static_cast<int>(peer) + 1; }
}  // namespace

ChargedCrypto::ChargedCrypto(WorkCharger& charger, HandOver handOver)
    : charger_(charger), handOver_(std::move(handOver)) {
  encrypter_ = std::thread([this] { encryptLoop(); });
}

ChargedCrypto::~ChargedCrypto() { stop(); }

void ChargedCrypto::encrypt(int dest, const FrameHeader& header, zmq::message_t head, zmq::message_t body) {
  // Admitted before mutex_ is taken: the charger's own lock is never taken under ours.
  const auto at = charger_.admitCrypto(static_cast<double>(head.size() + body.size()), outboundConnection(dest));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stop_) throw IoError("transport closed");
    if (!error_.empty()) throw IoError(error_);
    Held m;
    m.at = at;
    m.seq = encryptSeq_++;
    m.dest = dest;
    m.header = header;
    m.head = std::move(head);
    m.body = std::move(body);
    encrypting_.push_back(std::move(m));
    std::push_heap(encrypting_.begin(), encrypting_.end(), std::greater<>());
  }
  cv_.notify_one();
}

void ChargedCrypto::encryptLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    if (encrypting_.empty()) {
      if (stop_) return;
      cv_.wait(lock);
      continue;
    }
    // Stopping: what is left goes now, in order, within the Van's close() linger (not at its modelled time).
    const auto at = encrypting_.front().at;
    if (!stop_ && Clock::now() < at) {
      cv_.wait_until(lock, at);
      continue;
    }
    std::pop_heap(encrypting_.begin(), encrypting_.end(), std::greater<>());
    Held m = std::move(encrypting_.back());
    encrypting_.pop_back();
    lock.unlock();
    try {
      handOver_(m.dest, m.header, std::move(m.head), std::move(m.body));
    } catch (const std::exception& e) {
      lock.lock();
      if (error_.empty()) error_ = e.what();  // every later encrypt() throws it
      POSEIDON_LOG(kError) << e.what();
      continue;
    }
    lock.lock();
  }
}

void ChargedCrypto::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  std::lock_guard<std::mutex> join(joinMutex_);
  if (encrypter_.joinable()) encrypter_.join();
}

void ChargedCrypto::decrypt(Message message) {
  auto at = charger_.admitCrypto(static_cast<double>(kHeaderBytes + message.header.payloadBytes),
                                 inboundConnection(message.header.sender));
  if (at == Clock::time_point::min()) at = Clock::now();  // not charged: due at once, after those before it
  Held m;
  m.at = at;
  m.seq = decryptSeq_++;
  m.message = std::move(message);
  decrypting_.push_back(std::move(m));
  std::push_heap(decrypting_.begin(), decrypting_.end(), std::greater<>());
}

bool ChargedCrypto::takeDecrypted(Clock::time_point now, Message* out, Clock::time_point* next) {
  if (decrypting_.empty()) {
    *next = Clock::time_point::max();
    return false;
  }
  *next = decrypting_.front().at;
  if (*next > now) return false;
  std::pop_heap(decrypting_.begin(), decrypting_.end(), std::greater<>());
  *out = std::move(decrypting_.back().message);
  decrypting_.pop_back();
  return true;
}

}  // namespace poseidon
