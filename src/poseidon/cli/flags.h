// A small strict flag parser for the CLI: --name VALUE, --name=VALUE and
// boolean --name; unknown flags, missing or malformed values are usage errors
// (InvalidArgument) that name the flag and the command. --help text is
// generated from the same table, so it cannot drift from what is parsed.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

namespace poseidon::cli {

class FlagSet {
 public:
  FlagSet(std::string command, std::string usage, std::string summary);

  void addString(const std::string& name, std::string* target, const std::string& help,
                 const std::string& valueName = "TEXT");
  void addInt(const std::string& name, int* target, const std::string& help, const std::string& valueName = "N");
  void addInt64(const std::string& name, int64_t* target, const std::string& help, const std::string& valueName = "N");
  void addDouble(const std::string& name, double* target, const std::string& help, const std::string& valueName = "X");
  void addBool(const std::string& name, bool* target, const std::string& help);

  // Parses args (without the command name). With allowPositional=false any
  // positional argument is an error. Everything after "--" is returned in
  // `rest` untouched (for launch's command line).
  void parse(const std::vector<std::string>& args, bool allowPositional = false);

  bool helpRequested() const { return help_; }
  bool wasSet(const std::string& name) const { return set_.count(name) > 0; }
  const std::vector<std::string>& positional() const { return positional_; }
  const std::vector<std::string>& rest() const { return rest_; }
  std::string helpText() const;
  const std::string& command() const { return command_; }

 private:
  struct Flag {
    std::string name, help, valueName, defaultText;
    bool isBool = false;
    std::function<void(const std::string&)> set;
  };
  const Flag* find(const std::string& name) const;
  std::string command_, usage_, summary_;
  std::vector<Flag> flags_;
  std::set<std::string> set_;
  std::vector<std::string> positional_, rest_;
  bool help_ = false;
};

}  // namespace poseidon::cli
