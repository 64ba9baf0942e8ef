//===- KernelCacheTest.cpp - The compiled-kernel cache ---------------------===//

#include "Support/Reference.h"
#include "jit/CpuJit.h"
#include "jit/KernelCache.h"

#include "llvm/Support/FileSystem.h"
#include "gtest/gtest.h"

#include <sys/wait.h>
#include <unistd.h>

using namespace cellc;
using namespace cellc::runtime;
using namespace cellc::jit;

namespace {

/// A fresh cache directory for one test.
struct TempCache {
  TempCache() {
    llvm::SmallString<128> path;
    EXPECT_FALSE(llvm::sys::fs::createUniqueDirectory("cellc-cache-test", path));
    dir = std::string(path);
  }
  ~TempCache() { llvm::sys::fs::remove_directories(dir); }
  std::string dir;
};

const SizeBindings kSizes = {{"H", 6}, {"I", 3}};

std::unique_ptr<CpuCell> compileWith(const std::string &dir,
                                     const SizeBindings &sizes = kSizes,
                                     DType dtype = DType::F32) {
  CpuOptions options;
  options.cacheDir = dir;
  auto cell = compileCpu(cellc::testing::readExample("gru.cell"),
                               "gru.cell", sizes, dtype, options);
  EXPECT_TRUE(static_cast<bool>(cell)) << llvm::toString(cell.takeError());
  return std::move(*cell);
}

/// Runs a small forward and returns the outputs.
std::vector<float> run(CpuCell &cell) {
  const int64_t T = 3, B = 2;
  std::vector<float> x(T * B * 3), wih(18 * 3), whh(18 * 6), bih(18), bhh(18);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = 0.1f * (i % 7) - 0.3f;
  for (size_t i = 0; i < whh.size(); ++i)
    whh[i] = 0.05f * (i % 5) - 0.1f;
  for (size_t i = 0; i < wih.size(); ++i)
    wih[i] = 0.03f * (i % 11) - 0.15f;
  std::vector<float> out(T * B * 6), fin(B * 6);
  CpuCell::Sequence seq;
  seq.inputs = {{x.data(), {T, B, 3}}};
  seq.params = {{wih.data(), {18, 3}}, {whh.data(), {18, 6}},
                {bih.data(), {18}}, {bhh.data(), {18}}};
  SavedPtr saved;
  Status e = cell.forward(seq, {{out.data(), {T, B, 6}}}, {{fin.data(), {B, 6}}}, {},
                         &saved);
  EXPECT_FALSE(static_cast<bool>(e)) << e.message();
  return out;
}

} // namespace

TEST(KernelCacheTest, ASecondCompileLoadsFromTheCache) {
  TempCache tmp;
  auto cold = compileWith(tmp.dir);
  EXPECT_FALSE(cold->loadedFromCache());
  // One package: both SAVE_GATES variants and kernels.json.
  EXPECT_EQ(KernelCache(tmp.dir).list().size(), 1u);
  auto warm = compileWith(tmp.dir);
  EXPECT_TRUE(warm->loadedFromCache());
  EXPECT_EQ(run(*cold), run(*warm));
  for (const auto &entry : KernelCache(tmp.dir).list())
    EXPECT_TRUE(entry.sound);
}

TEST(KernelCacheTest, CorruptEntriesAreRecompiledNotRun) {
  TempCache tmp;
  std::vector<float> expected = run(*compileWith(tmp.dir));
  KernelCache cache(tmp.dir);
  auto entries = cache.list();
  ASSERT_EQ(entries.size(), 1u);
  std::string dir = cache.packageDirOf(entries[0].key);
  // One shared object truncated, the other with a flipped byte.
  {
    std::string path = dir + "/save.so";
    uint64_t size = 0;
    ASSERT_FALSE(llvm::sys::fs::file_size(path, size));
    ASSERT_EQ(::truncate(path.c_str(), size / 2), 0);
  }
  {
    std::string path = dir + "/replay.so";
    auto file = llvm::MemoryBuffer::getFile(path, false, false);
    ASSERT_TRUE(static_cast<bool>(file));
    std::string data = (*file)->getBuffer().str();
    data[data.size() / 2] ^= 0x5a;
    std::error_code ec;
    llvm::raw_fd_ostream os(path, ec);
    os << data;
  }
  for (const auto &entry : cache.list())
    EXPECT_FALSE(entry.sound);
  auto again = compileWith(tmp.dir);
  EXPECT_FALSE(again->loadedFromCache());
  EXPECT_EQ(run(*again), expected);
  for (const auto &entry : cache.list())
    EXPECT_TRUE(entry.sound) << entry.key;
}

TEST(KernelCacheTest, TwoProcessesCompilingTheSameCellAtOnce) {
  TempCache tmp;
  std::vector<pid_t> children;
  for (int i = 0; i < 2; ++i) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      auto cell = compileWith(tmp.dir);
      _exit(cell && run(*cell).size() == 36 ? 0 : 1);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  auto entries = KernelCache(tmp.dir).list();
  EXPECT_EQ(entries.size(), 1u);
  for (const auto &entry : entries)
    EXPECT_TRUE(entry.sound);
  EXPECT_TRUE(compileWith(tmp.dir)->loadedFromCache());
}

TEST(KernelCacheTest, KeysChangeWithEveryInput) {
  std::string base = KernelCache::key({"v1", "ir", "cpu"});
  EXPECT_EQ(base, KernelCache::key({"v1", "ir", "cpu"}));
  EXPECT_NE(base, KernelCache::key({"v2", "ir", "cpu"}));
  EXPECT_NE(base, KernelCache::key({"v1", "ir2", "cpu"}));
  EXPECT_NE(base, KernelCache::key({"v1", "ir", "cuda"}));
  // Parts are length-prefixed: moving text between them changes the key.
  EXPECT_NE(KernelCache::key({"ab", "c"}), KernelCache::key({"a", "bc"}));

  TempCache tmp;
  compileWith(tmp.dir);
  EXPECT_EQ(KernelCache(tmp.dir).list().size(), 1u);
  compileWith(tmp.dir, {{"H", 7}, {"I", 3}});
  EXPECT_EQ(KernelCache(tmp.dir).list().size(), 2u);
  compileWith(tmp.dir, kSizes, DType::F64);
  EXPECT_EQ(KernelCache(tmp.dir).list().size(), 3u);
  // The same cell again adds nothing.
  EXPECT_TRUE(compileWith(tmp.dir)->loadedFromCache());
  EXPECT_EQ(KernelCache(tmp.dir).list().size(), 3u);
  auto removed = KernelCache(tmp.dir).removeAll();
  ASSERT_TRUE(static_cast<bool>(removed));
  EXPECT_EQ(*removed, 3u);
  EXPECT_TRUE(KernelCache(tmp.dir).list().empty());
}
