#include "poseidon/torch/fc_server.h"

#include <algorithm>
#include <chrono>

#include "poseidon/common/error.h"
#include "poseidon/common/log.h"
#include "poseidon/torch/compat.h"

namespace poseidon::pt {

namespace {
// As the shards' bound on a push's learning rate (kvstore/model_shard.h).
constexpr float kMaxLearningRate = 1e6f;
}  // namespace

FcServer::FcServer(Node& node, std::function<torch::Tensor(torch::Tensor)> classifier,
                   std::vector<torch::Tensor> params, double momentum, double weightDecay,
                   const std::vector<torch::Tensor>& momentumBuffers)
    : node_(node), classifier_(std::move(classifier)), params_(std::move(params)), groupSize_(node.book().groupSize()) {
  optimizer_ = std::make_unique<torch::optim::SGD>(
      params_, torch::optim::SGDOptions(0.1).momentum(momentum).weight_decay(weightDecay));
  if (!momentumBuffers.empty()) {
    POSEIDON_ENFORCE_EQ(momentumBuffers.size(), params_.size(), "momentum buffers for the FC server's parameters");
    std::vector<torch::Tensor> own;
    for (const auto& b : momentumBuffers) own.push_back(b.clone());
    setSgdMomentumBuffers(*optimizer_, own);
  }
  // A new thread's OpenMP team defaults to every core; the rank's own count (--threads, set on the
  // thread that builds the server) keeps ranks that share a host from oversubscribing it (its BLAS,
  // OpenBLAS's OpenMP build, and ATen's parallel loops use that team).
  const int threads = torch::get_num_threads();
  thread_ = std::thread([this, threads] {
    torch::set_num_threads(threads);
    loop();
  });
}

FcServer::~FcServer() { stop(); }

void FcServer::stop(bool abandon) {
  if (abandon) abandon_ = true;
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void FcServer::withModel(const std::function<void()>& fn) {
  std::lock_guard<std::mutex> lock(modelMutex_);
  fn();
}

std::vector<torch::Tensor> FcServer::momentumBuffers() {
  std::lock_guard<std::mutex> lock(modelMutex_);
  std::vector<torch::Tensor> out = sgdMomentumBuffers(*optimizer_);
  for (auto& b : out) b = b.clone();  // the server goes on updating its own
  return out;
}

double FcServer::busySeconds() const { return static_cast<double>(busyMicros_.load()) / 1e6; }

void FcServer::loop() {
  const InformationBook& book = node_.book();
  try {
    while (!stop_) {
      FcChannel::Request r;
      if (!node_.fc().nextRequest(&r, std::chrono::milliseconds(50))) continue;
      const int worker = book.workerIndex(r.from);
      if (worker < 0) throw ProtocolError(strCat("fc-forward from rank ", r.from, ", which is not a worker"));
      const int group = book.groupOf(worker);
      // A group's rounds are served in order, and a worker has one request out at a time.
      auto served = lastServed_.find(group);
      if (served != lastServed_.end() && r.round <= served->second) {
        throw ProtocolError(strCat("rank ", r.from, " sent round ", r.round,
                                   "'s fc-forward, but its group was already "
                                   "served round ",
                                   served->second));
      }
      for (const auto& [key, waiting] : pending_) {
        for (const auto& m : waiting) {
          if (m.from == r.from) {
            throw ProtocolError(strCat("rank ", r.from, " sent round ", r.round, "'s fc-forward while its round ",
                                       m.round, "'s is still waiting"));
          }
        }
      }
      auto key = std::make_pair(group, r.round);
      auto& members = pending_[key];
      members.push_back(std::move(r));
      if (static_cast<int>(members.size()) < groupSize_) continue;
      serve(members);
      lastServed_[group] = key.second;
      pending_.erase(key);
    }
    if (!pending_.empty() && !abandon_) {
      const auto& [key, waiting] = *pending_.begin();
      throw Error(strCat("stopped with round ", key.second, " of group ", key.first, " unserved (", waiting.size(),
                         " of ", groupSize_, " members in)"));
    }
  } catch (const std::exception& e) {
    // Every rank stops with the FC server's reason (a worker waiting on it wakes with it).
    node_.failJob(std::make_exception_ptr(Error(strCat("rank ", node_.rank(), ": the FC server failed: ", e.what()))));
  }
}

void FcServer::serve(std::vector<FcChannel::Request>& members) {
  const auto start = std::chrono::steady_clock::now();
  // Member order (by rank), so that the group's batch is the same whatever the arrival order.
  std::sort(members.begin(), members.end(), [](const auto& a, const auto& b) { return a.from < b.from; });
  std::vector<torch::Tensor> xs, ys;
  std::vector<int64_t> rows;
  float lr = 0;
  int64_t cols = -1;
  for (const auto& m : members) {
    FcForwardView v = decodeFcForward(m.payload);
    if (cols >= 0 && v.cols != cols) {
      throw ProtocolError(strCat("round ", m.round, ": rank ", m.from, " sent ", v.cols, " features per row, rank ",
                                 members[0].from, " sent ", cols, " (do all ranks build the same model?)"));
    }
    if (v.rows < 1) throw ProtocolError(strCat("round ", m.round, ": rank ", m.from, " sent no rows"));
    if (!(v.lr >= 0 && v.lr <= kMaxLearningRate)) {  // 0: a warm-up's first rounds, as the shards allow
      throw ProtocolError(strCat("round ", m.round, ": rank ", m.from, " sent learning rate ", v.lr));
    }
    if (cols >= 0 && v.lr != lr) {
      throw ProtocolError(strCat("round ", m.round, ": rank ", m.from, " sent learning rate ", v.lr, ", rank ",
                                 members[0].from, " sent ", lr));
    }
    cols = v.cols;
    lr = v.lr;
    rows.push_back(v.rows);
    xs.push_back(torch::from_blob(const_cast<float*>(v.activations), {v.rows, v.cols}, torch::kFloat32));
    ys.push_back(torch::from_blob(const_cast<int64_t*>(v.labels), {v.rows}, torch::kLong));
  }
  std::vector<std::vector<uint8_t>> replies;
  {
    std::lock_guard<std::mutex> lock(modelMutex_);
    // One forward over the group's rows, on the classifier's device (the rows came over the network
    // into host memory); the loss is the mean of the members' mean losses.
    const c10::Device device = params_.at(0).device();
    torch::Tensor x = torch::cat(xs).to(device).requires_grad_(true);
    torch::Tensor y = torch::cat(ys).to(device);
    torch::Tensor out = classifier_(x);
    const int64_t low = y.min().item<int64_t>(), high = y.max().item<int64_t>();
    if (low < 0 || high >= out.size(1)) {
      throw ProtocolError(
          strCat("round ", members[0].round, ": a label outside [0, ", out.size(1), ") (", low, " .. ", high, ")"));
    }
    torch::Tensor perSample = torch::nll_loss(torch::log_softmax(out, 1), y, {}, at::Reduction::None);
    std::vector<torch::Tensor> memberLoss;
    int64_t offset = 0;
    for (int64_t n : rows) {
      memberLoss.push_back(perSample.narrow(0, offset, n).mean());
      offset += n;
    }
    const double k = static_cast<double>(members.size());
    torch::Tensor loss = torch::stack(memberLoss).sum() / k;
    optimizer_->zero_grad();
    loss.backward();
    for (auto& group : optimizer_->param_groups()) static_cast<torch::optim::SGDOptions&>(group.options()).lr(lr);
    optimizer_->step();
    // d(member's mean loss)/d(its rows) = k x d(loss)/d(its rows).
    torch::Tensor grad = (x.grad() * k).to(torch::kCPU).contiguous();
    offset = 0;
    for (size_t i = 0; i < members.size(); ++i) {
      torch::Tensor g = grad.narrow(0, offset, rows[i]).contiguous();
      offset += rows[i];
      replies.push_back(encodeFcBackward(memberLoss[i].item<double>(), rows[i], cols, g.data_ptr<float>()));
    }
  }
  ++updates_;
  busyMicros_ +=
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start).count();
  for (size_t i = 0; i < members.size(); ++i) node_.fc().sendReply(members[i].from, members[i].round, replies[i]);
}

}  // namespace poseidon::pt
