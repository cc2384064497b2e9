// The CLI's flag parser: ranges are checked at parse time and every message
// names the flag and what it accepts; the help text shows the same ranges.
#include "poseidon/cli/flags.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "expect_error.h"

namespace poseidon::cli {
namespace {

using ::testing::HasSubstr;

struct Values {
  int workers = 4, threads = 0, servers = -1;
  int64_t batch = 64, maxSteps = -1;
  double momentum = 0.9, scale = 0.1, lr = 0.05;
  std::string summary;
};

FlagSet makeFlags(Values& v) {
  FlagSet f("train", "poseidon train [flags]", "test flags");
  f.addInt("workers", &v.workers, "workers", "N", IntRange::closed(1, 65536));
  f.addInt("threads", &v.threads, "threads", "N", IntRange::atLeast(0));
  f.addInt("servers", &v.servers, "servers (default: as many as --workers)", "N", IntRange::closed(1, 65536));
  f.addInt64("batch", &v.batch, "batch", "K", IntRange::closed(1, 1 << 24));
  f.addInt64("max-steps", &v.maxSteps, "steps (-1: no limit)", "N", IntRange::atLeast(1).orOff(-1));
  f.addDouble("momentum", &v.momentum, "momentum", "M", RealRange::rightOpen(0, 1));
  f.addDouble("width-scale", &v.scale, "scale", "S", RealRange::leftOpen(0, 1));
  f.addDouble("lr", &v.lr, "lr", "LR", RealRange::above(0));
  f.addString("summary", &v.summary, "summary file", "FILE");
  return f;
}

std::string parseError(const std::vector<std::string>& args) {
  Values v;
  FlagSet f = makeFlags(v);
  return invalidArgumentMessage([&] { f.parse(args); });
}

TEST(Flags, ValuesInsideTheRangesAreTaken) {
  Values v;
  FlagSet f = makeFlags(v);
  f.parse({"--workers", "65536", "--threads=0", "--batch", "1", "--max-steps", "-1", "--momentum", "0", "--width-scale",
           "1", "--lr", "1e-9"});
  EXPECT_EQ(v.workers, 65536);
  EXPECT_EQ(v.threads, 0);
  EXPECT_EQ(v.batch, 1);
  EXPECT_EQ(v.maxSteps, -1);
  EXPECT_EQ(v.momentum, 0);
  EXPECT_EQ(v.scale, 1);
  EXPECT_TRUE(f.wasSet("lr"));
  EXPECT_FALSE(f.wasSet("servers"));
}

TEST(Flags, OutOfRangeValuesNameTheFlagAndItsRange) {
  EXPECT_EQ(parseError({"--workers", "0"}), "--workers must be in [1, 65536], got 0");
  EXPECT_EQ(parseError({"--workers=65537"}), "--workers must be in [1, 65536], got 65537");
  EXPECT_EQ(parseError({"--threads", "-1"}), "--threads must be >= 0, got -1");
  EXPECT_EQ(parseError({"--batch", "16777217"}), "--batch must be in [1, 16777216], got 16777217");
  EXPECT_EQ(parseError({"--max-steps", "0"}), "--max-steps must be -1 or >= 1, got 0");
  EXPECT_EQ(parseError({"--max-steps", "-2"}), "--max-steps must be -1 or >= 1, got -2");
  EXPECT_EQ(parseError({"--momentum", "1"}), "--momentum must be in [0, 1), got 1");
  EXPECT_EQ(parseError({"--momentum", "-0.1"}), "--momentum must be in [0, 1), got -0.1");
  EXPECT_EQ(parseError({"--width-scale", "0"}), "--width-scale must be in (0, 1], got 0");
  EXPECT_EQ(parseError({"--lr", "0"}), "--lr must be > 0, got 0");
  // An int flag holds no more than an int, whatever its range.
  EXPECT_EQ(parseError({"--threads", "3000000000"}), "--threads must be at most 2147483647, got 3000000000");
  // Beyond 64 bits or a double's range: still a number, so the bound it passed, not "expects a number".
  EXPECT_EQ(parseError({"--threads", "99999999999999999999"}),
            "--threads must be at most 2147483647, got 99999999999999999999");
  EXPECT_EQ(parseError({"--max-steps", "-99999999999999999999"}),
            "--max-steps must be -1 or >= 1, got -99999999999999999999");
  EXPECT_EQ(parseError({"--lr", "1e999"}), "--lr must be a finite number, got 1e999 (beyond a double's range)");
  // Below a normal double: not read as 0 ("off") or -0 (which [0, 1) would take).
  EXPECT_EQ(parseError({"--lr", "1e-400"}), "--lr must be > 0, got 1e-400 (too close to 0 for a double)");
  EXPECT_EQ(parseError({"--momentum", "-1e-400"}),
            "--momentum must be in [0, 1), got -1e-400 (too close to 0 for a double)");
  EXPECT_EQ(parseError({"--workers", "3000000000"}), "--workers must be at most 65536, got 3000000000");
  EXPECT_EQ(parseError({"--momentum", "-1e999"}),
            "--momentum must be a finite number, got -1e999 (beyond a double's range)");
}

TEST(Flags, MalformedValuesKeepTheirMessages) {
  EXPECT_EQ(parseError({"--batch", "many"}), "--batch expects an integer, got 'many'");
  EXPECT_EQ(parseError({"--workers", "4x"}), "--workers expects an integer, got '4x'");
  EXPECT_EQ(parseError({"--lr", "fast"}), "--lr expects a number, got 'fast'");
  EXPECT_EQ(parseError({"--lr", "inf"}), "--lr expects a number, got 'inf'");
  EXPECT_EQ(parseError({"--epoch", "3"}), "unknown flag --epoch for 'poseidon train' (see 'poseidon train --help')");
  EXPECT_EQ(parseError({"--workers"}), "flag --workers needs a value (N)");
}

// A path flag followed by another flag is missing its value: "--summary --lr 1"
// once wrote the summary to a file named "--lr" and then refused "1".
TEST(Flags, AFlagIsNotTakenAsTheValueOfTheFlagBeforeIt) {
  EXPECT_EQ(parseError({"--summary", "--lr", "1"}),
            "flag --summary needs a value (FILE), got the flag --lr (write --summary=--lr for a value that starts "
            "with --)");
  EXPECT_EQ(parseError({"--summary", "--workers=2"}),
            "flag --summary needs a value (FILE), got the flag --workers=2 (write --summary=--workers=2 for a value "
            "that starts with --)");
  Values v;
  FlagSet f = makeFlags(v);
  f.parse({"--summary=--lr", "--workers", "2"});  // the explicit form still takes it
  EXPECT_EQ(v.summary, "--lr");
  EXPECT_EQ(v.workers, 2);
  Values w;
  FlagSet g = makeFlags(w);
  g.parse({"--summary", "--not-a-flag.json"});  // not one of the command's flags: a value
  EXPECT_EQ(w.summary, "--not-a-flag.json");
}

TEST(Flags, HelpShowsRangesAndHidesPlaceholderDefaults) {
  Values v;
  std::string help = makeFlags(v).helpText();
  EXPECT_THAT(help, HasSubstr("--workers N               workers (in [1, 65536]; default: 4)\n"));
  EXPECT_THAT(help, HasSubstr("--max-steps N             steps (-1: no limit) (-1 or >= 1; default: -1)\n"));
  EXPECT_THAT(help, HasSubstr("--momentum M              momentum (in [0, 1); default: 0.9)\n"));
  EXPECT_THAT(help, HasSubstr("--lr LR                   lr (> 0; default: 0.05)\n"));
  // -1 is not a server count but "as many as --workers", which the help says in words.
  EXPECT_THAT(help, HasSubstr("--servers N               servers (default: as many as --workers) (in [1, 65536])\n"));
}

TEST(Flags, ListEntriesAreCheckedLikeFlags) {
  EXPECT_EQ(parseIntIn("each --nodes entry", "8", IntRange::closed(1, 64)), 8);
  EXPECT_EQ(invalidArgumentMessage([] { parseIntIn("each --nodes entry", "65", IntRange::closed(1, 64)); }),
            "each --nodes entry must be in [1, 64], got 65");
  EXPECT_EQ(invalidArgumentMessage([] { parseIntIn("each --nodes entry", "8x", IntRange::closed(1, 64)); }),
            "each --nodes entry expects an integer, got '8x'");
  EXPECT_EQ(parseRealIn("each --rates entry", "2.5", RealRange::above(0)), 2.5);
  EXPECT_EQ(invalidArgumentMessage([] { parseRealIn("each --rates entry", "-3", RealRange::above(0)); }),
            "each --rates entry must be > 0, got -3");
}

}  // namespace
}  // namespace poseidon::cli
