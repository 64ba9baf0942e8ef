//===- Buffers.h - The CPU runtime's buffers --------------------*- C++ -*-===//
//
// The memory the sequence driver asks the CPU backend for: small buffers
// from the heap, large ones pages of their own, and the large ones a call
// released kept for the next call of the same sizes.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_RUNTIME_CPU_BUFFERS_H
#define CELLC_RUNTIME_CPU_BUFFERS_H

#include <cstdint>

namespace cellc::runtime {

/// A buffer of `bytes`, zeros if `zero`; null when there is no memory.
void *allocateBuffer(int64_t bytes, bool zero);

/// Gives back a buffer of allocateBuffer, with the bytes it was asked for.
void releaseBuffer(void *buffer, int64_t bytes);

/// Unmaps the buffers that calls released and the runtime keeps for a next
/// call of the same sizes (cellc.empty_cache).
void releaseCachedBuffers();

/// The bytes of the buffers kept for a next call.
int64_t cachedBufferBytes();

} // namespace cellc::runtime

#endif // CELLC_RUNTIME_CPU_BUFFERS_H
