//===- BuffersTest.cpp - The CPU runtime's buffer cache -------------------===//

#include "runtime/cpu/Buffers.h"

#include <gtest/gtest.h>

#include <cstring>

using namespace cellc::runtime;

namespace {

constexpr int64_t kMiB = int64_t(1) << 20;

bool allZero(const void *buffer, int64_t bytes) {
  const unsigned char *b = static_cast<const unsigned char *>(buffer);
  for (int64_t i = 0; i < bytes; ++i)
    if (b[i])
      return false;
  return true;
}

TEST(Buffers, ASizeReleasedIsReusedAndZeroedWhenAsked) {
  releaseCachedBuffers();
  void *first = allocateBuffer(3 * kMiB + 5, false);
  ASSERT_NE(first, nullptr);
  std::memset(first, 0xab, 3 * kMiB + 5);
  releaseBuffer(first, 3 * kMiB + 5);
  EXPECT_GE(cachedBufferBytes(), 3 * kMiB + 5);
  void *again = allocateBuffer(3 * kMiB + 5, true);
  EXPECT_EQ(again, first);
  EXPECT_EQ(cachedBufferBytes(), 0);
  EXPECT_TRUE(allZero(again, 3 * kMiB + 5));
  releaseBuffer(again, 3 * kMiB + 5);
  releaseCachedBuffers();
  EXPECT_EQ(cachedBufferBytes(), 0);
}

TEST(Buffers, SmallBuffersComeFromTheHeapAndAreNotKept) {
  releaseCachedBuffers();
  void *small = allocateBuffer(1000, true);
  ASSERT_NE(small, nullptr);
  EXPECT_TRUE(allZero(small, 1000));
  releaseBuffer(small, 1000);
  EXPECT_EQ(cachedBufferBytes(), 0);
}

TEST(Buffers, AMissUnmapsWhatWouldRaiseTheMostMapped) {
  // 4 + 2 MiB live at once is the most so far. Both released, then an
  // 8 MiB buffer: keeping either would map more than 8 MiB, so both go.
  releaseCachedBuffers();
  void *a = allocateBuffer(4 * kMiB, false), *b = allocateBuffer(2 * kMiB, false);
  releaseBuffer(a, 4 * kMiB);
  releaseBuffer(b, 2 * kMiB);
  EXPECT_EQ(cachedBufferBytes(), 6 * kMiB);
  void *c = allocateBuffer(8 * kMiB, true);
  EXPECT_EQ(cachedBufferBytes(), 0);
  EXPECT_TRUE(allZero(c, 8 * kMiB));
  releaseBuffer(c, 8 * kMiB);
  // 8 MiB is now the most: a 5 MiB miss keeps nothing of the 8 (8 + 5 >
  // 8), and a 1 MiB miss after it keeps the 5 (5 + 1 <= 8).
  void *d = allocateBuffer(5 * kMiB, false);
  EXPECT_EQ(cachedBufferBytes(), 0);
  releaseBuffer(d, 5 * kMiB);
  void *e = allocateBuffer(1 * kMiB, false);
  EXPECT_EQ(cachedBufferBytes(), 5 * kMiB);
  releaseBuffer(e, 1 * kMiB);
  releaseCachedBuffers();
  EXPECT_EQ(cachedBufferBytes(), 0);
}

} // namespace
