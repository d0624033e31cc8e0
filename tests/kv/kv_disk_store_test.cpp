// KvDiskStore, the prefix cache's SSD tier: round trip, the documented file format (checked byte by
// byte with an independent reader), restart persistence, every damage mode (each byte flipped, each
// truncation length, foreign files, other models and layouts, renamed files, forged chains), LRU
// eviction under the size budget (also across a restart), interrupted writes, and concurrent use.
#include "kv/kv_disk_store.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include "core/checksum.h"
#include "io/config.h"
#include "model/layer_plan.h"

namespace cedar {
namespace {

namespace fs = std::filesystem;

const std::string kFingerprint(64, 'f');

// Small, odd-sized streams so offsets are not accidentally aligned.
KvDiskLayout small_layout() { return KvDiskLayout{4, {{8, 2}, {3, 4}, {5, 1}}}; }

StoredPrefixBlock make_block(const PrefixKey& parent, int64_t first_token, uint32_t seed,
                             const KvDiskLayout& layout = small_layout(), bool exact = true) {
  StoredPrefixBlock b;
  b.parent = parent;
  for (int64_t i = 0; i < layout.tokens_per_block; ++i) b.tokens.push_back(first_token + i * 1000003);
  b.key = prefix_chain(parent, b.tokens);
  b.exact = exact;
  std::mt19937 rng(seed);
  for (const KvDiskStreamLayout& s : layout.streams) {
    std::vector<uint8_t> bytes(static_cast<size_t>(s.block_bytes()));
    for (auto& x : bytes) x = static_cast<uint8_t>(rng());
    b.streams.push_back(std::move(bytes));
  }
  return b;
}

// A chain of n blocks from one root.
std::vector<StoredPrefixBlock> chain(int n, const KvDiskLayout& layout = small_layout()) {
  std::vector<StoredPrefixBlock> blocks;
  PrefixKey parent = prefix_root(kFingerprint, "test-layout");
  for (int i = 0; i < n; ++i) {
    blocks.push_back(make_block(parent, 100 * i, static_cast<uint32_t>(i), layout));
    parent = blocks.back().key;
  }
  return blocks;
}

void expect_same(const StoredPrefixBlock& a, const StoredPrefixBlock& b) {
  EXPECT_EQ(a.key, b.key);
  EXPECT_EQ(a.parent, b.parent);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.exact, b.exact);
  EXPECT_EQ(a.streams, b.streams);
}

std::vector<uint8_t> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}
void write_bytes(const fs::path& p, std::span<const uint8_t> bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}
uint64_t le(const std::vector<uint8_t>& b, size_t at, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | b[at + static_cast<size_t>(i)];
  return v;
}
void put_le(std::vector<uint8_t>& b, size_t at, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) b[at + static_cast<size_t>(i)] = static_cast<uint8_t>(v >> (8 * i));
}

// Block files on disk (not the lock, not temporaries).
std::vector<fs::path> block_files(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && e.path().extension() == ".kvb" && !e.path().filename().string().starts_with("."))
      files.push_back(e.path());
  return files;
}

class KvDiskStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("cedar-kvdisk-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  KvDiskStoreOptions options(int64_t budget = 1 << 30, const KvDiskLayout& layout = small_layout(),
                             const std::string& fingerprint = kFingerprint) {
    KvDiskStoreOptions o;
    o.dir = dir_;
    o.budget_bytes = budget;
    o.model_fingerprint = fingerprint;
    o.layout = layout;
    o.log = [this](const std::string& line) {
      std::lock_guard lock(log_mu_);
      log_.push_back(line);
    };
    return o;
  }
  std::unique_ptr<KvDiskStore> open(const KvDiskStoreOptions& o) {
    auto s = KvDiskStore::open(o);
    EXPECT_TRUE(s.ok()) << s.error().message;
    return s.ok() ? std::move(*s) : nullptr;
  }
  std::vector<std::string> logged() {
    std::lock_guard lock(log_mu_);
    return log_;
  }
  int64_t file_bytes() const { return kv_disk_file_layout(small_layout(), kFingerprint).file_bytes; }

  fs::path dir_;
  std::mutex log_mu_;
  std::vector<std::string> log_;
};

TEST_F(KvDiskStoreTest, RoundTrip) {
  auto store = open(options());
  ASSERT_TRUE(store);
  auto blocks = chain(3);
  blocks[1].exact = false;
  for (const auto& b : blocks) ASSERT_TRUE(store->put(b).ok());
  for (const auto& b : blocks) {
    EXPECT_TRUE(store->contains(b.key));
    auto got = store->get(b.key);
    ASSERT_TRUE(got.has_value());
    expect_same(*got, b);
  }
  EXPECT_FALSE(store->get(PrefixKey{1, 2}).has_value());
  EXPECT_FALSE(store->contains(PrefixKey{1, 2}));
  const KvDiskStoreStats s = store->stats();
  EXPECT_EQ(s.files, 3);
  EXPECT_EQ(s.bytes, 3 * file_bytes());
  EXPECT_EQ(s.puts, 3);
  EXPECT_EQ(s.gets, 4);
  EXPECT_EQ(s.hits, 3);
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.corrupt, 0);
  EXPECT_EQ(s.bytes_written, 3 * file_bytes());
  EXPECT_EQ(s.bytes_read, 3 * file_bytes());
  EXPECT_EQ(block_files(dir_).size(), 3u);
  // A block stored again is not rewritten, unless an exact copy replaces an approximate one.
  ASSERT_TRUE(store->put(blocks[0]).ok());
  ASSERT_TRUE(store->put(blocks[1]).ok());
  EXPECT_EQ(store->stats().puts, 3);
  EXPECT_EQ(store->stats().puts_skipped, 2);
  StoredPrefixBlock upgraded = blocks[1];
  upgraded.exact = true;
  ASSERT_TRUE(store->put(upgraded).ok());
  EXPECT_EQ(store->stats().puts, 4);
  EXPECT_EQ(store->stats().files, 3);
  auto got = store->get(blocks[1].key);
  ASSERT_TRUE(got.has_value());
  EXPECT_TRUE(got->exact);
  // An approximate copy never replaces an exact one.
  ASSERT_TRUE(store->put(blocks[1]).ok());
  EXPECT_EQ(store->stats().puts, 4);
  EXPECT_TRUE(store->get(blocks[1].key)->exact);
}

TEST_F(KvDiskStoreTest, FileHasTheDocumentedFormat) {
  auto store = open(options());
  ASSERT_TRUE(store);
  StoredPrefixBlock b = make_block(PrefixKey{0x0123456789abcdefull, 0xfedcba9876543210ull}, 7, 1);
  b.exact = false;
  ASSERT_TRUE(store->put(b).ok());
  const std::string hex = b.key.hex();
  const fs::path path = dir_ / hex.substr(0, 2) / (hex + ".kvb");
  EXPECT_EQ(store->path_of(b.key), path);
  const std::vector<uint8_t> f = read_bytes(path);
  // Sizes written out from the format description: 72 + 64 (fingerprint) + 3·8 (streams) + 4·8 (tokens).
  const size_t H = 192, P = 2 * 8 + 4 * 3 + 1 * 5;
  ASSERT_EQ(f.size(), H + P + 4);
  EXPECT_EQ(std::string(f.begin(), f.begin() + 8), "CEDARKVB");
  EXPECT_EQ(le(f, 8, 4), 1u);
  EXPECT_EQ(le(f, 12, 4), H);
  EXPECT_EQ(le(f, 16, 8), P);
  EXPECT_EQ(le(f, 24, 8), b.key.hi);
  EXPECT_EQ(le(f, 32, 8), b.key.lo);
  EXPECT_EQ(le(f, 40, 8), b.parent.hi);
  EXPECT_EQ(le(f, 48, 8), b.parent.lo);
  EXPECT_EQ(le(f, 56, 4), 4u);
  EXPECT_EQ(le(f, 60, 4), 3u);
  EXPECT_EQ(le(f, 64, 4), 0u);  // not exact
  EXPECT_EQ(le(f, 68, 4), 64u);
  EXPECT_EQ(std::string(f.begin() + 72, f.begin() + 136), kFingerprint);
  const uint64_t streams[3][2] = {{8, 2}, {3, 4}, {5, 1}};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(le(f, 136 + 8 * i, 4), streams[i][0]);
    EXPECT_EQ(le(f, 140 + 8 * i, 4), streams[i][1]);
  }
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(static_cast<int64_t>(le(f, 160 + 8 * i, 8)), b.tokens[i]);
  std::vector<uint8_t> records;
  for (const auto& s : b.streams) records.insert(records.end(), s.begin(), s.end());
  EXPECT_TRUE(std::equal(records.begin(), records.end(), f.begin() + H));
  EXPECT_EQ(le(f, H + P, 4), crc32c(std::span<const uint8_t>(f.data(), H + P)));
  const KvDiskFileLayout fl = store->file_layout();
  EXPECT_EQ(fl.header_bytes, static_cast<int64_t>(H));
  EXPECT_EQ(fl.record_bytes, static_cast<int64_t>(P));
  EXPECT_EQ(fl.file_bytes, static_cast<int64_t>(f.size()));
}

// The released layouts, from the spec's record sizes (architecture.md §3.12, docs/kv.md): V4.1-Flash has
// 4 KV sources (layers 2, 8, 14 at ratio 2, layer 20 at ratio 1), each with a 288-byte main-KV record
// and a 68-byte indexer key; V4-Flash has 21 ratio-4 sources (584 + 68 bytes) and 20 ratio-128 sources
// (584 bytes, no indexer), cached in 128-token blocks (its largest ratio).
TEST(KvDiskLayoutFor, ReleasedConfigs) {
  const std::string configs = std::string(CEDAR_TEST_DATA_DIR) + "/configs/";
  auto v41 = load_model_config(configs + "deepseek_v41_flash");
  ASSERT_TRUE(v41.ok()) << v41.error().message;
  auto v41_plan = build_layer_plan(*v41);
  ASSERT_TRUE(v41_plan.ok());
  auto l41 = kv_disk_layout_for(*v41, *v41_plan, 64);
  ASSERT_TRUE(l41.ok()) << l41.error().message;
  const std::vector<KvDiskStreamLayout> expected41 = {{288, 32}, {68, 32}, {288, 32}, {68, 32},
                                                      {288, 32}, {68, 32}, {288, 64}, {68, 64}};
  EXPECT_EQ(l41->streams, expected41);
  EXPECT_EQ(l41->record_bytes(), 890 * 64);
  // 72 fixed + 64 fingerprint + 8·8 streams + 64·8 tokens = 712 header bytes, + 4 checksum bytes.
  EXPECT_EQ(kv_disk_file_layout(*l41, std::string(64, '0')).file_bytes, 712 + 890 * 64 + 4);

  auto v4 = load_model_config(configs + "deepseek_v4_flash");
  ASSERT_TRUE(v4.ok()) << v4.error().message;
  auto v4_plan = build_layer_plan(*v4);
  ASSERT_TRUE(v4_plan.ok());
  auto l4 = kv_disk_layout_for(*v4, *v4_plan, 128);
  ASSERT_TRUE(l4.ok()) << l4.error().message;
  int csa_main = 0, csa_index = 0, hca = 0;
  for (const KvDiskStreamLayout& s : l4->streams) {
    if (s.record_bytes == 584 && s.entries_per_block == 32) ++csa_main;
    if (s.record_bytes == 68 && s.entries_per_block == 32) ++csa_index;
    if (s.record_bytes == 584 && s.entries_per_block == 1) ++hca;
  }
  EXPECT_EQ(csa_main, 21);
  EXPECT_EQ(csa_index, 21);
  EXPECT_EQ(hca, 20);
  EXPECT_EQ(l4->streams.size(), 62u);
  EXPECT_EQ(l4->record_bytes(), 21 * 32 * (584 + 68) + 20 * 584);  // 3514.25 B/token × 128
}

TEST_F(KvDiskStoreTest, BlocksWrittenByAnEarlierStoreAreFoundAfterARestart) {
  const auto blocks = chain(5);
  {
    auto store = open(options());
    ASSERT_TRUE(store);
    for (const auto& b : blocks) ASSERT_TRUE(store->put(b).ok());
  }
  auto store = open(options());
  ASSERT_TRUE(store);
  EXPECT_EQ(store->stats().files, 5);
  EXPECT_EQ(store->stats().bytes, 5 * file_bytes());
  for (const auto& b : blocks) {
    ASSERT_TRUE(store->contains(b.key));
    auto got = store->get(b.key);
    ASSERT_TRUE(got.has_value());
    expect_same(*got, b);
  }
  EXPECT_EQ(store->stats().corrupt, 0);
  // Blocks read since the restart are known (not rewritten); new ones are written.
  ASSERT_TRUE(store->put(blocks[2]).ok());
  EXPECT_EQ(store->stats().puts_skipped, 1);
  ASSERT_TRUE(store->put(chain(6)[5]).ok());
  EXPECT_EQ(store->stats().puts, 1);
}

TEST_F(KvDiskStoreTest, AfterARestartAnApproximateCopyDoesNotReplaceAFileNotYetRead) {
  const auto blocks = chain(2);
  {
    auto store = open(options());
    for (const auto& b : blocks) ASSERT_TRUE(store->put(b).ok());  // exact
  }
  auto store = open(options());
  StoredPrefixBlock approximate = blocks[0];
  approximate.exact = false;
  ASSERT_TRUE(store->put(approximate).ok());
  EXPECT_EQ(store->stats().puts, 0);
  EXPECT_EQ(store->stats().puts_skipped, 1);
  EXPECT_TRUE(store->get(blocks[0].key)->exact);
  // An exact copy of a block not read yet is written (the file might have been approximate).
  ASSERT_TRUE(store->put(blocks[1]).ok());
  EXPECT_EQ(store->stats().puts, 1);
}

TEST_F(KvDiskStoreTest, OneStorePerDirectory) {
  auto first = open(options());
  ASSERT_TRUE(first);
  auto second = KvDiskStore::open(options());
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.error().message.find("in use"), std::string::npos) << second.error().message;
  first.reset();
  EXPECT_TRUE(KvDiskStore::open(options()).ok());
}

TEST_F(KvDiskStoreTest, InvalidOptionsAreErrors) {
  auto o = options();
  o.budget_bytes = 0;
  EXPECT_FALSE(KvDiskStore::open(o).ok());
  o = options();
  o.model_fingerprint.clear();
  EXPECT_FALSE(KvDiskStore::open(o).ok());
  o = options();
  o.layout.streams.clear();
  EXPECT_FALSE(KvDiskStore::open(o).ok());
  o = options();
  o.layout.streams[1].record_bytes = 0;
  EXPECT_FALSE(KvDiskStore::open(o).ok());
  fs::create_directories(dir_);
  write_bytes(dir_ / "file", std::vector<uint8_t>{1});
  o = options();
  o.dir = dir_ / "file";
  auto s = KvDiskStore::open(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("file"), std::string::npos);
}

TEST_F(KvDiskStoreTest, PutRejectsBlocksThatDoNotFitAndStaysUsable) {
  auto store = open(options());
  ASSERT_TRUE(store);
  StoredPrefixBlock b = chain(1)[0];
  StoredPrefixBlock bad = b;
  bad.streams[2].push_back(0);
  EXPECT_FALSE(store->put(bad).ok());
  bad = b;
  bad.tokens.pop_back();
  EXPECT_FALSE(store->put(bad).ok());
  bad = b;
  bad.streams.pop_back();
  EXPECT_FALSE(store->put(bad).ok());
  EXPECT_EQ(store->stats().put_errors, 3);
  EXPECT_EQ(store->stats().files, 0);
  ASSERT_TRUE(store->put(b).ok());
  EXPECT_TRUE(store->get(b.key).has_value());

  store.reset();
  auto tiny = KvDiskStore::open(options(file_bytes() - 1));
  ASSERT_TRUE(tiny.ok()) << tiny.error().message;
  auto s = (*tiny)->put(b);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("budget"), std::string::npos) << s.error().message;
}

// Damages the file of a stored block with `damage`, reopens the store (as after a restart) and checks
// that the block is a logged miss and the file is gone; with `recover`, that storing it again works.
class Damage : public KvDiskStoreTest {
 protected:
  void expect_dropped(const std::function<void(const fs::path&, std::vector<uint8_t>&)>& damage,
                      const std::string& reason, const std::string& what, bool recover = true) {
    const StoredPrefixBlock b = chain(2)[1];
    if (good_image_.empty()) {  // written by the store once, then copied for each case
      auto store = open(options());
      ASSERT_TRUE(store);
      ASSERT_TRUE(store->put(b).ok());
      path_ = store->path_of(b.key);
      good_image_ = read_bytes(path_);
    }
    fs::remove_all(dir_);
    fs::create_directories(path_.parent_path());
    std::vector<uint8_t> image = good_image_;
    write_bytes(path_, image);
    damage(path_, image);
    log_.clear();
    auto store = open(options());
    ASSERT_TRUE(store);
    ASSERT_TRUE(store->contains(b.key)) << what;
    EXPECT_FALSE(store->get(b.key).has_value()) << what;
    EXPECT_FALSE(fs::exists(path_)) << what;
    EXPECT_FALSE(store->contains(b.key)) << what;
    const KvDiskStoreStats s = store->stats();
    EXPECT_EQ(s.corrupt, 1) << what;
    EXPECT_EQ(s.misses, 1) << what;
    EXPECT_EQ(s.files, 0) << what;
    const auto lines = logged();
    ASSERT_EQ(lines.size(), 2u) << what;  // the open summary, then the damaged file
    EXPECT_NE(lines[1].find(path_.string()), std::string::npos) << lines[1];
    EXPECT_NE(lines[1].find(reason), std::string::npos) << what << ": " << lines[1];
    if (!recover) return;
    // The caller recomputes and stores the block again.
    ASSERT_TRUE(store->put(b).ok());
    auto again = store->get(b.key);
    ASSERT_TRUE(again.has_value()) << what;
    expect_same(*again, b);
  }
  std::vector<uint8_t> good_image_;
  fs::path path_;
};

TEST_F(Damage, EveryFlippedByteIsDetected) {
  for (int64_t at = 0; at < file_bytes(); ++at) {
    expect_dropped(
        [&](const fs::path& p, std::vector<uint8_t>& image) {
          image[static_cast<size_t>(at)] ^= 0x01;
          write_bytes(p, image);
        },
        "", "byte " + std::to_string(at), at == 0);
    if (HasFailure()) return;
  }
}

TEST_F(Damage, ChecksumCatchesPayloadAndChecksumBytes) {
  const size_t H = static_cast<size_t>(kv_disk_file_layout(small_layout(), kFingerprint).header_bytes);
  for (size_t at : {H, H + 10, static_cast<size_t>(file_bytes()) - 5, static_cast<size_t>(file_bytes()) - 1}) {
    expect_dropped(
        [&](const fs::path& p, std::vector<uint8_t>& image) {
          image[at] ^= 0x80;
          write_bytes(p, image);
        },
        "checksum mismatch", "byte " + std::to_string(at));
  }
}

TEST_F(Damage, EveryTruncationIsDetected) {
  for (int64_t len = 0; len < file_bytes(); ++len) {
    expect_dropped(
        [&](const fs::path& p, std::vector<uint8_t>& image) {
          write_bytes(p, std::span<const uint8_t>(image.data(), static_cast<size_t>(len)));
        },
        "truncated", "length " + std::to_string(len), len == 0);
    if (HasFailure()) return;
  }
}

TEST_F(Damage, AnExtraByteIsDetected) {
  expect_dropped(
      [](const fs::path& p, std::vector<uint8_t>& image) {
        image.push_back(0);
        write_bytes(p, image);
      },
      "too long", "appended byte");
}

TEST_F(Damage, ForeignContentUnderABlockName) {
  expect_dropped(
      [](const fs::path& p, std::vector<uint8_t>& image) {
        std::mt19937 rng(3);
        for (auto& x : image) x = static_cast<uint8_t>(rng());
        write_bytes(p, image);
      },
      "bad magic", "random bytes");
  expect_dropped(
      [](const fs::path& p, std::vector<uint8_t>&) {
        const std::string text = "{\"this\": \"is a json file someone saved here\"}\n";
        write_bytes(p, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
      },
      "truncated", "a short text file");
}

TEST_F(Damage, AnotherFormatVersion) {
  expect_dropped(
      [](const fs::path& p, std::vector<uint8_t>& image) {
        put_le(image, 8, 2, 4);
        write_bytes(p, image);
      },
      "format version 2", "version 2");
}

TEST_F(Damage, AFileRenamedToAnotherBlocksName) {
  const auto blocks = chain(2);
  expect_dropped(
      [&](const fs::path& p, std::vector<uint8_t>&) {
        // The other block's (valid) file moved over this one's name.
        auto store = open(options());
        ASSERT_TRUE(store->put(blocks[0]).ok());
        const fs::path other = store->path_of(blocks[0].key);
        store.reset();
        fs::rename(other, p);
      },
      "not the one its name says", "renamed file");
}

TEST_F(Damage, AForgedChainWithAValidChecksum) {
  // Tokens changed and the checksum recomputed: only the key chain check can catch it.
  const size_t tokens_at = 72 + kFingerprint.size() + 3 * 8;
  const size_t crc_at = static_cast<size_t>(file_bytes()) - 4;
  expect_dropped(
      [&](const fs::path& p, std::vector<uint8_t>& image) {
        put_le(image, tokens_at, le(image, tokens_at, 8) + 1, 8);
        put_le(image, crc_at, crc32c(std::span<const uint8_t>(image.data(), crc_at)), 4);
        write_bytes(p, image);
      },
      "does not chain", "forged tokens");
}

TEST_F(KvDiskStoreTest, FilesOfAnotherModelOrLayoutAreDropped) {
  const StoredPrefixBlock b = chain(1)[0];
  struct Case {
    std::string fingerprint;
    KvDiskLayout layout;
    std::string reason;
  };
  const std::vector<Case> cases = {
      {std::string(64, 'e'), small_layout(), "another model"},
      {kFingerprint.substr(0, 40), small_layout(), "another model"},
      {kFingerprint, KvDiskLayout{4, {{8, 2}, {3, 4}, {6, 1}}}, "another cache layout"},
      {kFingerprint, KvDiskLayout{4, {{8, 2}, {3, 4}}}, "another cache layout"},
      {kFingerprint, KvDiskLayout{8, {{8, 4}, {3, 8}, {5, 2}}}, "another cache layout"},
  };
  for (const Case& c : cases) {
    fs::remove_all(dir_);
    {
      auto writer = open(options());
      ASSERT_TRUE(writer->put(b).ok());
    }
    log_.clear();
    auto reader = open(options(1 << 30, c.layout, c.fingerprint));
    ASSERT_TRUE(reader);
    EXPECT_FALSE(reader->get(b.key).has_value()) << c.reason;
    EXPECT_EQ(reader->stats().corrupt, 1);
    EXPECT_TRUE(block_files(dir_).empty());
    const auto lines = logged();
    ASSERT_EQ(lines.size(), 2u);
    EXPECT_NE(lines[1].find(c.reason), std::string::npos) << lines[1];
  }
}

TEST_F(KvDiskStoreTest, LeastRecentlyUsedFilesAreEvictedPastTheBudget) {
  auto store = open(options(3 * file_bytes()));
  ASSERT_TRUE(store);
  const auto b = chain(6);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(store->put(b[i]).ok());
  ASSERT_TRUE(store->get(b[0].key).has_value());  // order, oldest first: 1, 2, 0
  ASSERT_TRUE(store->put(b[3]).ok());             // evicts 1
  EXPECT_FALSE(store->contains(b[1].key));
  EXPECT_FALSE(fs::exists(store->path_of(b[1].key)));
  EXPECT_TRUE(store->contains(b[0].key));
  ASSERT_TRUE(store->get(b[2].key).has_value());  // 0, 3, 2
  ASSERT_TRUE(store->put(b[4]).ok());             // evicts 0
  EXPECT_FALSE(store->contains(b[0].key));
  ASSERT_TRUE(store->put(b[5]).ok());  // evicts 3
  EXPECT_FALSE(store->contains(b[3].key));
  for (int i : {2, 4, 5}) EXPECT_TRUE(store->get(b[i].key).has_value()) << i;
  const KvDiskStoreStats s = store->stats();
  EXPECT_EQ(s.evictions, 3);
  EXPECT_EQ(s.files, 3);
  EXPECT_EQ(s.bytes, 3 * file_bytes());
  EXPECT_EQ(block_files(dir_).size(), 3u);
  EXPECT_EQ(s.corrupt, 0);
}

TEST_F(KvDiskStoreTest, AccessOrderSurvivesARestart) {
  const auto b = chain(5);
  {
    auto store = open(options(3 * file_bytes()));
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(store->put(b[i]).ok());
    ASSERT_TRUE(store->get(b[0].key).has_value());  // 1, 2, 0
  }
  {
    auto store = open(options(3 * file_bytes()));
    ASSERT_TRUE(store->put(b[3]).ok());  // evicts 1
    EXPECT_FALSE(store->contains(b[1].key));
    EXPECT_TRUE(store->contains(b[0].key));
    EXPECT_TRUE(store->contains(b[2].key));
  }
  // A smaller budget at open evicts the oldest (2, then 0) right away.
  log_.clear();
  auto store = open(options(1 * file_bytes()));
  EXPECT_EQ(store->stats().evictions, 2);
  EXPECT_TRUE(store->contains(b[3].key));
  EXPECT_FALSE(store->contains(b[0].key));
  EXPECT_FALSE(store->contains(b[2].key));
  EXPECT_EQ(block_files(dir_).size(), 1u);
  ASSERT_FALSE(logged().empty());
  EXPECT_NE(logged()[0].find("evicted 2"), std::string::npos) << logged()[0];
}

TEST_F(KvDiskStoreTest, InterruptedWritesAreCleanedAndOtherFilesLeftAlone) {
  const auto b = chain(2);
  std::string sub;
  {
    auto store = open(options());
    ASSERT_TRUE(store->put(b[0]).ok());
    sub = b[0].key.hex().substr(0, 2);
  }
  // What a crash between AtomicFile::create and commit leaves: a partial temporary next to the files,
  // here one for the stored block and one for a block never committed.
  auto temporary = [&](const PrefixKey& key, const char* suffix) {
    std::string name(".");
    name += key.hex();
    name += suffix;
    return dir_ / sub / name;
  };
  const fs::path tmp1 = temporary(b[0].key, ".kvb.tmp.Ab12Cd");
  const fs::path tmp2 = temporary(b[1].key, ".kvb.tmp.Zz99Yy");
  write_bytes(tmp1, std::vector<uint8_t>(17, 0xAB));
  write_bytes(tmp2, std::vector<uint8_t>(3, 0xCD));
  write_bytes(dir_ / "README.txt", std::vector<uint8_t>(5, 'x'));
  write_bytes(dir_ / sub / "notes", std::vector<uint8_t>(5, 'y'));
  auto store = open(options());
  ASSERT_TRUE(store);
  EXPECT_FALSE(fs::exists(tmp1));
  EXPECT_FALSE(fs::exists(tmp2));
  EXPECT_TRUE(fs::exists(dir_ / "README.txt"));
  EXPECT_TRUE(fs::exists(dir_ / sub / "notes"));
  const KvDiskStoreStats s = store->stats();
  EXPECT_EQ(s.stale_temp_files, 2);
  EXPECT_EQ(s.foreign_files, 2);
  EXPECT_EQ(s.files, 1);
  EXPECT_FALSE(store->contains(b[1].key));
  auto got = store->get(b[0].key);
  ASSERT_TRUE(got.has_value());
  expect_same(*got, b[0]);
}

TEST_F(KvDiskStoreTest, ConcurrentPutsAndGetsNeverSeeWrongData) {
  constexpr int kBlocks = 120;
  const auto blocks = chain(kBlocks);
  auto store = open(options(20 * file_bytes()));  // evictions run concurrently with reads
  ASSERT_TRUE(store);
  std::atomic<int> published{0};
  std::atomic<int> wrong{0}, hits{0}, failed_puts{0};
  auto writer = [&](int parity) {
    for (int i = parity; i < kBlocks; i += 2) {
      StoredPrefixBlock approximate = blocks[static_cast<size_t>(i)];
      approximate.exact = false;
      if (!store->put(approximate).ok()) ++failed_puts;
      published.fetch_add(1);
      // Now and then an exact copy replaces an older block's file: readers see the old or the new file.
      if (i % 7 == 0 && !store->put(blocks[static_cast<size_t>(i / 2)]).ok()) ++failed_puts;
    }
  };
  auto reader = [&](uint32_t seed) {
    std::mt19937 rng(seed);
    while (published.load() < kBlocks) {
      const int i = static_cast<int>(rng() % kBlocks);
      auto got = store->get(blocks[static_cast<size_t>(i)].key);
      if (!got) continue;
      ++hits;
      const auto& b = blocks[static_cast<size_t>(i)];
      if (got->key != b.key || got->tokens != b.tokens || got->streams != b.streams || got->parent != b.parent) ++wrong;
    }
  };
  std::thread w0(writer, 0), w1(writer, 1), r0(reader, 1), r1(reader, 2);
  w0.join();
  w1.join();
  r0.join();
  r1.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(failed_puts.load(), 0);
  const KvDiskStoreStats s = store->stats();
  std::printf("concurrent: %lld gets, %lld hits, %lld evictions\n", static_cast<long long>(s.gets),
              static_cast<long long>(s.hits), static_cast<long long>(s.evictions));
  EXPECT_EQ(s.corrupt, 0);
  EXPECT_LE(s.bytes, 20 * file_bytes());
  const auto files = block_files(dir_);
  EXPECT_EQ(static_cast<int64_t>(files.size()), s.files);
  EXPECT_EQ(s.bytes, s.files * file_bytes());
  for (const auto& f : files) EXPECT_EQ(static_cast<int64_t>(fs::file_size(f)), file_bytes());
  // Every file still listed reads back intact.
  int listed = 0;
  for (const auto& b : blocks) {
    if (!store->contains(b.key)) continue;
    ++listed;
    auto got = store->get(b.key);
    ASSERT_TRUE(got.has_value());
    got->exact = true;  // either copy
    expect_same(*got, b);
  }
  EXPECT_EQ(listed, s.files);
}

}  // namespace
}  // namespace cedar
