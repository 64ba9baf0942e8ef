//===- Buffers.cpp - The CPU runtime's buffers ----------------------------===//
//
// Small buffers come from the heap, large ones are pages of their own, and
// a process-wide cache keeps the large ones a call released for the next.
//
//===----------------------------------------------------------------------===//

#include "runtime/cpu/Buffers.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>

using namespace cellc;

namespace {

/// The driver's buffers. Large ones are pages of their own (mmap): the
/// heap's free lists would keep what the driver releases resident, and a
/// later buffer of another size would not fit in it. The driver allocates
/// once a call what it reuses over the pieces, so fresh pages fault once a
/// call, not once a piece.
constexpr int64_t kMappedBytes = int64_t(64) << 10;
constexpr int64_t kHugePage = int64_t(2) << 20;
constexpr int64_t kPage = int64_t(4) << 10;

/// Mapped memory released by one call, kept for the next: a training loop
/// asks for the same sizes every step, and fresh pages are slow. Each is a
/// fault and a page of zeros, and a VM that hands freed memory back to its
/// host faults in the host as well: a `none` call of gated DeltaNet at T =
/// 256 ran 1.1 s on fresh pages where it runs 0.2 s on pages it had.
///
/// The cache holds address ranges, joined when they touch. A buffer takes
/// the front of the smallest range that holds it, so a call that asks for
/// other sizes than the last (a forward without the backward, another
/// recompute mode) still runs on the pages the last one had. With no range
/// large enough, the largest ranges are unmapped until what is mapped, with
/// the new buffer, is within the most the runtime has mapped so far. That
/// most grows only then, to what is live plus the new buffer, so the cache
/// never makes the process map more than it would without it; it holds the
/// process at that peak between calls. `releaseCachedBuffers`
/// (cellc.empty_cache) unmaps it all; CELLC_BUFFER_CACHE=0 turns it off.
class BufferCache {
public:
  /// A mapped buffer of `bytes` (a multiple of the page), reused or fresh
  /// (zeros).
  void *take(int64_t bytes, bool &fresh) {
    std::lock_guard<std::mutex> lock(mutex);
    fresh = false;
    auto best = ranges.end();
    for (auto it = ranges.begin(); it != ranges.end(); ++it)
      if (it->second >= bytes && (best == ranges.end() || it->second < best->second))
        best = it;
    if (best != ranges.end()) {
      auto [start, size] = *best;
      ranges.erase(best);
      if (size > bytes)
        ranges.emplace(start + bytes, size - bytes);
      cached -= bytes;
      live += bytes;
      return start;
    }
    while (!ranges.empty() && live + cached + bytes > most) {
      auto largest = std::max_element(
          ranges.begin(), ranges.end(),
          [](const auto &a, const auto &b) { return a.second < b.second; });
      munmap(largest->first, largest->second);
      cached -= largest->second;
      ranges.erase(largest);
    }
    void *block =
        mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (block == MAP_FAILED)
      return nullptr;
    fresh = true;
    live += bytes;
    most = std::max(most, live + cached);
    return block;
  }
  void give(void *block, int64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex);
    live -= bytes;
    if (!enabled) {
      munmap(block, bytes);
      return;
    }
    cached += bytes;
    char *start = static_cast<char *>(block);
    auto next = ranges.lower_bound(start);
    if (next != ranges.end() && start + bytes == next->first) {
      bytes += next->second;
      next = ranges.erase(next);
    }
    if (next != ranges.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == start) {
        prev->second += bytes;
        return;
      }
    }
    ranges.emplace(start, bytes);
  }
  int64_t bytes() {
    std::lock_guard<std::mutex> lock(mutex);
    return cached;
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto &[start, size] : ranges)
      munmap(start, size);
    ranges.clear();
    cached = 0;
    most = live;
  }

private:
  const bool enabled = [] {
    const char *env = std::getenv("CELLC_BUFFER_CACHE");
    return !env || std::strcmp(env, "0") != 0;
  }();
  std::mutex mutex;
  std::map<char *, int64_t> ranges; // start -> bytes
  int64_t live = 0, cached = 0, most = 0;
};

BufferCache &bufferCache() {
  static BufferCache *cache = new BufferCache; // outlives every cell
  return *cache;
}

/// Whole pages, and whole huge pages from one up: a range split at a huge
/// page's edge keeps its huge pages.
int64_t mappedSize(int64_t bytes) {
  int64_t unit = bytes >= kHugePage ? kHugePage : kPage;
  return (bytes + unit - 1) / unit * unit;
}

} // namespace

void *runtime::allocateBuffer(int64_t bytes, bool zero) {
  bytes = std::max<int64_t>(bytes, 1);
  if (bytes < kMappedBytes)
    return zero ? std::calloc(bytes, 1) : std::malloc(bytes);
  int64_t size = mappedSize(bytes);
  bool fresh = false;
  void *buffer = bufferCache().take(size, fresh);
  if (!buffer)
    return nullptr;
  if (!fresh && zero)
    std::memset(buffer, 0, bytes);
  // Huge pages where the system gives them: a fresh buffer faults once
  // every 2 MiB, not every 4 KiB.
  if (fresh && size >= kHugePage)
    madvise(buffer, size, MADV_HUGEPAGE);
  return buffer;
}

void runtime::releaseBuffer(void *buffer, int64_t bytes) {
  bytes = std::max<int64_t>(bytes, 1);
  if (bytes < kMappedBytes)
    std::free(buffer);
  else
    bufferCache().give(buffer, mappedSize(bytes));
}

void runtime::releaseCachedBuffers() { bufferCache().clear(); }

int64_t runtime::cachedBufferBytes() { return bufferCache().bytes(); }
