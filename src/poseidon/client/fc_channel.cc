#include "poseidon/client/fc_channel.h"

#include <algorithm>
#include <cstring>

#include "poseidon/common/error.h"

namespace poseidon {

void FcChannel::deliverRequest(Request request) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const size_t fromSender = static_cast<size_t>(
        std::count_if(requests_.begin(), requests_.end(), [&](const Request& r) { return r.from == request.from; }));
    if (fromSender >= kMaxQueuedPerWorker || requests_.size() >= maxQueued_) {
      throw ProtocolError(strCat("fc-forward from rank ", request.from, " (round ", request.round, "): ", fromSender,
                                 " of its requests (", requests_.size(), " in all) already wait for the FC server"));
    }
    requests_.push_back(std::move(request));
  }
  cv_.notify_all();
}

bool FcChannel::nextRequest(Request* out, std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait_for(lock, wait, [&] { return error_.failed() || !requests_.empty(); });
  if (error_.failed()) {
    lock.unlock();
    error_.check();
  }
  if (requests_.empty()) return false;
  *out = std::move(requests_.front());
  requests_.pop_front();
  return true;
}

void FcChannel::expectReply(int64_t round) {
  std::lock_guard<std::mutex> lock(mutex_);
  expected_ = round;
  replied_ = false;
  reply_.clear();
}

void FcChannel::deliverReply(int64_t round, std::vector<uint8_t> payload) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (round != expected_ || replied_) {
      throw ProtocolError(strCat("fc-backward for round ", round, ", but ",
                                 expected_ < 0 || replied_ ? std::string("no request is outstanding")
                                                           : strCat("round ", expected_, "'s is awaited")));
    }
    reply_ = std::move(payload);
    replied_ = true;
  }
  cv_.notify_all();
}

bool FcChannel::waitReply(std::vector<uint8_t>* out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  bool ok = cv_.wait_for(lock, timeout, [&] { return error_.failed() || replied_; });
  if (error_.failed()) {
    lock.unlock();
    error_.check();
  }
  if (!ok) return false;
  *out = std::move(reply_);
  reply_.clear();
  expected_ = -1;
  replied_ = false;
  return true;
}

void FcChannel::wake() {
  { std::lock_guard<std::mutex> lock(mutex_); }
  cv_.notify_all();
}

namespace {

// Both payloads start with rows, cols (i64) and 8 bytes of scalars, so that the arrays after them
// are aligned (the payload's bytes start an operator-new allocation).
constexpr size_t kHead = 3 * sizeof(int64_t);

// rows and cols at the payload's start, checked: within bounds, and rows x (cols floats + extraPerRow
// bytes) exactly what follows the head.
void readDims(const std::vector<uint8_t>& payload, size_t extraPerRow, const char* what, int64_t* rows, int64_t* cols) {
  if (payload.size() < kHead) {
    throw ProtocolError(strCat(what, " of ", payload.size(), " bytes is shorter than its ", kHead, "-byte head"));
  }
  std::memcpy(rows, payload.data(), sizeof(int64_t));
  std::memcpy(cols, payload.data() + sizeof(int64_t), sizeof(int64_t));
  constexpr int64_t kLimit = int64_t{1} << 31;
  if (*rows < 0 || *cols < 0 || *rows > kLimit || *cols > kLimit) {
    throw ProtocolError(strCat(what, ": ", *rows, " x ", *cols, " is not a matrix size"));
  }
  const uint64_t need = static_cast<uint64_t>(*rows) * (static_cast<uint64_t>(*cols) * sizeof(float) + extraPerRow);
  if (need != payload.size() - kHead) {
    throw ProtocolError(strCat(what, ": ", *rows, " x ", *cols, " needs ", need,
                               " bytes after the head, the payload has ", payload.size() - kHead));
  }
}

std::vector<uint8_t> head(int64_t rows, int64_t cols, size_t body) {
  std::vector<uint8_t> out(kHead + body, 0);
  std::memcpy(out.data(), &rows, sizeof(int64_t));
  std::memcpy(out.data() + sizeof(int64_t), &cols, sizeof(int64_t));
  return out;
}

}  // namespace

std::vector<uint8_t> encodeFcForward(float lr, int64_t rows, int64_t cols, const float* activations,
                                     const int64_t* labels) {
  const size_t y = static_cast<size_t>(rows) * sizeof(int64_t), x = static_cast<size_t>(rows * cols) * sizeof(float);
  std::vector<uint8_t> out = head(rows, cols, y + x);
  std::memcpy(out.data() + 2 * sizeof(int64_t), &lr, sizeof(float));  // then 4 zero bytes
  if (y) std::memcpy(out.data() + kHead, labels, y);
  if (x) std::memcpy(out.data() + kHead + y, activations, x);
  return out;
}

FcForwardView decodeFcForward(const std::vector<uint8_t>& payload) {
  FcForwardView v;
  readDims(payload, sizeof(int64_t), "fc-forward", &v.rows, &v.cols);
  std::memcpy(&v.lr, payload.data() + 2 * sizeof(int64_t), sizeof(float));
  v.labels = reinterpret_cast<const int64_t*>(payload.data() + kHead);
  v.activations =
      reinterpret_cast<const float*>(payload.data() + kHead + static_cast<size_t>(v.rows) * sizeof(int64_t));
  return v;
}

std::vector<uint8_t> encodeFcBackward(double loss, int64_t rows, int64_t cols, const float* gradient) {
  const size_t x = static_cast<size_t>(rows * cols) * sizeof(float);
  std::vector<uint8_t> out = head(rows, cols, x);
  std::memcpy(out.data() + 2 * sizeof(int64_t), &loss, sizeof(double));
  if (x) std::memcpy(out.data() + kHead, gradient, x);
  return out;
}

FcBackwardView decodeFcBackward(const std::vector<uint8_t>& payload) {
  FcBackwardView v;
  readDims(payload, 0, "fc-backward", &v.rows, &v.cols);
  std::memcpy(&v.loss, payload.data() + 2 * sizeof(int64_t), sizeof(double));
  v.gradient = reinterpret_cast<const float*>(payload.data() + kHead);
  return v;
}

}  // namespace poseidon
