//===- KernelCache.cpp - The on-disk cache of compiled kernels ------------===//

#include "runtime/KernelCache.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/SHA256.h"
#include "llvm/Support/raw_ostream.h"

#include <cstring>

using namespace cellc::runtime;

namespace {
constexpr char kMagic[8] = {'C', 'E', 'L', 'L', 'C', 'O', 'B', '1'};
constexpr size_t kHeader = 8 + 8 + 32;
constexpr llvm::StringLiteral kSuffix = ".cellc-obj";

std::string sha256Hex(llvm::StringRef data) {
  auto digest = llvm::SHA256::hash(llvm::arrayRefFromStringRef(data));
  return llvm::toHex(digest, /*LowerCase=*/true);
}

/// Whether `data` is a whole, uncorrupted entry.
bool isSound(llvm::StringRef data) {
  if (data.size() < kHeader || std::memcmp(data.data(), kMagic, 8) != 0)
    return false;
  uint64_t length;
  std::memcpy(&length, data.data() + 8, 8);
  if (length != data.size() - kHeader)
    return false;
  auto digest = llvm::SHA256::hash(
      llvm::arrayRefFromStringRef(data.drop_front(kHeader)));
  return std::memcmp(digest.data(), data.data() + 16, 32) == 0;
}
} // namespace

llvm::StringRef cellc::runtime::compilerVersion() {
  return "cellc-0.1-kernels-4";
}

KernelCache::KernelCache(std::string directory)
    : dir(directory.empty() ? defaultDir() : std::move(directory)) {}

std::string KernelCache::defaultDir() {
  if (auto env = llvm::sys::Process::GetEnv("CELLC_CACHE_DIR"))
    if (!env->empty())
      return *env;
  llvm::SmallString<128> home;
  if (!llvm::sys::path::home_directory(home))
    home = "/tmp";
  llvm::sys::path::append(home, ".cache", "cellc");
  return std::string(home);
}

std::string KernelCache::key(llvm::ArrayRef<llvm::StringRef> parts) {
  std::string all;
  for (llvm::StringRef part : parts) {
    all += std::to_string(part.size());
    all += ':';
    all += part.str();
  }
  return sha256Hex(all).substr(0, 40);
}

std::string KernelCache::pathOf(llvm::StringRef key) const {
  llvm::SmallString<256> path(dir);
  llvm::sys::path::append(path, key + kSuffix);
  return std::string(path);
}

std::unique_ptr<llvm::MemoryBuffer> KernelCache::load(llvm::StringRef key) const {
  // A compiled object that fails its checks is compiled again: no word.
  auto entry = loadChecked(key);
  if (!entry) {
    llvm::consumeError(entry.takeError());
    return nullptr;
  }
  return std::move(*entry);
}

llvm::Expected<std::unique_ptr<llvm::MemoryBuffer>>
KernelCache::loadChecked(llvm::StringRef key) const {
  std::string path = pathOf(key);
  auto file = llvm::MemoryBuffer::getFile(path, /*IsText=*/false,
                                          /*RequiresNullTerminator=*/false);
  if (!file) {
    if (file.getError() == std::errc::no_such_file_or_directory)
      return nullptr;
    return llvm::createStringError(file.getError(), "cannot read %s: %s", path.c_str(),
                                   file.getError().message().c_str());
  }
  if (!isSound((*file)->getBuffer()))
    return llvm::createStringError(std::errc::illegal_byte_sequence,
                                   "%s is corrupt (its length or checksum is wrong)",
                                   path.c_str());
  return llvm::MemoryBuffer::getMemBufferCopy((*file)->getBuffer().drop_front(kHeader), key);
}

llvm::Error KernelCache::store(llvm::StringRef key, llvm::StringRef object) const {
  if (std::error_code ec = llvm::sys::fs::create_directories(dir))
    return llvm::createStringError(ec, "cannot create the kernel cache %s: %s",
                                   dir.c_str(), ec.message().c_str());
  int fd;
  llvm::SmallString<256> tmp;
  if (std::error_code ec = llvm::sys::fs::createUniqueFile(
          pathOf(key) + ".tmp-%%%%%%%%", fd, tmp))
    return llvm::createStringError(ec, "cannot write to the kernel cache: %s",
                                   ec.message().c_str());
  {
    llvm::raw_fd_ostream os(fd, /*shouldClose=*/true);
    uint64_t length = object.size();
    auto digest = llvm::SHA256::hash(llvm::arrayRefFromStringRef(object));
    os.write(kMagic, 8);
    os.write(reinterpret_cast<const char *>(&length), 8);
    os.write(reinterpret_cast<const char *>(digest.data()), 32);
    os << object;
    os.close();
    if (os.has_error()) {
      os.clear_error();
      llvm::sys::fs::remove(tmp);
      return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                     "writing the kernel cache entry failed");
    }
  }
  if (std::error_code ec = llvm::sys::fs::rename(tmp, pathOf(key))) {
    llvm::sys::fs::remove(tmp);
    return llvm::createStringError(ec, "cannot install the kernel cache entry");
  }
  return llvm::Error::success();
}

std::vector<KernelCache::Entry> KernelCache::list() const {
  std::vector<Entry> entries;
  std::error_code ec;
  for (llvm::sys::fs::directory_iterator it(dir, ec), end; it != end && !ec;
       it.increment(ec)) {
    llvm::StringRef name = llvm::sys::path::filename(it->path());
    if (!name.ends_with(kSuffix))
      continue;
    auto file = llvm::MemoryBuffer::getFile(it->path(), false, false);
    entries.push_back({name.drop_back(kSuffix.size()).str(),
                       file ? (*file)->getBufferSize() : 0,
                       file && isSound((*file)->getBuffer())});
  }
  return entries;
}

llvm::Expected<unsigned> KernelCache::clear() const {
  unsigned removed = 0;
  std::error_code ec;
  for (llvm::sys::fs::directory_iterator it(dir, ec), end; it != end && !ec;
       it.increment(ec)) {
    llvm::StringRef name = llvm::sys::path::filename(it->path());
    if (!name.ends_with(kSuffix) && !name.contains(".tmp-"))
      continue;
    if (std::error_code rm = llvm::sys::fs::remove(it->path()))
      return llvm::createStringError(rm, "cannot remove %s", it->path().c_str());
    ++removed;
  }
  return removed;
}
