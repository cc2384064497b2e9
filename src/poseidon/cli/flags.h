// A small strict flag parser for the CLI: --name VALUE, --name=VALUE and
// boolean --name; unknown flags, missing, malformed or out-of-range values are
// usage errors (InvalidArgument) that name the flag and the command. Every
// numeric flag is declared with the range it accepts, checked when it is
// parsed, so a bad value is rejected before anything starts (not later by
// rendezvous under another name). --help text is generated from the same
// table, ranges included, so it cannot drift from what is parsed.
//
// Why not CLI11 (Debian's libcli11-dev 2.1, weighed in issue 9): it would give
// range validators, subcommands and generated help, which flags.{h,cc}
// already do in under 300 lines. What it would cost:
//  - its messages are not ours: "--workers: Value 0 not in range 1 to 65536",
//    "--batch: Value many not in range 1 to 16777216" for a non-number, and
//    "The following arguments were not expected: 3 --epoch"; the tests and
//    users rely on "--batch expects an integer, got 'many'" and "unknown flag
//    --epoch for 'poseidon train'", which we would rebuild with a custom
//    failure_message and validators for every flag;
//  - its exit codes (105, 109, ...) replace our contract of 2 for every
//    usage error, 1 for a runtime failure;
//  - its Range is closed only, while --momentum is [0, 1) and --width-scale
//    (0, 1], and it has no "-1 or >= 1" for off-values like --max-steps -1;
//  - a 400 KB header-only dependency that adds about 7 s of compile time
//    (measured: 7.0 s against 0.4 s at -O2) to every CLI source that
//    declares flags, on 2-core build machines.
// What we would gain (short flags, config files, option groups) no command
// needs. So the hand-written FlagSet stays.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace poseidon::cli {

// The values an integer flag accepts: [min, max], and optionally one value
// outside it that switches the feature off (--max-steps -1: no limit).
struct IntRange {
  int64_t min = std::numeric_limits<int64_t>::min();
  int64_t max = std::numeric_limits<int64_t>::max();
  std::optional<int64_t> off;

  static IntRange closed(int64_t min, int64_t max) { return {min, max, std::nullopt}; }
  static IntRange atLeast(int64_t min) { return {min, std::numeric_limits<int64_t>::max(), std::nullopt}; }
  IntRange orOff(int64_t value) const { return {min, max, value}; }
  bool contains(int64_t v) const { return (v >= min && v <= max) || (off && v == *off); }
  // "in [1, 65536]", ">= 1", "-1 or >= 1"; a max at or above typeMax is no bound.
  std::string text(int64_t typeMax = std::numeric_limits<int64_t>::max()) const;
};

// The values a real flag accepts: an interval whose ends may be open or
// infinite ([0, 1), (0, 1], > 0, >= 0).
struct RealRange {
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  bool minOpen = false, maxOpen = false;

  static RealRange closed(double min, double max) { return {min, max, false, false}; }
  static RealRange leftOpen(double min, double max) { return {min, max, true, false}; }   // (min, max]
  static RealRange rightOpen(double min, double max) { return {min, max, false, true}; }  // [min, max)
  static RealRange atLeast(double min) { return {min, std::numeric_limits<double>::infinity(), false, false}; }
  static RealRange above(double min) { return {min, std::numeric_limits<double>::infinity(), true, false}; }
  bool contains(double v) const;
  std::string text() const;  // "in [0, 1)", "> 0", ">= 0"
};

class FlagSet {
 public:
  FlagSet(std::string command, std::string usage, std::string summary);

  void addString(const std::string& name, std::string* target, const std::string& help,
                 const std::string& valueName = "TEXT");
  // A default outside the range is a placeholder the command replaces (say,
  // --servers: as many as --workers); the help text then leaves it out.
  void addInt(const std::string& name, int* target, const std::string& help, const std::string& valueName,
              const IntRange& range);
  void addInt64(const std::string& name, int64_t* target, const std::string& help, const std::string& valueName,
                const IntRange& range);
  void addDouble(const std::string& name, double* target, const std::string& help, const std::string& valueName,
                 const RealRange& range);
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
    std::string name, help, valueName, defaultText, rangeText;
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

// Parses one integer the way an integer flag does (the whole text, base 10)
// and checks it against the range; `what` names it in the message
// ("each --nodes entry"). For list flags, whose entries are checked one by one.
int64_t parseIntIn(const std::string& what, const std::string& text, const IntRange& range,
                   int64_t typeMax = std::numeric_limits<int64_t>::max());
double parseRealIn(const std::string& what, const std::string& text, const RealRange& range);

// A boolean flag's value: "" (the bare flag), true/1/yes or false/0/no; anything else is a usage error
// naming --name.
bool parseBoolValue(const std::string& name, const std::string& value);

// A flag that picks another command's flag set (bench --accuracy, tune --regret): removes every
// "--name" and "--name=VALUE" from args and returns whether the last one switched the mode on. A bad
// value is the same usage error as any boolean flag's.
bool takeModeFlag(std::vector<std::string>& args, const std::string& name);

}  // namespace poseidon::cli
