//===- KernelCache.cpp - The on-disk cache of compiled kernels ------------===//

#include "jit/KernelCache.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/SHA256.h"
#include "llvm/Support/raw_ostream.h"

#include <cstring>

using namespace cellc::jit;

namespace {
constexpr char kMagic[8] = {'C', 'E', 'L', 'L', 'C', 'O', 'B', '1'};
constexpr size_t kHeader = 8 + 8 + 32;
constexpr llvm::StringLiteral kSuffix = ".cellc-obj";
constexpr llvm::StringLiteral kPackageSuffix = ".cellc-pkg";
/// The file in a cached package that lists its other files' SHA-256.
constexpr llvm::StringLiteral kSums = "SHA256SUMS";

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
/// The files of a package directory (not its sums), sorted.
std::vector<std::string> packageFiles(llvm::StringRef dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (llvm::sys::fs::directory_iterator it(dir, ec), end; it != end && !ec;
       it.increment(ec)) {
    llvm::StringRef name = llvm::sys::path::filename(it->path());
    if (name != kSums)
      files.push_back(name.str());
  }
  llvm::sort(files);
  return files;
}

/// `<sha256> <name>` for each file of `dir`, one per line (empty: a file
/// cannot be read).
std::string packageSums(llvm::StringRef dir, uint64_t *bytes = nullptr) {
  std::string sums;
  for (const std::string &name : packageFiles(dir)) {
    auto file = llvm::MemoryBuffer::getFile(dir + "/" + name, false, false);
    if (!file)
      return "";
    if (bytes)
      *bytes += (*file)->getBufferSize();
    sums += sha256Hex((*file)->getBuffer()) + " " + name + "\n";
  }
  return sums;
}

/// Whether the package in `dir` is whole: its files are those its sums
/// list, unchanged.
bool isSoundPackage(llvm::StringRef dir, uint64_t *bytes = nullptr) {
  auto listed = llvm::MemoryBuffer::getFile(dir + "/" + kSums, false, false);
  if (!listed)
    return false;
  std::string sums = packageSums(dir, bytes);
  return !sums.empty() && sums == (*listed)->getBuffer();
}
} // namespace

llvm::StringRef cellc::jit::compilerVersion() {
  return "cellc-0.1-kernels-6";
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

std::string KernelCache::packageDirOf(llvm::StringRef key) const {
  llvm::SmallString<256> path(dir);
  llvm::sys::path::append(path, key + kPackageSuffix);
  return std::string(path);
}

std::optional<std::string> KernelCache::findPackage(llvm::StringRef key) const {
  std::string path = packageDirOf(key);
  if (!llvm::sys::fs::is_directory(path))
    return std::nullopt;
  if (isSoundPackage(path))
    return path;
  // A broken package is built again; it goes now, so that its place is free.
  llvm::sys::fs::remove_directories(path);
  return std::nullopt;
}

llvm::Expected<std::string> KernelCache::storePackage(
    llvm::StringRef key, llvm::function_ref<llvm::Error(llvm::StringRef)> write) const {
  if (std::error_code ec = llvm::sys::fs::create_directories(dir))
    return llvm::createStringError(ec, "cannot create the kernel cache %s: %s",
                                   dir.c_str(), ec.message().c_str());
  llvm::SmallString<256> tmp;
  if (std::error_code ec = llvm::sys::fs::createUniqueDirectory(
          packageDirOf(key) + ".tmp", tmp))
    return llvm::createStringError(ec, "cannot write to the kernel cache: %s",
                                   ec.message().c_str());
  auto discard = [&](llvm::Error e) -> llvm::Expected<std::string> {
    llvm::sys::fs::remove_directories(tmp);
    return std::move(e);
  };
  if (llvm::Error e = write(tmp))
    return discard(std::move(e));
  std::string sums = packageSums(tmp);
  std::error_code ec;
  llvm::raw_fd_ostream os((tmp + "/" + kSums).str(), ec);
  if (ec || sums.empty())
    return discard(llvm::createStringError(llvm::inconvertibleErrorCode(),
                                           "cannot write the package's checksums"));
  os << sums;
  os.close();
  std::string path = packageDirOf(key);
  if (llvm::sys::fs::rename(tmp, path)) {
    // Another process installed the same key first: its package is as good.
    llvm::sys::fs::remove_directories(tmp);
    if (!isSoundPackage(path))
      return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                     "cannot install the package %s", path.c_str());
  }
  return path;
}

std::vector<KernelCache::Entry> KernelCache::list() const {
  std::vector<Entry> entries;
  std::error_code ec;
  for (llvm::sys::fs::directory_iterator it(dir, ec), end; it != end && !ec;
       it.increment(ec)) {
    llvm::StringRef name = llvm::sys::path::filename(it->path());
    if (name.ends_with(kPackageSuffix)) {
      uint64_t bytes = 0;
      bool sound = isSoundPackage(it->path(), &bytes);
      entries.push_back({name.drop_back(kPackageSuffix.size()).str(), bytes, sound});
      continue;
    }
    if (!name.ends_with(kSuffix))
      continue;
    auto file = llvm::MemoryBuffer::getFile(it->path(), false, false);
    entries.push_back({name.drop_back(kSuffix.size()).str(),
                       file ? (*file)->getBufferSize() : 0,
                       file && isSound((*file)->getBuffer())});
  }
  return entries;
}

llvm::Expected<unsigned> KernelCache::removeAll() const {
  unsigned removed = 0;
  std::error_code ec;
  for (llvm::sys::fs::directory_iterator it(dir, ec), end; it != end && !ec;
       it.increment(ec)) {
    llvm::StringRef name = llvm::sys::path::filename(it->path());
    if (!name.ends_with(kSuffix) && !name.ends_with(kPackageSuffix) &&
        !name.contains(".tmp"))
      continue;
    if (std::error_code rm = llvm::sys::fs::is_directory(it->path())
                                 ? llvm::sys::fs::remove_directories(it->path())
                                 : llvm::sys::fs::remove(it->path()))
      return llvm::createStringError(rm, "cannot remove %s", it->path().c_str());
    ++removed;
  }
  return removed;
}
