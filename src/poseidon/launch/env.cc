#include "poseidon/launch/env.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>
#include <random>
#include <zmq.hpp>

#include "poseidon/common/error.h"

extern char** environ;

namespace poseidon {
namespace {

int parseInt(const char* name, const char* value, int lo, int hi) {
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(value, &end, 10);
  if (!*value || *end || errno || v < lo || v > hi) {
    throw InvalidArgument(strCat("environment variable ", name, "='", value, "' is not an integer in [", lo, ", ",
                                 hi, "]"));
  }
  return static_cast<int>(v);
}

}  // namespace

RankEnv rankFromEnvironment(const GetEnv& getenv) {
  RankEnv env;
  struct Convention {
    const char *source, *rank, *size, *local;
  };
  const Convention conventions[] = {
      {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
      {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
      {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
  };
  for (const auto& c : conventions) {
    const char* rank = getenv(c.rank);
    if (!rank) {
      // WORLD_SIZE=2 alone would run a world of one: two machines that forgot RANK would each train
      // alone and both report success.
      const char* size = getenv(c.size);
      if (size && *size && std::string(c.source) == "torchrun" && std::strtol(size, nullptr, 10) > 1) {
        throw InvalidArgument(strCat(c.size, "=", size, " is set but ", c.rank,
                                     " is not: each process of the world needs its own (torchrun convention); unset ",
                                     c.size, " to run alone"));
      }
      continue;
    }
    const char* size = getenv(c.size);
    if (std::string(c.source) == "slurm" && !getenv("SLURM_STEP_ID") && !getenv("SLURM_STEPID")) {
      // A batch script or an salloc shell, not a task of srun's (see the header). Alone it says nothing;
      // with more tasks in the allocation the user may have meant srun.
      const char* ntasks = size ? size : "";
      if (std::strtol(ntasks, nullptr, 10) > 1) {
        env.notice = strCat("SLURM_PROCID=", rank, " and SLURM_NTASKS=", ntasks,
                            " are set but SLURM_STEP_ID is not: this is Slurm's batch script or an salloc shell, not "
                            "one of the job's tasks, so it does not wait as rank ",
                            rank, " of ", ntasks, " (start the ranks with srun to run them as the job's tasks)");
      }
      continue;
    }
    if (!size) throw InvalidArgument(strCat(c.rank, " is set but ", c.size, " is not (", c.source, " convention)"));
    env.present = true;
    env.source = c.source;
    if (const char* ours = getenv("POSEIDON_LAUNCHER"); ours && *ours && env.source == "torchrun") env.source = ours;
    env.origin = strCat(c.rank, "=", rank, " ", c.size, "=", size);
    env.worldSize = parseInt(c.size, size, 1, 1 << 20);
    env.rank = parseInt(c.rank, rank, 0, env.worldSize - 1);
    if (const char* local = getenv(c.local)) env.localRank = parseInt(c.local, local, 0, 1 << 20);
    break;
  }
  const char* addr = getenv("MASTER_ADDR");
  const char* port = getenv("MASTER_PORT");
  // A process on its own is a world of one and its own coordinator: a MASTER_ADDR left in the shell
  // for another job would only send it to bind where it cannot (another machine's address).
  if (addr && *addr && env.present) env.masterAddr = addr;
  else if (env.present && env.worldSize > 1) {
    // Every launcher's ranks need it (torchrun and poseidon launch set it); 127.0.0.1 as a default
    // would leave a rank on another machine waiting out its timeout for a coordinator that is not there.
    throw InvalidArgument(strCat("started by ", env.source, " (", env.origin,
                                 ") but MASTER_ADDR is not set: export MASTER_ADDR=<address of rank 0's machine> "
                                 "(127.0.0.1 when every rank runs on this one)"));
  }
  if (port && *port) {
    env.masterPort = parseInt("MASTER_PORT", port, 1, 65535);
    env.masterPortSet = true;
  }
  return env;
}

RankEnv rankFromEnvironment() {
  RankEnv env = rankFromEnvironment([](const char* name) { return static_cast<const char*>(std::getenv(name)); });
  static std::once_flag said;
  if (!env.notice.empty()) {
    std::call_once(said, [&] {
      std::fprintf(stderr, "poseidon: note: %s\n", env.notice.c_str());
      std::fflush(stderr);
    });
  }
  return env;
}

int localWorldSizeFromEnvironment() {
  const char* v = std::getenv("LOCAL_WORLD_SIZE");
  return v && *v ? parseInt("LOCAL_WORLD_SIZE", v, 1, 1 << 20) : 1;
}

std::string jobSecretFromEnvironment(const GetEnv& getenv) {
  if (const char* s = getenv("POSEIDON_SECRET"); s && *s) return s;
  const char* path = getenv("POSEIDON_SECRET_FILE");
  if (!path || !*path) return {};
  std::ifstream f(path);
  std::string secret((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (!f && !f.eof()) throw InvalidArgument(strCat("cannot read POSEIDON_SECRET_FILE ", path));
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  if (secret.empty()) throw InvalidArgument(strCat("POSEIDON_SECRET_FILE ", path, " is empty or unreadable"));
  return secret;
}

std::string jobSecretFromEnvironment() {
  return jobSecretFromEnvironment([](const char* name) { return static_cast<const char*>(std::getenv(name)); });
}

TransportSecurity transportSecurityFromEnvironment(const GetEnv& getenv) {
  const char* s = getenv("POSEIDON_TRANSPORT_SECURITY");
  if (!s || !*s) return TransportSecurity::kCurve;
  return parseTransportSecurity(s, "POSEIDON_TRANSPORT_SECURITY");
}

TransportSecurity transportSecurityFromEnvironment() {
  return transportSecurityFromEnvironment([](const char* name) { return static_cast<const char*>(std::getenv(name)); });
}

std::string resolveHost(const std::string& host) {
  in_addr probe{};
  if (inet_pton(AF_INET, host.c_str(), &probe) == 1) return host;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || !res) throw InvalidArgument(strCat("cannot resolve host '", host, "': ", gai_strerror(rc)));
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, buf, sizeof buf);
  freeaddrinfo(res);
  return buf;
}

std::string localAddressToward(const std::string& ip) {
  int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) throw IoError(strCat("socket(): ", std::strerror(errno)));
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(9);
  if (inet_pton(AF_INET, ip.c_str(), &dst.sin_addr) != 1) {
    ::close(fd);
    throw InvalidArgument(strCat("'", ip, "' is not an IPv4 address"));
  }
  // connect() on a UDP socket only picks the route and source address.
  if (::connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof dst) != 0) {
    int err = errno;
    ::close(fd);
    throw IoError(strCat("no route to ", ip, ": ", std::strerror(err)));
  }
  sockaddr_in self{};
  socklen_t len = sizeof self;
  getsockname(fd, reinterpret_cast<sockaddr*>(&self), &len);
  ::close(fd);
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &self.sin_addr, buf, sizeof buf);
  return buf;
}

namespace {

// Binds a ROUTER on host:port ("*": the kernel's choice) and returns the port it got, or -1 with
// ZeroMQ's reason in `why` when that port does not bind (in use, or not ours to bind). The socket
// closes on return: freePort's user binds the port itself later.
int bindsOn(zmq::context_t& ctx, const std::string& host, const std::string& port, std::string* why) {
  zmq::socket_t s(ctx, zmq::socket_type::router);
  s.set(zmq::sockopt::linger, 0);
  try {
    s.bind(strCat("tcp://", host, ":", port));
  } catch (const zmq::error_t& e) {
    *why = e.what();
    return -1;
  }
  const std::string ep = s.get(zmq::sockopt::last_endpoint);
  return std::atoi(ep.substr(ep.rfind(':') + 1).c_str());
}

}  // namespace

int freePort(const std::string& host) {
  int ephemeralLow = 32768;  // Linux's default, where /proc does not say
  {
    std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
    int low = 0, high = 0;
    if (range >> low >> high && low > 1024) ephemeralLow = low;
  }
  zmq::context_t ctx(1);
  std::string why;
  // Below the ephemeral range, at most 8192 ports down and never under 10000.
  const int lo = std::max(10000, ephemeralLow - 8192), hi = ephemeralLow - 1;
  if (hi >= lo) {
    std::random_device seed;
    std::mt19937 pick(seed());
    std::uniform_int_distribution<int> port(lo, hi);
    for (int tries = 0; tries < 64; ++tries) {
      const int p = bindsOn(ctx, host, std::to_string(port(pick)), &why);
      if (p > 0) return p;
    }
  }
  const int p = bindsOn(ctx, host, "*", &why);
  if (p <= 0) throw IoError(strCat("cannot bind a TCP port on ", host, ": ", why));
  return p;
}

std::string selfExecutable() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw IoError("cannot find the poseidon executable (/proc/self/exe)");
  buf[n] = '\0';
  return buf;
}

std::vector<std::string> environmentWith(const std::map<std::string, std::string>& overrides) {
  std::vector<std::string> out;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    if (!overrides.count(kv.substr(0, kv.find('=')))) out.push_back(std::move(kv));
  }
  for (const auto& [k, v] : overrides) out.push_back(k + "=" + v);
  return out;
}

}  // namespace poseidon
