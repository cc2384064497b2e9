// CURVE's encryption charged at full width: the emulated-cluster bench's lanes
// (bench/device.h) applied to the messages of one Van. A Van makes one only
// when VanOptions::charger charges encryption; production never does.
//
// ZeroMQ's I/O threads encrypt and decrypt while the caller and the receive
// loop go on. A message sent is held here until its I/O thread is done
// encrypting it, then handed over (the HandOver callback: the Van's own send);
// one received is held until it is decrypted, while the receive loop takes
// other connections' messages. Each connection stays FIFO: its messages share
// a lane, whose end times only grow. The connection numbers interleave a
// node's DEALER to each peer (2 x peer) and its ROUTER's connection from it
// (2 x peer + 1), as libzmq spreads connections over its I/O threads. A peer's urgent connection
// (VanOptions::urgentLayers) shares its bulk connection's lane: conservative, as libzmq would give
// it an I/O thread of its own choosing.
//
// Threads: encrypt() and stop() from any thread; one encrypter thread hands
// messages over; decrypt() and takeDecrypted() from the receive loop only.
// mutex_ is a leaf but for the hand-over, which runs without it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "poseidon/common/work_charger.h"
#include "poseidon/transport/message.h"
#include "poseidon/wire/frame.h"

namespace poseidon {

class ChargedCrypto {
 public:
  using Clock = std::chrono::steady_clock;
  // Hands a built message to the links. May throw: the error is kept, and every later encrypt() throws it.
  using HandOver = std::function<void(int dest, const FrameHeader& header, zmq::message_t head, zmq::message_t body)>;

  // Starts the encrypter thread. `charger` must charge encryption and outlive this.
  ChargedCrypto(WorkCharger& charger, HandOver handOver);
  ~ChargedCrypto();
  ChargedCrypto(const ChargedCrypto&) = delete;
  ChargedCrypto& operator=(const ChargedCrypto&) = delete;

  // Puts the message on its outbound connection's lane and returns at once; it is handed over
  // when its I/O thread is done with it. Throws IoError once stopped or after a hand-over failed.
  void encrypt(int dest, const FrameHeader& header, zmq::message_t head, zmq::message_t body);
  // Hands over what is still being encrypted at once, in order, and joins the thread. Idempotent.
  void stop();

  // Receive loop: a whole message arrived; it is delivered once its inbound connection's I/O
  // thread has decrypted it.
  void decrypt(Message message);
  // Receive loop: the first decrypted message, if its time has come (true). Otherwise false, and
  // *next says when the first one will be (Clock::time_point::max() when none is held).
  bool takeDecrypted(Clock::time_point now, Message* out, Clock::time_point* next);

 private:
  struct Held {
    Clock::time_point at;  // when its I/O thread is done with it
    uint64_t seq = 0;
    int dest = -1;  // outbound only
    FrameHeader header;
    zmq::message_t head, body;  // outbound only
    Message message;            // inbound only
    bool operator>(const Held& o) const { return at != o.at ? at > o.at : seq > o.seq; }
  };
  void encryptLoop();

  WorkCharger& charger_;
  HandOver handOver_;
  std::mutex mutex_;  // guards encrypting_, encryptSeq_, stop_, error_
  std::condition_variable cv_;
  std::vector<Held> encrypting_;  // a min-heap by (at, seq)
  uint64_t encryptSeq_ = 0;
  bool stop_ = false;
  std::string error_;
  std::mutex joinMutex_;
  std::thread encrypter_;
  std::vector<Held> decrypting_;  // a min-heap by (at, seq); receive loop only
  uint64_t decryptSeq_ = 0;
};

}  // namespace poseidon
