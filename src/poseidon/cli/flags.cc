#include "poseidon/cli/flags.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <sstream>

#include "poseidon/common/error.h"

namespace poseidon::cli {

namespace {
// A whole number in full (1048576, not 1.04858e+06); any other to six digits (1/3 as 0.333333, 0.1
// stays 0.1): help text, where fifteen digits of a third say nothing more.
std::string fmtDouble(double v) {
  std::ostringstream os;
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e15) os << std::setprecision(15) << v;
  else os << v;
  return os.str();
}
}  // namespace

std::string IntRange::text(int64_t typeMax) const {
  std::string range = max >= typeMax ? strCat(">= ", min) : strCat("in [", min, ", ", max, "]");
  return off ? strCat(*off, " or ", max >= typeMax ? range : range.substr(3)) : range;
}

bool RealRange::contains(double v) const {
  bool aboveMin = minOpen ? v > min : v >= min;
  bool belowMax = maxOpen ? v < max : v <= max;
  return aboveMin && belowMax;
}

std::string RealRange::text() const {
  if (std::isinf(max)) return strCat(minOpen ? "> " : ">= ", fmtDouble(min));
  return strCat("in ", minOpen ? "(" : "[", fmtDouble(min), ", ", fmtDouble(max), maxOpen ? ")" : "]");
}

int64_t parseIntIn(const std::string& what, const std::string& text, const IntRange& range, int64_t typeMax) {
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || (errno && errno != ERANGE))
    throw InvalidArgument(what + " expects an integer, got '" + text + "'");
  // Above the type (an int flag holds no more than an int, whatever its range) or beyond 64 bits, which
  // is still an integer: the bound it passed.
  if (x > typeMax || (errno == ERANGE && x > 0))
    throw InvalidArgument(strCat(what, " must be at most ", std::min(range.max, typeMax), ", got ", text));
  if (errno == ERANGE) throw InvalidArgument(strCat(what, " must be ", range.text(typeMax), ", got ", text));
  if (!range.contains(x)) throw InvalidArgument(strCat(what, " must be ", range.text(typeMax), ", got ", x));
  return x;
}

double parseRealIn(const std::string& what, const std::string& text, const RealRange& range) {
  errno = 0;
  char* end = nullptr;
  double x = std::strtod(text.c_str(), &end);
  const bool outOfRange = errno == ERANGE;  // beyond a double (1e999), or below its smallest (1e-400)
  if (text.empty() || *end != '\0' || (errno && !outOfRange) || std::isnan(x) ||
      (std::isinf(x) && !outOfRange)) {
    throw InvalidArgument(what + " expects a number, got '" + text + "'");
  }
  if (outOfRange && std::isinf(x)) {
    throw InvalidArgument(strCat(what, " must be a finite number, got ", text, " (beyond a double's range)"));
  }
  // Below a normal double (1e-400 reads as 0, -1e-400 as -0, 1e-310 as a denormal): not the number the
  // user wrote, so neither "off" (0) nor a negative that passes as -0.
  if (outOfRange) {
    throw InvalidArgument(strCat(what, " must be ", range.text(), ", got ", text, " (too close to 0 for a double)"));
  }
  if (!range.contains(x)) throw InvalidArgument(strCat(what, " must be ", range.text(), ", got ", text));
  return x;
}

FlagSet::FlagSet(std::string command, std::string usage, std::string summary)
    : command_(std::move(command)), usage_(std::move(usage)), summary_(std::move(summary)) {}

void FlagSet::addString(const std::string& name, std::string* target, const std::string& help,
                        const std::string& valueName) {
  flags_.push_back({name, help, valueName, target->empty() ? "" : *target, "", false,
                    [target](const std::string& v) { *target = v; }});
}

void FlagSet::addInt(const std::string& name, int* target, const std::string& help, const std::string& valueName,
                     const IntRange& range) {
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  IntRange r = range;
  r.min = std::max<int64_t>(r.min, std::numeric_limits<int>::min());
  r.max = std::min<int64_t>(r.max, kIntMax);
  flags_.push_back({name, help, valueName, r.contains(*target) ? std::to_string(*target) : "", r.text(kIntMax), false,
                    [target, name, r](const std::string& v) {
                      *target = static_cast<int>(parseIntIn("--" + name, v, r, kIntMax));
                    }});
}

void FlagSet::addInt64(const std::string& name, int64_t* target, const std::string& help,
                       const std::string& valueName, const IntRange& range) {
  flags_.push_back({name, help, valueName, range.contains(*target) ? std::to_string(*target) : "", range.text(),
                    false, [target, name, range](const std::string& v) {
                      *target = parseIntIn("--" + name, v, range);
                    }});
}

void FlagSet::addDouble(const std::string& name, double* target, const std::string& help,
                        const std::string& valueName, const RealRange& range) {
  flags_.push_back({name, help, valueName, range.contains(*target) ? fmtDouble(*target) : "", range.text(), false,
                    [target, name, range](const std::string& v) { *target = parseRealIn("--" + name, v, range); }});
}

void FlagSet::addBool(const std::string& name, bool* target, const std::string& help) {
  flags_.push_back(
      {name, help, "", "", "", true, [target, name](const std::string& v) { *target = parseBoolValue(name, v); }});
}

bool parseBoolValue(const std::string& name, const std::string& v) {
  if (v.empty() || v == "true" || v == "1" || v == "yes") return true;
  if (v == "false" || v == "0" || v == "no") return false;
  throw InvalidArgument("--" + name + " expects true or false, got '" + v + "'");
}

bool takeModeFlag(std::vector<std::string>& args, const std::string& name) {
  const std::string bare = "--" + name, withValue = bare + "=";
  bool on = false;
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--") {  // what follows belongs to a command line of its own
      rest.insert(rest.end(), args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
      break;
    }
    if (args[i] == bare) on = true;
    else if (args[i].rfind(withValue, 0) == 0) on = parseBoolValue(name, args[i].substr(withValue.size()));
    else rest.push_back(args[i]);
  }
  args = std::move(rest);
  return on;
}

const FlagSet::Flag* FlagSet::find(const std::string& name) const {
  for (const auto& f : flags_)
    if (f.name == name) return &f;
  return nullptr;
}

void FlagSet::parse(const std::vector<std::string>& args, bool allowPositional) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      rest_.assign(args.begin() + static_cast<long>(i) + 1, args.end());
      return;
    }
    if (a == "--help" || a == "-h") {
      help_ = true;
      continue;
    }
    if (a.size() > 2 && a.compare(0, 2, "--") == 0) {
      std::string name = a.substr(2), value;
      bool hasValue = false;
      auto eq = name.find('=');
      if (eq != std::string::npos) {
        value = name.substr(eq + 1);
        name = name.substr(0, eq);
        hasValue = true;
      }
      const Flag* f = find(name);
      if (!f) {
        throw InvalidArgument("unknown flag --" + name + " for 'poseidon " + command_ + "' (see 'poseidon " + command_ +
                              " --help')");
      }
      if (!f->isBool && !hasValue) {
        if (i + 1 >= args.size()) throw InvalidArgument("flag --" + name + " needs a value (" + f->valueName + ")");
        // "--summary --quiet" once wrote the summary to a file named "--quiet" and
        // dropped --quiet: a next argument that is one of this command's flags is a
        // missing value. A value that really starts so is given as --summary=--quiet.
        const std::string& next = args[i + 1];
        if (next.size() > 2 && next.compare(0, 2, "--") == 0 && find(next.substr(2, next.find('=') - 2))) {
          throw InvalidArgument("flag --" + name + " needs a value (" + f->valueName + "), got the flag " + next +
                                " (write --" + name + "=" + next + " for a value that starts with --)");
        }
        value = args[++i];
      }
      f->set(value);
      set_.insert(name);
      continue;
    }
    if (!allowPositional) {
      throw InvalidArgument("unexpected argument '" + a + "' for 'poseidon " + command_ + "' (see 'poseidon " +
                            command_ + " --help')");
    }
    positional_.push_back(a);
  }
}

std::string FlagSet::helpText() const {
  std::ostringstream os;
  os << "usage: " << usage_ << "\n\n" << summary_ << "\n\nflags:\n";
  for (const auto& f : flags_) {
    std::string left = "  --" + f.name + (f.isBool ? "" : " " + f.valueName);
    os << left;
    if (left.size() < 28) os << std::string(28 - left.size(), ' ');
    else os << "\n" << std::string(28, ' ');
    os << f.help;
    std::string notes = f.rangeText;
    if (!f.isBool && !f.defaultText.empty()) notes += (notes.empty() ? "default: " : "; default: ") + f.defaultText;
    if (!notes.empty()) os << " (" << notes << ")";
    os << "\n";
  }
  os << "  --help                    show this help\n";
  return os.str();
}

}  // namespace poseidon::cli
