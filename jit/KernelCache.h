//===- KernelCache.h - The on-disk cache of compiled kernels ----*- C++ -*-===//

#ifndef CELLC_JIT_KERNELCACHE_H
#define CELLC_JIT_KERNELCACHE_H

#include "llvm/ADT/STLFunctionalExtras.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"
#include "llvm/Support/MemoryBuffer.h"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace cellc::jit {

/// The version that every cache key includes: a new compiler never trusts an
/// old compiler's objects.
llvm::StringRef compilerVersion();

/// Compiled kernels on disk, in `$CELLC_CACHE_DIR` (default `~/.cache/cellc`),
/// one file (or, for a CPU package, one directory) per key. An entry is a header (magic, length, SHA-256 of the
/// payload) and the object file. Writes go to a temporary file that is then
/// renamed, so readers never see half an entry and concurrent writers of one
/// key are safe. An entry that fails its checks is reported as missing.
class KernelCache {
public:
  /// The cache in `dir`, or in the default directory when `dir` is empty.
  explicit KernelCache(std::string dir = "");

  /// The directory: `dir`, else `$CELLC_CACHE_DIR`, else `~/.cache/cellc`.
  static std::string defaultDir();

  /// A key over everything that changes the compiled code.
  static std::string key(llvm::ArrayRef<llvm::StringRef> parts);

  /// The entry stored under `key` (null: none). One that is there and fails
  /// its checks is an error that names its file: tuned configs cannot simply
  /// be made again.
  llvm::Expected<std::unique_ptr<llvm::MemoryBuffer>> loadChecked(llvm::StringRef key) const;
  /// Stores `object` under `key`, atomically.
  llvm::Error store(llvm::StringRef key, llvm::StringRef object) const;

  /// The directory of the sound package stored under `key`, if there is one
  /// (a CPU package: kernels.json and shared objects, with their checksums).
  /// A broken one is removed and reported as missing.
  std::optional<std::string> findPackage(llvm::StringRef key) const;
  /// Stores a package under `key`: `write` fills a fresh directory, which is
  /// then checksummed and renamed into place. Returns its directory.
  llvm::Expected<std::string>
  storePackage(llvm::StringRef key,
               llvm::function_ref<llvm::Error(llvm::StringRef dir)> write) const;
  std::string packageDirOf(llvm::StringRef key) const;

  struct Entry {
    std::string key;
    uint64_t bytes;
    bool sound;
  };
  /// Every entry, with whether it passes its checks.
  std::vector<Entry> list() const;
  /// Removes every entry; returns how many.
  llvm::Expected<unsigned> removeAll() const;

  const std::string &directory() const { return dir; }
  std::string pathOf(llvm::StringRef key) const;

private:
  std::string dir;
};

} // namespace cellc::jit

#endif // CELLC_JIT_KERNELCACHE_H
