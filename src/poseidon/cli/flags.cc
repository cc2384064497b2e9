#include "poseidon/cli/flags.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "poseidon/common/error.h"

namespace poseidon::cli {

FlagSet::FlagSet(std::string command, std::string usage, std::string summary)
    : command_(std::move(command)), usage_(std::move(usage)), summary_(std::move(summary)) {}

namespace {
std::string fmtDouble(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}
}  // namespace

void FlagSet::addString(const std::string& name, std::string* target, const std::string& help,
                        const std::string& valueName) {
  flags_.push_back({name, help, valueName, target->empty() ? "" : *target, false,
                    [target](const std::string& v) { *target = v; }});
}

void FlagSet::addInt(const std::string& name, int* target, const std::string& help, const std::string& valueName) {
  std::string cmd = command_;
  flags_.push_back({name, help, valueName, std::to_string(*target), false, [target, name, cmd](const std::string& v) {
                      errno = 0;
                      char* end = nullptr;
                      long long x = std::strtoll(v.c_str(), &end, 10);
                      if (v.empty() || *end != '\0' || errno || x < INT32_MIN || x > INT32_MAX) {
                        throw InvalidArgument("--" + name + " expects an integer, got '" + v + "'");
                      }
                      *target = static_cast<int>(x);
                    }});
}

void FlagSet::addInt64(const std::string& name, int64_t* target, const std::string& help,
                       const std::string& valueName) {
  flags_.push_back({name, help, valueName, std::to_string(*target), false, [target, name](const std::string& v) {
                      errno = 0;
                      char* end = nullptr;
                      long long x = std::strtoll(v.c_str(), &end, 10);
                      if (v.empty() || *end != '\0' || errno) {
                        throw InvalidArgument("--" + name + " expects an integer, got '" + v + "'");
                      }
                      *target = x;
                    }});
}

void FlagSet::addDouble(const std::string& name, double* target, const std::string& help,
                        const std::string& valueName) {
  flags_.push_back({name, help, valueName, fmtDouble(*target), false, [target, name](const std::string& v) {
                      errno = 0;
                      char* end = nullptr;
                      double x = std::strtod(v.c_str(), &end);
                      if (v.empty() || *end != '\0' || errno || !std::isfinite(x)) {
                        throw InvalidArgument("--" + name + " expects a number, got '" + v + "'");
                      }
                      *target = x;
                    }});
}

void FlagSet::addBool(const std::string& name, bool* target, const std::string& help) {
  flags_.push_back({name, help, "", "", true, [target, name](const std::string& v) {
                      if (v.empty() || v == "true" || v == "1" || v == "yes") *target = true;
                      else if (v == "false" || v == "0" || v == "no") *target = false;
                      else throw InvalidArgument("--" + name + " expects true or false, got '" + v + "'");
                    }});
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
    if (!f.isBool && !f.defaultText.empty()) os << " (default: " << f.defaultText << ")";
    os << "\n";
  }
  os << "  --help                    show this help\n";
  return os.str();
}

}  // namespace poseidon::cli
