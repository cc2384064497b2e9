#include "poseidon/client/collectives.h"

#include <algorithm>
#include <cstring>

#include "poseidon/common/error.h"
#include "poseidon/common/ranks.h"
#include "poseidon/wire/messages.h"

namespace poseidon {

Collectives::Collectives(Van& van, const InformationBook& book, int rank, const StickyError& error,
                         std::function<void(std::exception_ptr)> fail, std::chrono::milliseconds timeout)
    : van_(van), book_(book), rank_(rank), error_(error), fail_(std::move(fail)), timeout_(timeout) {}

void Collectives::deliver(Message&& msg) {
  const auto key = std::make_pair(msg.header.type, wire::collectiveSequence(msg.header));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& box = mail_[key];
    if (box.size() >= static_cast<size_t>(book_.worldSize()) * 1024 * 1024) throw ProtocolError("mailbox full");
    box.push_back(std::move(msg));
  }
  cv_.notify_all();
}

void Collectives::wake() {
  { std::lock_guard<std::mutex> lock(mutex_); }
  cv_.notify_all();
}

std::vector<Message> Collectives::take(MsgType type, uint32_t sequence, size_t count, const char* what) {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto key = std::make_pair(type, sequence);
  bool ok = cv_.wait_for(lock, timeout_, [&] { return error_.failed() || mail_[key].size() >= count; });
  if (error_.failed()) {
    lock.unlock();
    error_.check();
  }
  if (!ok) {
    std::vector<bool> seen(book_.worldSize(), false);
    for (const auto& m : mail_[key]) seen[m.header.sender] = true;
    std::vector<int> missing;
    for (int r = 0; r < book_.worldSize(); ++r)
      if (!seen[r] && r != rank_) missing.push_back(r);
    lock.unlock();
    fail_(std::make_exception_ptr(TimeoutError(strCat("rank ", rank_, ": timed out after ", secondsText(timeout_),
                                                      " in ", what, " waiting for rank(s) ", formatRanks(missing)))));
    error_.check();
  }
  std::vector<Message> out = std::move(mail_[key]);
  mail_.erase(key);
  return out;
}

void Collectives::broadcast(int root, LayerBuffer buffer) {
  error_.check();
  if (root < 0 || root >= book_.worldSize()) throw InvalidArgument(strCat("broadcast root ", root, " out of range"));
  const uint32_t sequence = sequence_++;
  const int64_t chunk = std::max<int64_t>(1, book_.settings().pairBytes / static_cast<int64_t>(kFloatBytes));
  const int64_t total = buffer.size();
  const uint32_t chunks = static_cast<uint32_t>(std::max<int64_t>(1, (total + chunk - 1) / chunk));
  if (rank_ == root) {
    std::vector<Van::Part> parts;
    for (int r = 0; r < book_.worldSize(); ++r) {
      if (r == root) continue;
      for (uint32_t c = 0; c < chunks; ++c) {
        parts.clear();
        int64_t off = c * chunk, len = std::min(chunk, total - off);
        if (len > 0) {
          buffer.forEach(off, len, [&](float* p, int64_t n, int64_t) { parts.push_back({p, size_t(n) * kFloatBytes}); });
        }
        van_.send(r, wire::broadcastChunk({sequence, total, c, chunks}), parts);
      }
    }
    return;
  }
  std::vector<Message> msgs = take(MsgType::kBroadcast, sequence, chunks, "broadcast");
  std::vector<bool> seen(chunks, false);
  for (const Message& m : msgs) {
    const wire::BroadcastChunk c = wire::broadcastChunkOf(m.header);
    if (static_cast<int>(m.header.sender) != root || c.totalFloats != total || c.count != chunks) {
      throw Error(strCat("broadcast mismatch: rank ", m.header.sender, " sent ", c.totalFloats, " floats from root ",
                         root, ", rank ", rank_, " expects ", total, " from root ", root,
                         " (do all ranks build the same model?)"));
    }
    int64_t off = static_cast<int64_t>(c.index) * chunk, len = std::min(chunk, total - off);
    if (c.index >= seen.size() || seen[c.index] || (len > 0 && m.size() != size_t(len) * kFloatBytes)) {
      throw Error(strCat("broadcast chunk ", c.index, " from rank ", m.header.sender, " is malformed"));
    }
    seen[c.index] = true;
    if (len > 0) {
      buffer.forEach(off, len, [&](float* p, int64_t n, int64_t done) {
        std::memcpy(p, m.data() + done * kFloatBytes, static_cast<size_t>(n) * kFloatBytes);
      });
    }
  }
}

std::vector<double> Collectives::allSum(const std::vector<double>& mine) {
  static_assert(sizeof(double) == 2 * sizeof(float), "a double travels as two floats' bytes");
  std::vector<double> total(mine.size(), 0.0), buf(mine.size());
  for (int root = 0; root < book_.worldSize(); ++root) {
    if (root == rank_) buf = mine;
    broadcast(root, LayerBuffer::contiguous(reinterpret_cast<float*>(buf.data()), static_cast<int64_t>(2 * buf.size())));
    for (size_t i = 0; i < mine.size(); ++i) total[i] += buf[i];
  }
  return total;
}

void Collectives::barrier(bool throughOwnLoop, int64_t finishedAt) {
  error_.check();
  const uint32_t sequence = sequence_++;
  for (int r = 0; r < book_.worldSize(); ++r)
    if (r != rank_ || throughOwnLoop) van_.send(r, wire::barrier(sequence, finishedAt), {});
  std::vector<Message> msgs =
      take(MsgType::kBarrier, sequence, book_.worldSize() - (throughOwnLoop ? 0 : 1), "barrier");
  std::vector<bool> seen(book_.worldSize(), false);
  for (const Message& m : msgs) {
    if (seen[m.header.sender]) throw Error(strCat("barrier: rank ", m.header.sender, " arrived twice"));
    seen[m.header.sender] = true;
  }
}

}  // namespace poseidon
