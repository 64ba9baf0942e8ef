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
#include <list>
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

/// Mapped buffers released by one call, kept for the next: a training loop
/// asks for the same sizes every step, and fresh pages are slow. Each is a
/// fault and a page of zeros, and a VM that hands freed memory back to its
/// host faults in the host as well: a `none` call of gated DeltaNet at T =
/// 256 ran 1.1 s on fresh pages where it runs 0.2 s on pages it had.
///
/// Only an exact size is reused. A size the cache lacks first unmaps the
/// least recently released buffers until what is mapped, with the new one,
/// is within the most the runtime has mapped so far. That most only grows at
/// a miss, to what is live plus the new buffer, so the cache never makes the
/// process map more than it would without it; it holds the process at that
/// peak between calls. `releaseCachedBuffers` (cellc.empty_cache) unmaps it
/// all; CELLC_BUFFER_CACHE=0 turns it off.
class BufferCache {
public:
  /// A mapped buffer of `bytes`, reused or fresh (zeros).
  void *take(int64_t bytes, bool &fresh) {
    std::lock_guard<std::mutex> lock(mutex);
    fresh = false;
    for (auto it = blocks.begin(); it != blocks.end(); ++it) {
      if (it->bytes != bytes)
        continue;
      void *block = it->data;
      blocks.erase(it);
      cached -= bytes;
      live += bytes;
      return block;
    }
    while (!blocks.empty() && live + cached + bytes > most) {
      munmap(blocks.back().data, blocks.back().bytes);
      cached -= blocks.back().bytes;
      blocks.pop_back();
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
    blocks.push_front({block, bytes});
    cached += bytes;
  }
  int64_t bytes() {
    std::lock_guard<std::mutex> lock(mutex);
    return cached;
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mutex);
    for (const Block &b : blocks)
      munmap(b.data, b.bytes);
    blocks.clear();
    cached = 0;
    most = live;
  }

private:
  struct Block {
    void *data;
    int64_t bytes;
  };
  const bool enabled = [] {
    const char *env = std::getenv("CELLC_BUFFER_CACHE");
    return !env || std::strcmp(env, "0") != 0;
  }();
  std::mutex mutex;
  std::list<Block> blocks; // the most recently released first
  int64_t live = 0, cached = 0, most = 0;
};

BufferCache &bufferCache() {
  static BufferCache *cache = new BufferCache; // outlives every cell
  return *cache;
}

int64_t mappedSize(int64_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }

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
