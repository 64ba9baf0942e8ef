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

TEST(Buffers, ABufferTakesTheFrontOfARangeAndRangesJoinAgain) {
  // One 8 MiB range: two 2 MiB buffers are its first 4 MiB, and released,
  // it is one range again, which an 8 MiB buffer takes whole.
  releaseCachedBuffers();
  char *whole = static_cast<char *>(allocateBuffer(8 * kMiB, false));
  std::memset(whole, 0x5a, 8 * kMiB);
  releaseBuffer(whole, 8 * kMiB);
  void *x = allocateBuffer(2 * kMiB, false), *y = allocateBuffer(2 * kMiB, true);
  EXPECT_EQ(x, whole);
  EXPECT_EQ(y, whole + 2 * kMiB);
  EXPECT_TRUE(allZero(y, 2 * kMiB));
  EXPECT_EQ(cachedBufferBytes(), 4 * kMiB);
  releaseBuffer(y, 2 * kMiB);
  releaseBuffer(x, 2 * kMiB);
  EXPECT_EQ(allocateBuffer(8 * kMiB, false), whole);
  EXPECT_EQ(cachedBufferBytes(), 0);
  releaseBuffer(whole, 8 * kMiB);
  releaseCachedBuffers();
}

TEST(Buffers, AMissUnmapsWhatWouldRaiseTheMostMapped) {
  // 8 MiB mapped is the most so far. A 6 MiB buffer takes the front of the
  // 8 MiB range; a 4 MiB one then fits in no range, and keeping the 2 MiB
  // left would map 12 MiB: it goes, and the new buffer is fresh.
  releaseCachedBuffers();
  void *first = allocateBuffer(8 * kMiB, false);
  releaseBuffer(first, 8 * kMiB);
  void *six = allocateBuffer(5 * kMiB, false); // whole huge pages: 6 MiB
  EXPECT_EQ(six, first);
  EXPECT_EQ(cachedBufferBytes(), 2 * kMiB);
  void *four = allocateBuffer(4 * kMiB, true);
  EXPECT_EQ(cachedBufferBytes(), 0);
  EXPECT_TRUE(allZero(four, 4 * kMiB));
  releaseBuffer(four, 4 * kMiB);
  releaseBuffer(six, 5 * kMiB);
  EXPECT_EQ(cachedBufferBytes(), 10 * kMiB);
  releaseCachedBuffers();
  EXPECT_EQ(cachedBufferBytes(), 0);
}

} // namespace
