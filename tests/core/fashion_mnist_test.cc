// Tests for the LibTorch-free Fashion-MNIST loader and the distributed sampler.
//
// The real-data tests read the files that the Debian package
// dataset-fashion-mnist installs; the error tests write small IDX files of
// their own to a temporary directory.
#include "poseidon/data/fashion_mnist.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "expect_error.h"
#include "poseidon/common/error.h"

namespace poseidon {
namespace data {
namespace {

namespace fs = std::filesystem;

// A fresh directory under the system temp dir, removed with its contents.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "poseidon_fm_XXXXXX").string();
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return (fs::path(path_) / name).string(); }

 private:
  std::string path_;
};

void putBigEndian32(std::vector<uint8_t>& out, uint32_t v) {
  out.push_back(static_cast<uint8_t>(v >> 24));
  out.push_back(static_cast<uint8_t>(v >> 16));
  out.push_back(static_cast<uint8_t>(v >> 8));
  out.push_back(static_cast<uint8_t>(v));
}

std::vector<uint8_t> idxBytes(uint32_t magic, const std::vector<uint32_t>& dims,
                              const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> out;
  putBigEndian32(out, magic);
  for (uint32_t d : dims) putBigEndian32(out, d);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

void writeRaw(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

void writeGz(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

std::vector<uint8_t> readRaw(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// Reads the first `n` decompressed bytes of a gz file, independently of the
// loader, so the expectations below come from the file and not from it.
std::vector<uint8_t> gzPrefix(const std::string& path, size_t n) {
  std::vector<uint8_t> out(n);
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) return {};
  const int got = gzread(f, out.data(), static_cast<unsigned>(n));
  gzclose(f);
  out.resize(got < 0 ? 0 : static_cast<size_t>(got));
  return out;
}

// A small synthetic split: `count` 4x4 images with varied bytes (so gzip
// cannot squeeze them to a handful of bytes) and labels cycling 0..9.
struct Synthetic {
  std::vector<uint8_t> images;
  std::vector<uint8_t> labels;
};

Synthetic makeSynthetic(uint32_t count) {
  std::vector<uint8_t> pixels(count * 16);
  uint32_t x = 12345;
  for (auto& p : pixels) {
    x = x * 1103515245u + 12345u;
    p = static_cast<uint8_t>(x >> 16);
  }
  std::vector<uint8_t> labels(count);
  for (uint32_t i = 0; i < count; ++i) labels[i] = static_cast<uint8_t>(i % 10);
  return {idxBytes(kIdxImagesMagic, {count, 4, 4}, pixels), idxBytes(kIdxLabelsMagic, {count}, labels)};
}

void writeSplit(const TempDir& dir, const std::string& prefix, const Synthetic& s, bool gz) {
  const std::string images = dir.file(prefix + "-images-idx3-ubyte" + (gz ? ".gz" : ""));
  const std::string labels = dir.file(prefix + "-labels-idx1-ubyte" + (gz ? ".gz" : ""));
  if (gz) {
    writeGz(images, s.images);
    writeGz(labels, s.labels);
  } else {
    writeRaw(images, s.images);
    writeRaw(labels, s.labels);
  }
}

// ---- real data -------------------------------------------------------------

void expectBalancedSplit(const Dataset& d, int64_t count, int64_t perClass) {
  EXPECT_EQ(d.count, count);
  EXPECT_EQ(d.rows, 28);
  EXPECT_EQ(d.cols, 28);
  EXPECT_EQ(static_cast<int64_t>(d.pixels.size()), count * 28 * 28);
  ASSERT_EQ(static_cast<int64_t>(d.labels.size()), count);
  std::array<int64_t, 10> histogram{};
  for (uint8_t label : d.labels) {
    ASSERT_LT(label, 10);
    ++histogram[label];
  }
  for (int c = 0; c < 10; ++c) EXPECT_EQ(histogram[c], perClass) << "class " << c;
}

TEST(FashionMnistTest, LoadsTrainSet) {
  Dataset d = loadFashionMnist(kDefaultFashionMnistDir, /*train=*/true);
  expectBalancedSplit(d, 60000, 6000);
}

TEST(FashionMnistTest, LoadsTestSet) {
  Dataset d = loadFashionMnist(kDefaultFashionMnistDir, /*train=*/false);
  expectBalancedSplit(d, 10000, 1000);
}

TEST(FashionMnistTest, FirstTrainExampleMatchesRawFile) {
  const std::string dir = kDefaultFashionMnistDir;
  // Label file: 4-byte magic + 4-byte count, then the first label.
  std::vector<uint8_t> rawLabels = gzPrefix(dir + "/train-labels-idx1-ubyte.gz", 9);
  ASSERT_EQ(rawLabels.size(), 9u);
  ASSERT_EQ(rawLabels[3], 0x01);
  // Image file: magic + 3 dims (16 bytes), then the first 28*28 image.
  std::vector<uint8_t> rawImages = gzPrefix(dir + "/train-images-idx3-ubyte.gz", 16 + 28 * 28);
  ASSERT_EQ(rawImages.size(), 16u + 28 * 28);

  Dataset d = loadFashionMnist(dir, /*train=*/true);
  EXPECT_EQ(d.labels[0], rawLabels[8]);
  EXPECT_TRUE(std::equal(rawImages.begin() + 16, rawImages.end(), d.pixels.begin()));
}

TEST(FashionMnistTest, NormalizeMatchesFormula) {
  Dataset d = loadFashionMnist(kDefaultFashionMnistDir, /*train=*/true);
  const int64_t n = int64_t{d.rows} * d.cols;
  // Use a pixel that is not background, so the test exercises the scaling.
  const int64_t index = 7;
  const uint8_t* image = d.pixels.data() + index * n;
  const int64_t p = std::max_element(image, image + n) - image;
  ASSERT_GT(image[p], 0);

  std::vector<float> out(static_cast<size_t>(n), -1e9f);
  normalizeInto(d, index, out.data());
  EXPECT_FLOAT_EQ(out[p], (image[p] / 255.0f - 0.2860f) / 0.3530f);
  // A background pixel maps to -mean/std.
  const int64_t zero = std::find(image, image + n, uint8_t{0}) - image;
  ASSERT_LT(zero, n);
  EXPECT_FLOAT_EQ(out[zero], -0.2860f / 0.3530f);

  EXPECT_NE(invalidArgumentMessage([&] { normalizeInto(d, d.count, out.data()); }), "");
  EXPECT_NE(invalidArgumentMessage([&] { normalizeInto(d, -1, out.data()); }), "");
}

// ---- sampler ---------------------------------------------------------------

TEST(ShardIndicesTest, RanksCoverEveryIndexWithEqualShares) {
  for (int64_t count : {int64_t{1}, int64_t{3}, int64_t{12}, int64_t{10007}}) {
    for (int world : {1, 4, 5}) {
      const int64_t perRank = (count + world - 1) / world;
      std::vector<int> seen(static_cast<size_t>(count), 0);
      for (int r = 0; r < world; ++r) {
        std::vector<int64_t> mine = shardIndices(count, world, r, /*seed=*/42, /*epoch=*/3);
        ASSERT_EQ(static_cast<int64_t>(mine.size()), perRank) << "count " << count << " world " << world;
        for (int64_t i : mine) {
          ASSERT_GE(i, 0);
          ASSERT_LT(i, count);
          ++seen[static_cast<size_t>(i)];
        }
      }
      // Every index appears; padding repeats exactly perRank*world - count.
      int64_t extra = 0;
      for (int s : seen) {
        ASSERT_GE(s, 1);
        extra += s - 1;
      }
      EXPECT_EQ(extra, perRank * world - count) << "count " << count << " world " << world;
    }
  }
}

TEST(ShardIndicesTest, SingleRankGetsAPermutation) {
  std::vector<int64_t> all = shardIndices(1000, 1, 0, 7, 0);
  std::vector<int64_t> sorted = all;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[i], i);
  std::vector<int64_t> identity(1000);
  for (int64_t i = 0; i < 1000; ++i) identity[i] = i;
  EXPECT_NE(all, identity);
}

TEST(ShardIndicesTest, DeterministicPerSeedAndEpoch) {
  const int64_t count = 60000;
  EXPECT_EQ(shardIndices(count, 4, 2, 1234, 5), shardIndices(count, 4, 2, 1234, 5));
  EXPECT_NE(shardIndices(count, 4, 2, 1234, 5), shardIndices(count, 4, 2, 1234, 6));
  EXPECT_NE(shardIndices(count, 4, 2, 1234, 5), shardIndices(count, 4, 2, 1235, 5));
  EXPECT_NE(shardIndices(count, 4, 0, 1234, 0), shardIndices(count, 4, 0, 1234, 1));
}

TEST(ShardIndicesTest, PinnedPermutation) {
  // Pins the exact draw (mt19937_64 + rejection + Fisher-Yates from the back).
  // Every rank, and a job resumed by a later build, must agree on it; if this
  // changes, the sampler is no longer compatible with earlier runs. The value
  // was cross-checked against an independent Python mt19937_64.
  EXPECT_EQ(shardIndices(10, 1, 0, /*seed=*/0, /*epoch=*/0),
            (std::vector<int64_t>{7, 2, 0, 8, 3, 9, 6, 1, 5, 4}));
}

TEST(ShardIndicesTest, NoShuffleIsStrided) {
  const int64_t count = 10;
  const int world = 4;
  // Padded order is 0..9,0,1; rank r takes r, r+4, r+8 (mod 10).
  EXPECT_EQ(shardIndices(count, world, 0, 99, 0, false), (std::vector<int64_t>{0, 4, 8}));
  EXPECT_EQ(shardIndices(count, world, 1, 99, 0, false), (std::vector<int64_t>{1, 5, 9}));
  EXPECT_EQ(shardIndices(count, world, 2, 99, 0, false), (std::vector<int64_t>{2, 6, 0}));
  EXPECT_EQ(shardIndices(count, world, 3, 99, 7, false), (std::vector<int64_t>{3, 7, 1}));
  EXPECT_TRUE(shardIndices(0, world, 0, 99, 0).empty());
}

TEST(ShardIndicesTest, RejectsBadWorld) {
  EXPECT_NE(invalidArgumentMessage([] { shardIndices(10, 0, 0, 1, 0); }).find("world size"), std::string::npos);
  EXPECT_NE(invalidArgumentMessage([] { shardIndices(10, 4, 4, 1, 0); }).find("rank 4"), std::string::npos);
  EXPECT_NE(invalidArgumentMessage([] { shardIndices(10, 4, -1, 1, 0); }).find("rank -1"), std::string::npos);
  EXPECT_NE(invalidArgumentMessage([] { shardIndices(-1, 4, 0, 1, 0); }), "");
}

// ---- errors and synthetic files ---------------------------------------------

TEST(FashionMnistErrorTest, MissingDirectoryExplainsHowToInstall) {
  TempDir tmp;
  const std::string missing = tmp.file("no_such_dir");
  std::string msg = invalidArgumentMessage([&] { loadFashionMnist(missing, true); });
  EXPECT_NE(msg.find("apt-get install dataset-fashion-mnist"), std::string::npos) << msg;
  EXPECT_NE(msg.find(missing), std::string::npos) << msg;
  EXPECT_NE(msg.find("--data DIR"), std::string::npos) << msg;
}

TEST(FashionMnistErrorTest, MissingFileNamesIt) {
  TempDir tmp;
  writeSplit(tmp, "train", makeSynthetic(20), /*gz=*/true);
  // The test split is absent.
  std::string msg = invalidArgumentMessage([&] { loadFashionMnist(tmp.path(), false); });
  EXPECT_NE(msg.find("t10k-images-idx3-ubyte"), std::string::npos) << msg;
  EXPECT_NE(msg.find("apt-get install dataset-fashion-mnist"), std::string::npos) << msg;
}

TEST(FashionMnistErrorTest, LoadsSyntheticGzAndPlainFiles) {
  Synthetic s = makeSynthetic(20);
  for (bool gz : {true, false}) {
    TempDir tmp;
    writeSplit(tmp, "t10k", s, gz);
    Dataset d = loadFashionMnist(tmp.path() + "/", false);  // trailing slash is fine
    EXPECT_EQ(d.count, 20);
    EXPECT_EQ(d.rows, 4);
    EXPECT_EQ(d.cols, 4);
    EXPECT_TRUE(std::equal(d.pixels.begin(), d.pixels.end(), s.images.begin() + 16));
    EXPECT_TRUE(std::equal(d.labels.begin(), d.labels.end(), s.labels.begin() + 8));
  }
}

TEST(FashionMnistErrorTest, TruncatedGzNamesTheFile) {
  TempDir tmp;
  writeSplit(tmp, "train", makeSynthetic(200), /*gz=*/true);
  const std::string images = tmp.file("train-images-idx3-ubyte.gz");
  std::vector<uint8_t> bytes = readRaw(images);
  ASSERT_GT(bytes.size(), 100u);
  bytes.resize(bytes.size() / 2);
  writeRaw(images, bytes);
  std::string msg = invalidArgumentMessage([&] { loadFashionMnist(tmp.path(), true); });
  EXPECT_NE(msg.find(images), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
}

TEST(FashionMnistErrorTest, GzMissingOnlyItsTrailerIsRejected) {
  // All data present but the CRC/length trailer cut off: the stream cannot be
  // verified, so the loader must not accept it silently.
  TempDir tmp;
  writeSplit(tmp, "train", makeSynthetic(200), /*gz=*/true);
  const std::string labels = tmp.file("train-labels-idx1-ubyte.gz");
  std::vector<uint8_t> bytes = readRaw(labels);
  bytes.resize(bytes.size() - 8);
  writeRaw(labels, bytes);
  std::string msg = invalidArgumentMessage([&] { loadFashionMnist(tmp.path(), true); });
  EXPECT_NE(msg.find(labels), std::string::npos) << msg;
}

TEST(FashionMnistErrorTest, TruncatedPlainFileNamesTheFile) {
  TempDir tmp;
  Synthetic s = makeSynthetic(20);
  s.labels.resize(s.labels.size() - 3);
  writeSplit(tmp, "train", s, /*gz=*/false);
  std::string msg = invalidArgumentMessage([&] { loadFashionMnist(tmp.path(), true); });
  EXPECT_NE(msg.find(tmp.file("train-labels-idx1-ubyte")), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
}

TEST(FashionMnistErrorTest, BadMagicNamesTheFile) {
  TempDir tmp;
  Synthetic s = makeSynthetic(20);
  // Swap the files' roles: the image file now carries the label magic.
  std::swap(s.images, s.labels);
  writeSplit(tmp, "train", s, /*gz=*/true);
  std::string msg = invalidArgumentMessage([&] { loadFashionMnist(tmp.path(), true); });
  EXPECT_NE(msg.find("magic"), std::string::npos) << msg;
  EXPECT_NE(msg.find(tmp.file("train-images-idx3-ubyte.gz")), std::string::npos) << msg;
}

TEST(FashionMnistErrorTest, CountMismatchNamesBothFiles) {
  TempDir tmp;
  Synthetic s = makeSynthetic(20);
  s.labels = makeSynthetic(19).labels;
  writeSplit(tmp, "train", s, /*gz=*/true);
  std::string msg = invalidArgumentMessage([&] { loadFashionMnist(tmp.path(), true); });
  EXPECT_NE(msg.find("does not match"), std::string::npos) << msg;
  EXPECT_NE(msg.find(tmp.file("train-labels-idx1-ubyte.gz")), std::string::npos) << msg;
}

TEST(FashionMnistErrorTest, TrailingBytesAndBadLabelsAreRejected) {
  {
    TempDir tmp;
    Synthetic s = makeSynthetic(20);
    s.images.push_back(0);
    writeSplit(tmp, "train", s, /*gz=*/true);
    std::string msg = invalidArgumentMessage([&] { loadFashionMnist(tmp.path(), true); });
    EXPECT_NE(msg.find("trailing"), std::string::npos) << msg;
  }
  {
    TempDir tmp;
    Synthetic s = makeSynthetic(20);
    s.labels.back() = 10;
    writeSplit(tmp, "train", s, /*gz=*/true);
    std::string msg = invalidArgumentMessage([&] { loadFashionMnist(tmp.path(), true); });
    EXPECT_NE(msg.find("label 10"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace data
}  // namespace poseidon
