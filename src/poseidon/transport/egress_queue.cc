#include "poseidon/transport/egress_queue.h"

#include <ifaddrs.h>
#include <linux/netlink.h>
#include <linux/pkt_sched.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "poseidon/common/error.h"

namespace poseidon {

const char* egressQueueName(EgressQueue queue) {
  switch (queue) {
    case EgressQueue::kAuto:
      return "auto";
    case EgressQueue::kFifo:
      return "fifo";
    case EgressQueue::kTos:
      return "tos";
  }
  return "?";
}

EgressQueue parseEgressQueue(const std::string& name, const std::string& flag) {
  if (name == "auto") return EgressQueue::kAuto;
  if (name == "fifo") return EgressQueue::kFifo;
  if (name == "tos") return EgressQueue::kTos;
  throw InvalidArgument(strCat(flag, " must be auto, fifo or tos, got '", name, "'"));
}

namespace {

bool isTosBands(const std::string& kind) { return kind == "pfifo_fast" || kind == "prio"; }
// Shapers with one inner qdisc, which decides the order (their default inner FIFO is not dumped).
bool isSingleChildShaper(const std::string& kind) { return kind == "tbf" || kind == "netem"; }
bool isMultiqueue(const std::string& kind) { return kind == "mq" || kind == "mqprio" || kind == "multiq"; }

// The qdiscs attached under `q` (to one of its classes): parent's major number is q's handle's.
std::vector<const QdiscEntry*> children(const std::vector<QdiscEntry>& tree, const QdiscEntry& q) {
  std::vector<const QdiscEntry*> out;
  for (const auto& e : tree)
    if (&e != &q && e.parent != TC_H_ROOT && e.parent != TC_H_INGRESS && TC_H_MAJ(e.parent) == TC_H_MAJ(q.handle))
      out.push_back(&e);
  return out;
}

// Whether q serves low-delay first; `path` gets the kinds that decided it.
bool serves(const std::vector<QdiscEntry>& tree, const QdiscEntry& q, int depth, std::string* path) {
  if (path) *path += (path->empty() ? "" : " > ") + q.kind;
  if (depth > 8) return false;
  if (isTosBands(q.kind)) return true;
  const auto kids = children(tree, q);
  if (isSingleChildShaper(q.kind)) return kids.size() == 1 && serves(tree, *kids[0], depth + 1, path);
  if (isMultiqueue(q.kind)) {
    if (kids.empty()) return false;
    for (const QdiscEntry* k : kids)
      if (!serves(tree, *k, depth + 1, nullptr)) return false;
    if (path) *path += " > " + kids[0]->kind + " (each queue)";
    return true;
  }
  return false;
}

const QdiscEntry* root(const std::vector<QdiscEntry>& tree) {
  for (const auto& e : tree)
    if (e.parent == TC_H_ROOT) return &e;
  return nullptr;
}

// The local interface the kernel routes `host` through: a connected UDP socket's source address (a
// connect sends nothing), matched against the interfaces' addresses.
std::string routeDevice(const std::string& host, std::string* error) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), "9", &hints, &found); rc != 0 || !found) {
    *error = strCat("cannot resolve '", host, "': ", gai_strerror(rc));
    return "";
  }
  const int family = found->ai_family;
  const int fd = socket(family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_storage local{};
  socklen_t length = sizeof(local);
  const bool ok = fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0;
  const int err = errno;
  if (fd >= 0) close(fd);
  freeaddrinfo(found);
  if (!ok) {
    *error = strCat("no route to '", host, "': ", std::strerror(err));
    return "";
  }
  ifaddrs* interfaces = nullptr;
  if (getifaddrs(&interfaces) != 0) {
    *error = strCat("cannot list the interfaces: ", std::strerror(errno));
    return "";
  }
  std::string device;
  for (ifaddrs* i = interfaces; i && device.empty(); i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != family) continue;
    if (family == AF_INET) {
      const auto* a = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
      const auto* b = reinterpret_cast<const sockaddr_in*>(&local);
      if (a->sin_addr.s_addr == b->sin_addr.s_addr) device = i->ifa_name;
    } else if (family == AF_INET6) {
      const auto* a = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr);
      const auto* b = reinterpret_cast<const sockaddr_in6*>(&local);
      if (std::memcmp(&a->sin6_addr, &b->sin6_addr, sizeof(in6_addr)) == 0) device = i->ifa_name;
    }
  }
  freeifaddrs(interfaces);
  if (device.empty()) *error = strCat("no interface holds the source address toward '", host, "'");
  return device;
}

// Every qdisc of interface `ifindex`, dumped over rtnetlink (RTM_GETQDISC).
std::vector<QdiscEntry> dumpQdiscs(int ifindex, std::string* error) {
  std::vector<QdiscEntry> tree;
  const int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
  if (fd < 0) {
    *error = strCat("no rtnetlink socket: ", std::strerror(errno));
    return tree;
  }
  struct {
    nlmsghdr header;
    tcmsg tc;
  } request{};
  request.header.nlmsg_len = NLMSG_LENGTH(sizeof(tcmsg));
  request.header.nlmsg_type = RTM_GETQDISC;
  request.header.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  request.header.nlmsg_seq = 1;
  request.tc.tcm_family = AF_UNSPEC;
  request.tc.tcm_ifindex = ifindex;
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (sendto(fd, &request, request.header.nlmsg_len, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof(kernel)) < 0) {
    *error = strCat("rtnetlink request failed: ", std::strerror(errno));
    close(fd);
    return tree;
  }
  std::vector<char> buffer(1 << 16);
  for (bool done = false; !done;) {
    const ssize_t n = recv(fd, buffer.data(), buffer.size(), 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      *error = strCat("rtnetlink reply failed: ", std::strerror(errno));
      break;
    }
    if (n == 0) break;
    int left = static_cast<int>(n);
    for (auto* h = reinterpret_cast<nlmsghdr*>(buffer.data()); NLMSG_OK(h, left); h = NLMSG_NEXT(h, left)) {
      if (h->nlmsg_type == NLMSG_DONE) {
        done = true;
        break;
      }
      if (h->nlmsg_type == NLMSG_ERROR) {
        const auto* e = static_cast<const nlmsgerr*>(NLMSG_DATA(h));
        *error = strCat("rtnetlink: ", std::strerror(-e->error));
        done = true;
        break;
      }
      if (h->nlmsg_type != RTM_NEWQDISC) continue;
      const auto* tc = static_cast<const tcmsg*>(NLMSG_DATA(h));
      if (tc->tcm_ifindex != ifindex) continue;  // older kernels dump every device
      QdiscEntry entry;
      entry.handle = tc->tcm_handle;
      entry.parent = tc->tcm_parent;
      int attrLeft = static_cast<int>(h->nlmsg_len - NLMSG_LENGTH(sizeof(tcmsg)));
      for (auto* a = reinterpret_cast<rtattr*>(reinterpret_cast<char*>(NLMSG_DATA(h)) + NLMSG_ALIGN(sizeof(tcmsg)));
           RTA_OK(a, attrLeft); a = RTA_NEXT(a, attrLeft)) {
        if (a->rta_type == TCA_KIND)
          entry.kind.assign(static_cast<const char*>(RTA_DATA(a)),
                            strnlen(static_cast<const char*>(RTA_DATA(a)), RTA_PAYLOAD(a)));
      }
      tree.push_back(std::move(entry));
    }
  }
  close(fd);
  return tree;
}

}  // namespace

bool servesLowDelayFirst(const std::vector<QdiscEntry>& tree) {
  const QdiscEntry* r = root(tree);
  return r && serves(tree, *r, 0, nullptr);
}

EgressProbe probeEgressQueue(const std::string& peerHost) {
  EgressProbe probe;
  probe.device = routeDevice(peerHost, &probe.error);
  if (probe.device.empty()) return probe;
  const int ifindex = static_cast<int>(if_nametoindex(probe.device.c_str()));
  if (ifindex == 0) {
    probe.error = strCat("interface '", probe.device, "' vanished: ", std::strerror(errno));
    return probe;
  }
  const std::vector<QdiscEntry> tree = dumpQdiscs(ifindex, &probe.error);
  if (!probe.error.empty()) return probe;
  const QdiscEntry* r = root(tree);
  if (!r) {
    probe.error = strCat("interface '", probe.device, "' reports no root qdisc");
    return probe;
  }
  probe.lowDelayFirst = serves(tree, *r, 0, &probe.qdisc);
  return probe;
}

}  // namespace poseidon
