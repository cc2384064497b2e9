#include "poseidon/data/fashion_mnist.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <random>
#include <utility>

#include "poseidon/common/error.h"

namespace poseidon {
namespace data {
namespace {

// Caps the payload a header may announce. Fashion-MNIST's largest file is
// 47 MB; the cap only exists so a corrupt header gives a clear error rather
// than a multi-gigabyte allocation or bad_alloc.
constexpr uint64_t kMaxPayloadBytes = uint64_t{1} << 32;

// gzread takes an unsigned length; read in chunks well below that.
constexpr size_t kReadChunk = size_t{1} << 24;

std::string notFoundMessage(const std::string& path) {
  return strCat("Fashion-MNIST not found at ", path,
                ": install it with 'apt-get install dataset-fashion-mnist' or pass --data DIR");
}

bool isDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool isRegularFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string joinPath(const std::string& dir, const std::string& name) {
  if (dir.empty() || dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

// Prefers <name>.gz (what the Debian package ships) and falls back to the
// uncompressed <name>, which is what many download scripts leave behind.
std::string findIdxFile(const std::string& dir, const std::string& name) {
  std::string gzPath = joinPath(dir, name + ".gz");
  if (isRegularFile(gzPath)) return gzPath;
  std::string rawPath = joinPath(dir, name);
  if (isRegularFile(rawPath)) return rawPath;
  throw InvalidArgument(notFoundMessage(gzPath));
}

// Reads one IDX file through zlib. gzopen reads uncompressed files
// transparently, so the same code serves both the .gz and the plain variant.
class IdxReader {
 public:
  explicit IdxReader(std::string path) : path_(std::move(path)) {
    errno = 0;
    file_ = ::gzopen(path_.c_str(), "rb");
    if (file_ == nullptr) {
      const char* why = errno != 0 ? std::strerror(errno) : "out of memory";
      throw InvalidArgument(strCat("cannot open Fashion-MNIST file ", path_, ": ", why));
    }
    // The default 8 KiB buffer makes the 47 MB image file noticeably slower.
    ::gzbuffer(file_, 1 << 17);
  }
  ~IdxReader() {
    if (file_ != nullptr) ::gzclose(file_);
  }
  IdxReader(const IdxReader&) = delete;
  IdxReader& operator=(const IdxReader&) = delete;

  const std::string& path() const { return path_; }

  // Reads the magic and the dimensions; checks the magic against `expected`.
  std::vector<uint32_t> readHeader(uint32_t expectedMagic) {
    uint32_t magic = readBigEndian32("magic number");
    if (magic != expectedMagic) {
      throw InvalidArgument(strCat("bad magic number in ", path_, ": expected 0x", hex(expectedMagic),
                                   ", got 0x", hex(magic), " (not an IDX file of the right kind)"));
    }
    const int ndims = static_cast<int>(magic & 0xff);
    std::vector<uint32_t> dims(ndims);
    for (int i = 0; i < ndims; ++i) dims[i] = readBigEndian32("dimension header");
    return dims;
  }

  // Fills `out` completely or throws, naming the file and what was short.
  void readExact(uint8_t* out, size_t n, const char* what) {
    size_t done = 0;
    while (done < n) {
      const unsigned want = static_cast<unsigned>(std::min(n - done, kReadChunk));
      const int got = ::gzread(file_, out + done, want);
      if (got < 0) throwCorrupt(what);
      if (got == 0) {
        // zlib reports a cut-off gzip stream as an error on the short read;
        // a cut-off plain file is just EOF. Either way the file is truncated.
        throw InvalidArgument(strCat("truncated Fashion-MNIST file ", path_, ": expected ", n,
                                     " bytes of ", what, ", got ", done, zlibDetail()));
      }
      done += static_cast<size_t>(got);
    }
  }

  // IDX sizes are exact, so extra bytes mean a wrong or damaged file. Reading
  // past the payload also makes zlib verify the gzip CRC and length trailer.
  void expectEnd() {
    uint8_t extra;
    const int got = ::gzread(file_, &extra, 1);
    if (got < 0) throwCorrupt("gzip trailer");
    if (got > 0) {
      throw InvalidArgument(strCat("Fashion-MNIST file ", path_,
                                   " has trailing bytes after the data its header announces"));
    }
    int code = Z_OK;
    ::gzerror(file_, &code);
    if (code != Z_OK) throwCorrupt("gzip trailer");
  }

 private:
  uint32_t readBigEndian32(const char* what) {
    uint8_t b[4];
    readExact(b, sizeof(b), what);
    return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | uint32_t{b[3]};
  }

  static std::string hex(uint32_t v) {
    static const char* kDigits = "0123456789abcdef";
    std::string s(8, '0');
    for (int i = 7; i >= 0; --i, v >>= 4) s[i] = kDigits[v & 0xf];
    return s;
  }

  std::string zlibDetail() {
    int code = Z_OK;
    const char* msg = ::gzerror(file_, &code);
    if (code == Z_OK || msg == nullptr || *msg == '\0') return "";
    // zlib prefixes its message with the path, which ours already names.
    std::string text = msg;
    const std::string prefix = path_ + ": ";
    if (text.compare(0, prefix.size(), prefix) == 0) text.erase(0, prefix.size());
    return strCat(" (zlib: ", text, ")");
  }

  [[noreturn]] void throwCorrupt(const char* what) {
    std::string detail = zlibDetail();
    // zlib flags a stream that simply stops early as Z_BUF_ERROR; call that
    // what it is so the user re-downloads instead of hunting for bit rot.
    int code = Z_OK;
    ::gzerror(file_, &code);
    const char* kind = code == Z_BUF_ERROR ? "truncated" : "corrupt";
    throw InvalidArgument(strCat(kind, " Fashion-MNIST file ", path_, " while reading ", what, detail));
  }

  std::string path_;
  gzFile file_ = nullptr;
};

uint32_t checkedDim(const IdxReader& reader, uint32_t value, const char* name) {
  if (value == 0 || value > static_cast<uint32_t>(INT_MAX)) {
    throw InvalidArgument(strCat("implausible ", name, " ", value, " in Fashion-MNIST file ", reader.path()));
  }
  return value;
}

// Uniform draw in [0, bound) by rejection. std::uniform_int_distribution is
// implementation-defined, so it would give different shards under libstdc++
// and libc++; this is fully specified: reject raw outputs below 2^64 mod
// bound, then reduce modulo bound.
uint64_t uniformBelow(std::mt19937_64& rng, uint64_t bound) {
  const uint64_t threshold = (uint64_t{0} - bound) % bound;
  for (;;) {
    const uint64_t r = rng();
    if (r >= threshold) return r % bound;
  }
}

}  // namespace

Dataset loadFashionMnist(const std::string& dir, bool train) {
  if (!isDirectory(dir)) {
    struct stat st;
    if (::stat(dir.c_str(), &st) == 0) {  // there, but a file: the directory holding it was meant
      throw InvalidArgument(strCat("Fashion-MNIST: ", dir,
                                   " is a file, not a directory (--data names the directory of the four IDX files)"));
    }
    throw InvalidArgument(notFoundMessage(dir));
  }
  const std::string prefix = train ? "train" : "t10k";
  const std::string imagesPath = findIdxFile(dir, prefix + "-images-idx3-ubyte");
  const std::string labelsPath = findIdxFile(dir, prefix + "-labels-idx1-ubyte");

  Dataset d;
  {
    IdxReader reader(imagesPath);
    std::vector<uint32_t> dims = reader.readHeader(kIdxImagesMagic);
    const uint64_t count = dims[0];
    const uint32_t rows = checkedDim(reader, dims[1], "row count");
    const uint32_t cols = checkedDim(reader, dims[2], "column count");
    // Each factor is below 2^31, so dividing first avoids overflow.
    if (count > kMaxPayloadBytes / (uint64_t{rows} * cols)) {
      throw InvalidArgument(strCat("implausible image dimensions ", count, "x", rows, "x", cols,
                                   " in Fashion-MNIST file ", imagesPath));
    }
    d.count = static_cast<int64_t>(count);
    d.rows = static_cast<int>(rows);
    d.cols = static_cast<int>(cols);
    d.pixels.resize(static_cast<size_t>(count * rows * cols));
    reader.readExact(d.pixels.data(), d.pixels.size(), "image data");
    reader.expectEnd();
  }
  {
    IdxReader reader(labelsPath);
    std::vector<uint32_t> dims = reader.readHeader(kIdxLabelsMagic);
    if (static_cast<int64_t>(dims[0]) != d.count) {
      throw InvalidArgument(strCat("Fashion-MNIST label count ", dims[0], " in ", labelsPath,
                                   " does not match image count ", d.count, " in ", imagesPath));
    }
    d.labels.resize(static_cast<size_t>(d.count));
    reader.readExact(d.labels.data(), d.labels.size(), "label data");
    reader.expectEnd();
    for (size_t i = 0; i < d.labels.size(); ++i) {
      if (d.labels[i] >= kFashionMnistClasses) {
        throw InvalidArgument(strCat("Fashion-MNIST label ", int{d.labels[i]}, " at index ", i, " in ",
                                     labelsPath, " is outside 0..", kFashionMnistClasses - 1));
      }
    }
  }
  return d;
}

void normalizeInto(const Dataset& d, int64_t index, float* out) {
  if (index < 0 || index >= d.count) {
    throw InvalidArgument(strCat("Fashion-MNIST index ", index, " out of range [0, ", d.count, ")"));
  }
  const int64_t n = int64_t{d.rows} * d.cols;
  const uint8_t* src = d.pixels.data() + index * n;
  // Multiplying by precomputed reciprocals would round differently from the
  // PyTorch transform; keep the plain formula so values match it exactly.
  for (int64_t i = 0; i < n; ++i) {
    out[i] = (static_cast<float>(src[i]) / 255.0f - kFashionMnistMean) / kFashionMnistStd;
  }
}

std::vector<int64_t> shardIndices(int64_t count, int worldSize, int rank, uint64_t seed, int64_t epoch,
                                  bool shuffle) {
  if (count < 0) throw InvalidArgument(strCat("shardIndices: dataset size must be >= 0, got ", count));
  if (worldSize < 1) throw InvalidArgument(strCat("shardIndices: world size must be >= 1, got ", worldSize));
  if (rank < 0 || rank >= worldSize) {
    throw InvalidArgument(strCat("shardIndices: rank ", rank, " is outside [0, ", worldSize, ")"));
  }
  if (count == 0) return {};

  std::vector<int64_t> order(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) order[i] = i;
  if (shuffle) {
    // Every rank builds the same permutation from the shared seed, so the
    // shards are disjoint without any communication. Seeding with seed+epoch
    // mirrors DistributedSampler.set_epoch; unsigned wrap-around is intended.
    std::mt19937_64 rng(seed + static_cast<uint64_t>(epoch));
    // Fisher-Yates from the back: for i = n-1 .. 1 swap order[i] with
    // order[j], j uniform in [0, i]. Written out (not std::shuffle) because
    // std::shuffle's draw sequence differs between standard libraries.
    for (int64_t i = count - 1; i > 0; --i) {
      const int64_t j = static_cast<int64_t>(uniformBelow(rng, static_cast<uint64_t>(i) + 1));
      std::swap(order[i], order[j]);
    }
  }

  // Pad by wrapping so every rank runs the same number of steps; otherwise
  // the ranks with fewer samples would hang the last synchronous round.
  const int64_t perRank = (count + worldSize - 1) / worldSize;
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(perRank));
  for (int64_t k = 0; k < perRank; ++k) {
    const int64_t pos = rank + k * worldSize;  // position in the padded order
    mine.push_back(order[pos % count]);
  }
  return mine;
}

}  // namespace data
}  // namespace poseidon
