// Van: Poseidon's ZeroMQ transport (the name is ps-lite's).
//
// Each node binds one ROUTER socket (its data endpoint) and opens one DEALER
// per peer, connected to that peer's ROUTER. Messages are [header][payload]
// (see wire/frame.h). Messages to oneself go through an in-process loopback
// socket, so the receive loop sees one stream and a colocated worker/server
// pair costs no network bytes.
//
// The Van stamps every outgoing header with this node's rank (`sender`) and
// the job id, and drops (counts and logs) inbound frames of another job or
// from a rank outside the world, so nothing above it handles those.
//
// Threads: send() may be called from any thread (each DEALER has its own
// mutex; ZeroMQ sockets are not thread-safe). poll() must be called from one
// thread only, the owner's receive loop. High-water marks are unlimited, so
// send() never blocks and never drops. A peer's mutex is the innermost lock
// of the runtime: nothing is locked while one is held.
//
// Priority scheduling (VanOptions::sendWindowBytes > 0; docs/scheduling.md):
// send() queues the message in the PriorityScheduler (transport/scheduler.h)
// instead, whose sender thread, the only user of the DEALERs then, hands ZeroMQ
// the most urgent queued message whose peer can take one: control first, then
// data of an earlier iteration, then of a lower layer (the next forward pass
// needs layer 0 first), FIFO within a layer. Each connection holds one message
// in ZeroMQ's pipe (its encoder may hold one more) and its send buffer in the
// kernel (sendWindowBytes, more past 8 peers: peersPerSendWindow; Linux
// doubles it), so a late, urgent pair waits behind little; a
// message larger than the window goes as fragments of the window's size (a
// third frame says which message and where; the Van's Reassembler,
// transport/fragments.h, puts them together), so an urgent one can pass
// between them (P3's slicing). Only messages of different layers or
// iterations (or control) are reordered; the BSP protocol never orders them
// across layers. Not for compute-group jobs (their pulls and pushes are
// ordered across layers): Node refuses the combination.
//
// The parts: this class is the socket transport and the frames' validation;
// the scheduler and the reassembler are the two halves of priority
// scheduling; ChargedCrypto (bench only) the charged encryption lanes.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "poseidon/common/work_charger.h"
#include "poseidon/model/layer.h"
#include "poseidon/transport/charged_crypto.h"
#include "poseidon/transport/counters.h"
#include "poseidon/transport/egress_queue.h"
#include "poseidon/transport/fragments.h"
#include "poseidon/transport/message.h"
#include "poseidon/transport/scheduler.h"
#include "poseidon/transport/security.h"
#include "poseidon/wire/frame.h"

namespace poseidon {

struct VanOptions {
  std::string bindHost = "127.0.0.1";  // interface to bind; never 0.0.0.0 by default
  int port = 0;                        // 0 picks a free port
  uint64_t maxPayloadBytes = kDefaultMaxPayloadBytes;
  int lingerMs = 2000;  // how long close() waits to flush queued messages
  const CurveKeys* curve = nullptr;  // job membership (CURVE); null: no security
  // TCP receive buffer of every connection into this node's data endpoint, in bytes. It caps each
  // sender's window, so P - 1 peers that send at once put at most (P - 1) x this into the switch
  // port's queue: the classic cure for incast drops (docs/bench.md: 16 KB at 32 emulated nodes cut
  // TCP retransmits from ~46,000 to ~3,000 and the iteration from 2.3-2.9 s to 1.65-1.75 s), and
  // what shortens the last replies' wait in the receivers' ports at the end of an overlapped
  // forward (docs/scheduling.md, "The receive window").
  // 0 (the default): automatic - with priority links (a send window) the send window and a third
  // up to kReceiveManyPeers peers and seven eighths of it past them, on any egress queue
  // (kernelReceiveBuffer), with FIFO links the OS's autotuned buffer. kOsReceiveBuffer: the
  // OS's buffer always. > 0: this many bytes.
  int receiveBufferBytes = 0;
  static constexpr int kOsReceiveBuffer = -1;
  // The job's ranks, when known before the van binds (Node sets it; 0: not known, taken as few). The
  // automatic receive buffer depends on how many peers send into this endpoint, and accepted
  // connections take the buffer the endpoint had when it bound, before connectPeers knows them.
  int worldSize = 0;
  // > 0: priority scheduling (above) with this kernel send buffer per connection (SO_SNDBUF; past
  // peersPerSendWindow peers more, below), and fragments of this size. 0: FIFO, the OS's autotuned
  // buffers. kAutoSendWindow: the runtime's default for this job's size and queue (worldSize and
  // egressQueue; Van::defaultSendWindow), which the van takes when constructed.
  int sendWindowBytes = 0;
  static constexpr int kAutoSendWindow = -1;
  // With a send window: each connection's SO_SNDBUF is a window for every this many peers, at least
  // one window: sendWindowBytes x max(1, (P - 1) / peersPerSendWindow); fragments keep the window's
  // size. Why: a connection sends at most its send buffer per round trip, and at 32 emulated nodes
  // one window, or the share of 16 windows the runtime gave before (4.7 KB, less than the 12 KB its
  // peer's receive window lets in flight), starved the connections: vgg19 @30 went from 1.33 s an
  // iteration (the share) and 1.31 (a window) to 1.25-1.27 (3.9 windows), flat from there to 23
  // windows; at 8 nodes resnet-152 needs the single window (0.68 s; two windows 0.72, four 0.80),
  // and 16 nodes are the same either way (docs/scheduling.md, "The connection's send buffer").
  // 0: one window each, whatever the number of peers.
  int peersPerSendWindow = kDefaultPeersPerSendWindow;
  static constexpr int kDefaultPeersPerSendWindow = 8;
  // > 0 (with a send window): the round data of layers [0, urgentLayers) - the next forward's first
  // layers - go to each peer on a second connection whose packets are marked IP TOS low-delay
  // (kUrgentTos). There they wait behind no byte of the bulk connection (its ZeroMQ pipe, encoder
  // and kernel send buffer), and a host queue that honours TOS (Linux's pfifo_fast and sch_fq
  // bands; `bench --host-queue tos`) sends them first. With urgent layers possible (not 0) the van's
  // accepted connections are marked too, so the ACKs it returns for them are not held behind bulk
  // bytes. docs/scheduling.md, "The urgent connection".
  // 0: none. kAutoUrgentLayers (the default), with a send window: past kAutoBelowFcPeers peers,
  // every layer below the model's FC stack (ModelDesc::layersBelowFcBulk) where the node is told its
  // egress queue is two-band (egressQueue kTos, below); otherwise past kAutoUrgentPeers peers
  // kAutoUrgentLayerCount; with fewer none (Van::urgentLayerCount). Why there: with the connections'
  // send buffers grown for many peers, vgg19 @30 at 32 nodes went from 1.25 s an iteration to 1.19
  // (3 layers, FIFO host queue), at 16 nodes it took 2-3% off, and at 8 nodes resnet-152 was the same
  // either way; each connection doubles a node's sockets and descriptors, so it is not spent where it
  // buys nothing. On a queue that takes turns more layers only make a second bulk connection (8
  // layers: 1.296 s against 1.224 for 3 at 32 nodes). On one that serves the mark first, vgg19's 16
  // conv layers measured 1.046 s at 32 nodes against 1.241 for 3, but 0.972-0.982 at 16 nodes against
  // 0.957-0.959 for 3 (bench/results/urgent-auto/); the planner puts the crossing at 17 peers. That
  // queue is the bench's HTB bands; on pfifo_fast under the bench's shaper (tbf > pfifo_fast, which the
  // probe reads) the 16 layers measured 1.59-1.63 s at 32 nodes against 1.17 for 3, with loss and
  // timeouts (bench/results/pfifo-fast/). That is pfifo_fast as a child qdisc: the same strict bands
  // with pfifo leaves of its packet limit ran them in 1.09-1.11 s against 1.17-1.19 for 3
  // (bench/results/pfifo-fast/leaf/). A NIC's root pfifo_fast cannot be measured here, and a wrong 16
  // cost 36-68% where a wrong 3 costs 5-9%, so reading pfifo_fast does not take them: only kTos does.
  int urgentLayers = kAutoUrgentLayers;
  static constexpr int kAutoUrgentLayers = -1;
  static constexpr int kAutoUrgentPeers = 8, kAutoUrgentLayerCount = 3, kAutoBelowFcPeers = 16;
  // The automatic rule's version, which the bench records (urgent_rule) for plan --check: 1 before
  // 2026-12-03 (3 past 8 peers, whatever the queue), 2 a trial build of that day (the layers below
  // the FC stack past 8 peers), 3 the same day's rule past 16 peers on a queue read or told to serve
  // the mark first, 4 this one: past 16 peers only where told (kTos).
  static constexpr int kAutoUrgentRule = 4;
  // What the node's egress queue does with the mark, for the automatic rule above: kTos says it is
  // two-band, as the bench's HTB bands (train --host-queue tos), and takes the layers below the FC
  // stack past 16 peers; kFifo and kAuto do not. kAuto reads the queue (probeEgressQueue) only to say
  // in rank 0's log what it is: a pfifo_fast there serves the mark first too, but the layers below
  // the FC stack are not measured on a NIC's own (above).
  EgressQueue egressQueue = EgressQueue::kAuto;
  // The bench's charge for CURVE's encryption on ZeroMQ's I/O threads (common/work_charger.h).
  // Null, as in production: nothing charged. Not owned; must outlive the van.
  WorkCharger* charger = nullptr;
};

class Van {
 public:
  // The smallest send window (VanOptions::sendWindowBytes): smaller ones cut messages into too many fragments.
  static constexpr int kMinSendWindow = 4096;
  // The send window to take where none is chosen (the bench's priority-scheduled systems, the planner,
  // train --send-window -1), at full width, for `peers` peers on a node told (`lowDelayFirst`) whether
  // its egress queue is two-band (VanOptions::egressQueue kTos):
  // - kDefaultSendWindow, 1 MB (half a KV pair), wherever the queue is FIFO or the peers few;
  // - past kReceiveManyPeers peers on two-band nodes, kTwoBandSendWindow, 256 KB. There the
  //   urgent connection passes the bulk bytes in the node's queue, but not in the switch port toward
  //   its receiver, where 31 senders' windows wait ahead of it: vgg19 @3 Gbit/s, 32 nodes, 6 urgent
  //   layers, measured 1.046 s an iteration (1.034-1.055, 1.09-1.12x its own bound) against 1.114
  //   (1.21-1.22x) with 1 MB, no drops at the nodes against 3,200-3,900 a run (2 cores at time
  //   dilation 32, 71-73% host CPU; bench/results/device-scale/window/); the planner says 1.046 and
  //   1.127. At 16 nodes the planner has the two within 0.3% (0.967 s and 0.964).
  // `rule` says which version of this rule (kSendWindowRule; the bench records it, plan --check reads
  // it): 1, 1 MB everywhere (before 2026-12-06); 2, this one.
  static int defaultSendWindow(size_t peers, bool lowDelayFirst, int rule = kSendWindowRule);
  // The window a van with `options` runs: sendWindowBytes, or for kAutoSendWindow the default above
  // for worldSize - 1 peers (0, not known: few) and egressQueue.
  static int sendWindowFor(const VanOptions& options);
  static constexpr int kDefaultSendWindow = 1 << 20, kTwoBandSendWindow = 256 << 10;
  static constexpr int kSendWindowRule = 2;
  // The SO_SNDBUF each connection gets with `peers` peers (VanOptions::peersPerSendWindow); 0 without
  // a send window (FIFO links: the OS's autotuned buffers).
  static int kernelSendWindow(const VanOptions& options, size_t peers);
  // The urgent layers a van with `peers` peers uses: VanOptions::urgentLayers, or its automatic rule
  // resolved with `lowDelayFirst` (whether the node is told its egress queue is two-band) and
  // `belowFcBulk` (the job model's ModelDesc::layersBelowFcBulk).
  static int urgentLayerCount(const VanOptions& options, size_t peers, bool lowDelayFirst = false, int belowFcBulk = 0);
  // The SO_RCVBUF the data endpoint asks for (VanOptions::receiveBufferBytes); 0: the OS's autotuned
  // buffer. Automatic with priority links:
  // - up to kReceiveManyPeers peers, sendWindowBytes x kReceivePerSendWindow (4/3), which on
  //   resnet-152 at 30 Mbit/s, 8 nodes, 9.2 KB windows measured 1.23x DDP-fp16 against 1.18x with
  //   the OS's buffer, 1.19-1.21x with 16 KB, and HOST-BOUND at 8 KB (bench/results/resnet152_tail/);
  // - past them, sendWindowBytes x kManyPeersReceivePerSendWindow (7/8): with P - 1 senders each
  //   window's bytes wait in the receiver's switch port and the senders' FIFO egress queues, ahead of
  //   the next forward's first layers. vgg19 at 16 nodes, 30 Mbit/s, 9.2 KB windows: 8,064 bytes
  //   0.980-0.986 s an iteration, 12 KB 0.999-1.003 (bench/results/rcvwin/, docs/scheduling.md).
  //   Also where the node is told its egress queue is two-band (VanOptions::egressQueue kTos; until
  //   2026-12-04 those kept the window and a third, from 2-core runs at time dilation F = 6, 1.044 s
  //   against 1.059): on a 16-core machine at F = 1, 32 nodes with two-band queues ran 1.151 s with
  //   8,064 bytes against 1.256 with 12,288, whose runs dropped ~9,000 packets at the nodes' queues
  //   and took ~500 retransmission timeouts each (bench/results/device-scale/).
  static int kernelReceiveBuffer(const VanOptions& options);
  static constexpr int kReceivePerSendWindowNum = 4, kReceivePerSendWindowDen = 3;
  static constexpr int kManyPeersReceivePerSendWindowNum = 7, kManyPeersReceivePerSendWindowDen = 8;
  static constexpr int kReceiveManyPeers = 8;
  // IP TOS of the urgent connections: IPTOS_LOWDELAY, which Linux maps to TC_PRIO_INTERACTIVE (band 0).
  static constexpr int kUrgentTos = 0x10;
  // Why a data endpoint cannot be bound on `host` (an address or interface of this machine, as
  // VanOptions::bindHost), found by binding one to a free port and closing it; empty when it can.
  // For a launcher to say so once before its ranks each fail to.
  static std::string bindHostError(const std::string& host);
  Van(zmq::context_t& ctx, const VanOptions& options);
  ~Van();
  Van(const Van&) = delete;
  Van& operator=(const Van&) = delete;

  // "tcp://host:port" actually bound.
  const std::string& endpoint() const { return endpoint_; }
  // The data endpoint's SO_RCVBUF request as the socket reports it (-1: the OS default).
  int receiveBufferBytes() { return router_.get(zmq::sockopt::rcvbuf); }
  // The SO_SNDBUF request of the connection to `rank` (-1: the OS default; after connectPeers).
  int sendBufferBytes(int rank);

  // Sets this node's rank, the job id and the peer endpoints (index = rank).
  // Connects a DEALER to every other rank. Call once, before any send() or
  // poll().
  // `model`: the job's, for the automatic urgent layers (VanOptions::urgentLayers); null: none known,
  // the fixed count.
  void connectPeers(int selfRank, const std::vector<std::string>& endpoints, uint64_t job,
                    const ModelDesc* model = nullptr);
  int rank() const { return rank_; }
  int worldSize() const { return static_cast<int>(peers_.size()); }

  // Thread-safe. Build `header` with wire/messages.h; sender, job and
  // payloadBytes are filled in here. The payload is the concatenation of the
  // given parts (so U and V factors go out as one frame without an extra copy
  // on our side). Throws IoError once the van is closed.
  struct Part {
    const void* data;
    size_t bytes;
  };
  void send(int dest, FrameHeader header, const Part* parts, size_t numParts);
  void send(int dest, const FrameHeader& header, std::initializer_list<Part> parts) {
    send(dest, header, parts.begin(), parts.size());
  }
  void send(int dest, const FrameHeader& header, const std::vector<Part>& parts) {
    send(dest, header, parts.data(), parts.size());
  }
  void send(int dest, const FrameHeader& header, const void* payload, size_t bytes) {
    Part p{payload, bytes};
    send(dest, header, &p, 1);
  }

  // Receive thread only. Waits up to timeoutMs for one valid message. Frames
  // that fail header validation, belong to another job or name a sender
  // outside the world are logged with the peer address, counted in
  // rejectedFrames(), and skipped. Returns false on timeout.
  bool poll(Message* out, int timeoutMs);

  TrafficCounters& counters() { return counters_; }
  // The urgent layers in use (urgentLayerCount; 0 before connectPeers).
  int urgentLayers() const { return urgentLayers_; }
  // What connectPeers read of the egress queue (VanOptions::egressQueue kAuto, where the automatic
  // rule needed it); empty device and error if it did not look.
  const EgressProbe& egressProbe() const { return egressProbe_; }
  // Bytes (header + payload) handed to the urgent connections (VanOptions::urgentLayers).
  uint64_t urgentBytesSent() const { return urgentBytesSent_.load(std::memory_order_relaxed); }
  uint64_t rejectedFrames() const { return rejected_.load(); }
  // Connections that failed the CURVE handshake without reaching the ZAP
  // handler (peers that do not speak CURVE at all).
  uint64_t refusedConnections() const { return monitor_ ? monitor_->refused() : 0; }
  // Counts a rejected message and logs why, naming the peer. Rate-limited:
  // the first 20 in full, then every 1000th, so a flood of garbage cannot
  // flood the log too.
  void rejected(const std::string& peer, const std::string& why);

  // Closes all sockets (flushing for up to lingerMs). Idempotent. Messages still queued to a peer
  // marked in `quiet` (one flag per rank; a peer known to read nothing more) are dropped at once.
  void close(const std::vector<bool>& quiet = {});

  // The scheduling rank of a message (PriorityScheduler::priorityOf). Public for the tests.
  using Priority = PriorityScheduler::Priority;
  static Priority priorityOf(const FrameHeader& header) { return PriorityScheduler::priorityOf(header); }
  // Priority scheduling: messages (fragments) queued, not yet handed to ZeroMQ;
  // waitQueuedAtMost waits until at most n are (false: the timeout passed).
  size_t queuedMessages();
  bool waitQueuedAtMost(size_t n, std::chrono::milliseconds timeout);
  // Tests: while held, the sender hands nothing over (messages queue up) but
  // the first `letThrough` queued entries (messages or fragments).
  void holdSends(bool hold, size_t letThrough = 0);

 private:
  struct Peer {
    std::mutex mutex;
    std::unique_ptr<zmq::socket_t> socket;
    std::unique_ptr<zmq::socket_t> urgent;  // urgentLayers() > 0
  };
  bool isUrgent(const FrameHeader& header) const;
  bool receiveFrom(zmq::socket_t& socket, bool loopback, Message* out);
  // A fragment received: true with *out filled when it completed a message.
  bool addFragment(const FrameHeader& h, zmq::message_t& chunk, const zmq::message_t& where, const std::string& peer,
                   Message* out);

  static TrafficKind kindOf(MsgType type);

  zmq::context_t& ctx_;
  VanOptions options_;
  int urgentLayers_ = 0;         // urgentLayerCount(options_, peers, ...), set by connectPeers
  bool autoSendWindow_ = false;  // the window was the runtime's default (kAutoSendWindow): rank 0 says which
  EgressProbe egressProbe_;
  std::string endpoint_;
  int rank_ = -1;
  uint64_t job_ = 0;
  zmq::socket_t router_;
  zmq::socket_t loopIn_;
  std::mutex loopOutMutex_;
  zmq::socket_t loopOut_;  // guarded by loopOutMutex_
  std::vector<std::unique_ptr<Peer>> peers_;
  TrafficCounters counters_;
  std::atomic<uint64_t> rejected_{0};
  std::atomic<uint64_t> urgentBytesSent_{0};
  Reassembler reassembler_;                    // receive thread only
  std::unique_ptr<HandshakeMonitor> monitor_;  // handshake failures (CURVE only)
  // Written by close() (any thread), read by send() under a peer's or the
  // loopback's mutex and by close() itself: atomic, so no reader needs them all.
  std::atomic<bool> closed_{false};

  // Priority scheduling (sendWindowBytes > 0): set in connectPeers, before any send; the only user
  // of the DEALERs then.
  std::unique_ptr<PriorityScheduler> scheduler_;

  // Hands a built message to the links (the priority queue or the peer's DEALER) and counts it.
  void sendNow(int dest, const FrameHeader& header, zmq::message_t head, zmq::message_t body);
  // A whole message received: true to deliver it now, false when it waits for its decryption.
  bool decrypted(Message* out);
  // Charged decryption: reads every message that has arrived (without waiting) into crypto_.
  void admitArrivals();
  // CURVE's encryption charged by VanOptions::charger (the benchmark's ranks; null otherwise):
  // messages wait for their I/O thread's encryption and decryption (transport/charged_crypto.h).
  // Set in connectPeers, before any send.
  std::unique_ptr<ChargedCrypto> crypto_;
};

}  // namespace poseidon
