// Pieces shared by poseidon bench's two modes and poseidon tune (bench_util.h).
#include "poseidon/cli/bench_util.h"

#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "poseidon/bench/cluster.h"
#include "poseidon/bench/ranks.h"
#include "poseidon/bench/report.h"
#include "poseidon/cli/flags.h"
#include "poseidon/common/error.h"
#include "poseidon/common/file.h"
#include "poseidon/launch/env.h"
#include "poseidon/launch/launcher.h"
#include "poseidon/transport/van.h"

namespace poseidon::cli {
namespace fs = std::filesystem;

std::vector<std::string> splitList(const std::string& s) {
  std::vector<std::string> out;
  if (s.empty()) return out;
  // An empty entry ("1,,2", "1,2,") is a typo, not a shorter list: say so rather than drop it.
  if (s.front() == ',' || s.back() == ',' || s.find(",,") != std::string::npos) {
    throw InvalidArgument(strCat("the list '", s, "' has an empty entry (comma-separated values, e.g. 1,2,4)"));
  }
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(item);
  return out;
}

std::string findBenchScript(const std::string& flag, const std::string& name) {
  std::vector<fs::path> candidates;
  if (!flag.empty()) {
    // A path the user gave is that file or an error: not a silent fall back on the checkout's own.
    std::error_code ec;
    if (fs::is_regular_file(flag, ec)) return fs::canonical(flag).string();
    throw InvalidArgument(strCat("--ddp-script ", flag, ": ", fs::exists(flag, ec) ? "not a file" : "no such file",
                                 " (the DDP baseline's script, bench/", name, " in the repository)"));
  }
  fs::path exe = selfExecutable();
  candidates.push_back(exe.parent_path() / "../../bench" / name);
  candidates.push_back(fs::current_path() / "bench" / name);
  for (const auto& c : candidates)
    if (fs::exists(c)) return fs::canonical(c).string();
  throw InvalidArgument("bench/" + name +
                        " not found (the DDP baselines' scripts are the repository's: run from the checkout, or pass "
                        "--ddp-script PATH)");
}

std::string findDdpScript(const std::string& flag, const std::string& name, const std::string& python) {
  std::string script = findBenchScript(flag, name);
  try {
    bench::run({python, "-c", "import torch, torch.distributed"});
  } catch (const Error& e) {
    std::string why = e.what();  // the interpreter's last words, without their newline
    while (!why.empty() && std::isspace(static_cast<unsigned char>(why.back()))) why.pop_back();
    if (python == kDefaultDdpPython) {
      throw Error(
          strCat("the DDP baselines need Debian's python3-torch (apt-get install python3-torch), or "
                 "--ddp-python naming an interpreter with torch (",
                 why, ")"));
    }
    throw InvalidArgument(
        strCat("the DDP baselines need torch: --ddp-python ", python, " cannot import torch.distributed (", why, ")"));
  }
  return script;
}

std::string makeWorkDir(const std::string& prefix) {
  const char* tmpdir = std::getenv("TMPDIR");  // as mktemp(1) and the C library's tmpfile do
  const std::string dir = tmpdir && *tmpdir ? tmpdir : "/tmp";
  std::string tmpl = dir + "/" + prefix + "-XXXXXX";
  if (!mkdtemp(tmpl.data())) throw IoError(strCat("cannot create a work directory in ", dir, ": ", std::strerror(errno)));
  // Absolute: the ranks it is handed to run in other directories.
  return fs::absolute(tmpl).string();
}

std::vector<double> parseRates(const std::string& flag) {
  std::vector<double> rates;
  for (const auto& r : splitList(flag))
    rates.push_back(parseRealIn("each --rates entry (Mbit/s)", r, RealRange::above(0)));
  return rates;
}

void addQueueFlag(FlagSet& flags, double* queueMs) {
  flags.addDouble("queue-ms", queueMs,
                  "each shaped link's queue (tbf latency), in milliseconds of traffic at its rate: a switch port's "
                  "buffer; the default 100 is deep, a datacenter switch holds a few ms",
                  "MS", RealRange::closed(1, 1000));
}

void addTcpCongestionFlag(FlagSet& flags, std::string* name) {
  flags.addString("tcp-cc", name,
                  "every emulated node's TCP congestion control (default cubic: Linux's and Debian's default; the "
                  "host's own, e.g. bbr, would decide how a link's two directions share it)",
                  "NAME");
}

void addTcpQuickAckFlag(FlagSet& flags, bool* on) {
  flags.addBool("tcp-quickack", on,
                "every emulated node acknowledges each TCP segment at once (route metric quickack 1): no delayed "
                "ACK, whose 40 ms floor --time-dilation does not scale; for telling a dilated run from an F = 1 one");
}

bench::HostQueue parseHostQueue(const std::string& name, const char* flag) {
  if (name == "fifo") return bench::HostQueue::kFifo;
  if (name == "tos") return bench::HostQueue::kTos;
  // A node's qdisc; a switch port is not a Linux host's queue.
  const bool node = std::string(flag) == "--host-queue";
  if (node && name == "pfifo_fast") return bench::HostQueue::kPfifoFast;
  throw InvalidArgument(strCat(flag, " must be fifo", node ? ", tos or pfifo_fast" : " or tos", ", got '", name, "'"));
}

void checkTcpCongestionName(const std::string& name) {
  const bool ok = !name.empty() && name.size() <= 15 && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
  if (!ok)
    throw InvalidArgument(strCat("--tcp-cc: '", name, "' is not a congestion-control name (e.g. cubic, reno, bbr)"));
}

std::string commandLine(const std::string& command, const std::vector<std::string>& args) {
  std::string line = command;
  for (const auto& a : args) line += " " + a;
  return line;
}

std::atomic<int> gStop{0};

namespace {
void onStopSignal(int sig) { gStop = sig; }
}  // namespace

int benchDefaultSendWindow(int nodes, bool twoBand, double scale) {
  const double full = Van::defaultSendWindow(static_cast<size_t>(std::max(0, nodes - 1)), twoBand);
  return static_cast<int>(std::max<double>(Van::kMinSendWindow, std::round(full * scale * scale)));
}

void printSendWindowFloor(const std::vector<std::string>& systems, const std::vector<int>& nodes, bool twoBand,
                          double scale) {
  if (std::none_of(systems.begin(), systems.end(),
                   [](const std::string& s) { return s.rfind("poseidon-overlap", 0) == 0; }))
    return;
  for (int n : nodes) {
    const double full = Van::defaultSendWindow(static_cast<size_t>(std::max(0, n - 1)), twoBand);
    const double scaled = full * scale * scale;
    if (std::round(scaled) >= Van::kMinSendWindow) continue;
    std::printf(
        "  (at %d nodes the runtime's default send window, %g KB at full width, is %.0f bytes at width %g, under "
        "the runtime's smallest %d: the poseidon-overlap ranks run %d, %.0f KB at full width; --scale %g holds it)\n",
        n, full / 1024, scaled, scale, Van::kMinSendWindow, Van::kMinSendWindow,
        Van::kMinSendWindow / (scale * scale) / 1024, std::ceil(std::sqrt(Van::kMinSendWindow / full) * 10) / 10);
  }
}

void installStopHandlers() {
  struct sigaction sa {};
  sa.sa_handler = onStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);
  // The reader of the output went away (`bench | head`, `less` quit early): stop as for Ctrl-C, so that
  // the cluster and the logs go too. SIGPIPE's default would end the process at its next line, with
  // its namespaces and work directory left behind.
  sigaction(SIGPIPE, &sa, nullptr);
}

void requireEmulatedCluster() {
  std::string why;
  if (!bench::EmulatedCluster::available(&why)) throw Error(why);
}

int reportFromFile(const std::string& file, const std::string& mdPath, const std::string& plotDir) {
  if (mdPath.empty() && plotDir.empty()) throw InvalidArgument("--report-from needs --markdown or --plots");
  std::error_code ec;
  if (fs::is_directory(file, ec))
    throw InvalidArgument("--report-from " + file + ": is a directory, expected a results JSON file");
  std::ifstream in(file);
  if (!in) throw InvalidArgument("--report-from: cannot read " + file);
  nlohmann::json result;
  try {
    result = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw InvalidArgument(strCat(file, " is not a results JSON of poseidon bench: ", jsonErrorText(e)));
  }
  if (!result.contains("config") || !result.contains("runs"))
    throw InvalidArgument(file + " is not a results JSON of poseidon bench (no config or runs)");
  if (result["config"].contains("pad_ms")) {  // a `bench --accuracy` file
    writeAccuracyReport(result, mdPath, plotDir);
    return 0;
  }
  if (!mdPath.empty()) bench::writeMarkdown(mdPath, result);
  if (!plotDir.empty()) bench::writePlots(plotDir, result);
  return 0;
}

bench::MachineRates parseMachineRates(const std::string& flag) {
  const std::vector<std::string> parts = splitList(flag);
  if (parts.size() != 3) {
    throw InvalidArgument(
        strCat("--machine-rates needs three rates, GEMM GFLOP/s, sums GB/s and CURVE GB/s (e.g. "
               "78,9.7,1.4), got '",
               flag, "'"));
  }
  bench::MachineRates r;
  r.gemmFlops = 1e9 * parseRealIn("--machine-rates' GEMM GFLOP/s", parts[0], RealRange::above(0));
  r.sumBytes = 1e9 * parseRealIn("--machine-rates' sums GB/s", parts[1], RealRange::above(0));
  r.cryptoBytes = 1e9 * parseRealIn("--machine-rates' CURVE GB/s", parts[2], RealRange::above(0));
  return r;
}

void checkResultOutputs(const std::string& jsonPath, const std::string& mdPath, const std::string& plotDir) {
  if (!jsonPath.empty()) checkOutputFile("--json", jsonPath);
  if (!mdPath.empty()) checkOutputFile("--markdown", mdPath);
  if (!plotDir.empty()) checkOutputDirectory("--plots", plotDir);
}

void writeResultsJson(const std::string& path, const nlohmann::json& result) {
  if (path.empty()) return;
  writeFileAtomically(path, result.dump(2) + "\n", "--json");
  std::printf("results: %s\n", path.c_str());
}

void throwIfStopped() {
  const int sig = gStop.load();
  if (sig == SIGPIPE) throw InterruptedError("interrupted by SIGPIPE (the reader of its output went away)", sig);
  if (sig != 0) throw InterruptedError("interrupted by " + stopSignalName(sig), sig);
}

void finishOutput() {
  std::fflush(stdout);
  throwIfStopped();
}

WorkDir::WorkDir(const std::string& prefix, bool keep, std::string label)
    : path_(makeWorkDir(prefix)), label_(std::move(label)), keep_(keep) {
  installStopHandlers();
}

WorkDir::~WorkDir() {
  if (keep_) {
    // Where stdout's reader is gone, the kept path is told on stderr.
    std::FILE* to = gStop.load() == SIGPIPE ? stderr : stdout;
    std::fprintf(to, "%s: %s\n", label_.c_str(), path_.c_str());
    std::fflush(to);
    return;
  }
  std::error_code ec;  // a destructor, maybe unwinding: what cannot be removed stays
  fs::remove_all(path_, ec);
}

}  // namespace poseidon::cli
