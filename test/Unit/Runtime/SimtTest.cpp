//===- SimtTest.cpp - The SIMT emulator on hand-written kernels -----------===//
//
// Small kernels in the LLVM IR that goes to NVPTX (NVVM intrinsics), through
// compiler/Pipelines/SimtToHost.cpp and runtime/emu: shfl.sync's modes
// against CUDA's documented __shfl_*_sync results, and each check (race,
// bounds, deadlock) on a kernel built to trip it.
//
//===----------------------------------------------------------------------===//

#include "compiler/Pipelines/Pipelines.h"
#include "runtime/emu/Simt.h"

#include "llvm/AsmParser/Parser.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/Module.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/SourceMgr.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

using namespace cellc;

namespace {

/// Compiles `ir` (its kernels `kernels`) into an emulated object and loads it.
std::unique_ptr<emu::Module> emulate(const std::string &ir,
                                     const std::vector<std::string> &kernels) {
  llvm::LLVMContext context;
  llvm::SMDiagnostic diag;
  std::unique_ptr<llvm::Module> module = llvm::parseAssemblyString(ir, diag, context);
  EXPECT_TRUE(module) << diag.getMessage().str();
  if (!module)
    return nullptr;
  llvm::SmallString<128> path;
  EXPECT_FALSE(llvm::sys::fs::createTemporaryFile("simt-test", "so", path));
  llvm::Error e = compileSimtObject(*module, kernels, path);
  EXPECT_FALSE(bool(e)) << llvm::toString(std::move(e));
  auto loaded = std::make_unique<emu::Module>(path.str().str());
  llvm::sys::fs::remove(path);
  return loaded;
}

const char *kDeclarations = R"(
declare i32 @llvm.nvvm.read.ptx.sreg.tid.x()
declare void @llvm.nvvm.barrier0()
declare i32 @llvm.nvvm.shfl.sync.up.i32(i32, i32, i32, i32)
declare i32 @llvm.nvvm.shfl.sync.down.i32(i32, i32, i32, i32)
declare i32 @llvm.nvvm.shfl.sync.bfly.i32(i32, i32, i32, i32)
declare float @llvm.nvvm.shfl.sync.idx.f32(i32, float, i32, i32)
declare { i32, i1 } @llvm.nvvm.shfl.sync.down.i32p(i32, i32, i32, i32)
)";

/// A launch of `kernel` over one CTA of `threads`, with `out` as its one
/// argument and its one buffer.
emu::Launch launchOf(const std::string &kernel, unsigned threads, std::vector<int32_t> &out,
                     void **params) {
  emu::Launch launch;
  launch.kernel = kernel;
  launch.block = threads;
  launch.params = params;
  launch.buffers = {{uintptr_t(out.data()), out.size() * sizeof(int32_t)}};
  return launch;
}

/// What a launch of `kernel` over one CTA of `threads`, with `out`, throws:
/// the emulator's message, or "" when it runs clean.
std::string errorOf(const emu::Module &module, const std::string &kernel, unsigned threads,
                    std::vector<int32_t> &out) {
  int32_t *data = out.data();
  void *params[] = {&data};
  try {
    module.launch(launchOf(kernel, threads, out, params));
    return "";
  } catch (const emu::EmuError &e) {
    return e.what();
  }
}

TEST(SimtTest, ShuffleModesMatchCuda) {
  // Each lane's value is 100 + lane. Rows of `out`: __shfl_up_sync(v, 3),
  // __shfl_down_sync(v, 5), __shfl_xor_sync(v, 6), __shfl_sync(v, 7) as a
  // float, __shfl_xor_sync(v, 6, 8), __shfl_down_sync(v, 5, 16) and its
  // predicate. clang passes c = ((32 - width) << 8) | 31, and for up
  // (32 - width) << 8.
  std::string ir = std::string(kDeclarations) + R"(
define void @shuffles(ptr %out) {
  %lane = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %v = add i32 %lane, 100
  %up = call i32 @llvm.nvvm.shfl.sync.up.i32(i32 -1, i32 %v, i32 3, i32 0)
  %down = call i32 @llvm.nvvm.shfl.sync.down.i32(i32 -1, i32 %v, i32 5, i32 31)
  %xor = call i32 @llvm.nvvm.shfl.sync.bfly.i32(i32 -1, i32 %v, i32 6, i32 31)
  %f = sitofp i32 %v to float
  %idxf = call float @llvm.nvvm.shfl.sync.idx.f32(i32 -1, float %f, i32 7, i32 31)
  %idx = fptosi float %idxf to i32
  %xor8 = call i32 @llvm.nvvm.shfl.sync.bfly.i32(i32 -1, i32 %v, i32 6, i32 6175)
  %pair = call { i32, i1 } @llvm.nvvm.shfl.sync.down.i32p(i32 -1, i32 %v, i32 5, i32 4127)
  %down16 = extractvalue { i32, i1 } %pair, 0
  %p = extractvalue { i32, i1 } %pair, 1
  %pred = zext i1 %p to i32
  %i = zext i32 %lane to i64
  %at.up = getelementptr [32 x i32], ptr %out, i64 0, i64 %i
  store i32 %up, ptr %at.up
  %at.down = getelementptr [32 x i32], ptr %out, i64 1, i64 %i
  store i32 %down, ptr %at.down
  %at.xor = getelementptr [32 x i32], ptr %out, i64 2, i64 %i
  store i32 %xor, ptr %at.xor
  %at.idx = getelementptr [32 x i32], ptr %out, i64 3, i64 %i
  store i32 %idx, ptr %at.idx
  %at.xor8 = getelementptr [32 x i32], ptr %out, i64 4, i64 %i
  store i32 %xor8, ptr %at.xor8
  %at.down16 = getelementptr [32 x i32], ptr %out, i64 5, i64 %i
  store i32 %down16, ptr %at.down16
  %at.pred = getelementptr [32 x i32], ptr %out, i64 6, i64 %i
  store i32 %pred, ptr %at.pred
  ret void
}
)";
  auto module = emulate(ir, {"shuffles"});
  ASSERT_TRUE(module);
  std::vector<int32_t> out(7 * 32, -1);
  int32_t *data = out.data();
  void *params[] = {&data};
  module->launch(launchOf("shuffles", 32, out, params));
  for (int lane = 0; lane < 32; ++lane) {
    SCOPED_TRACE("lane " + std::to_string(lane));
    int v = 100 + lane;
    EXPECT_EQ(out[lane], lane >= 3 ? v - 3 : v);
    EXPECT_EQ(out[32 + lane], lane + 5 < 32 ? v + 5 : v);
    EXPECT_EQ(out[64 + lane], 100 + (lane ^ 6));
    EXPECT_EQ(out[96 + lane], 107);
    EXPECT_EQ(out[128 + lane], 100 + (lane / 8 * 8 + ((lane % 8) ^ 6)));
    bool inSegment = lane % 16 + 5 < 16;
    EXPECT_EQ(out[160 + lane], inSegment ? v + 5 : v);
    EXPECT_EQ(out[192 + lane], inSegment ? 1 : 0);
  }
}

TEST(SimtTest, ARaceBetweenBarriersNamesTheThreads) {
  // Each thread writes its own word, then reads its neighbour's: with the
  // barrier between, clean; without, thread 0 reads what thread 1 writes.
  auto kernel = [](bool barrier) {
    return std::string(kDeclarations) + R"(
@words = internal addrspace(3) global [64 x i32] undef
define void @neighbours(ptr %out) {
  %tid = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %i = zext i32 %tid to i64
  %mine = getelementptr [64 x i32], ptr addrspace(3) @words, i64 0, i64 %i
  store i32 %tid, ptr addrspace(3) %mine
)" + (barrier ? "  call void @llvm.nvvm.barrier0()\n" : "") +
           R"(  %j = add i64 %i, 1
  %theirs = getelementptr [64 x i32], ptr addrspace(3) @words, i64 0, i64 %j
  %v = load i32, ptr addrspace(3) %theirs
  %slot = getelementptr i32, ptr %out, i64 %i
  store i32 %v, ptr %slot
  ret void
}
)";
  };
  std::vector<int32_t> out(64);
  auto clean = emulate(kernel(true), {"neighbours"});
  ASSERT_TRUE(clean);
  EXPECT_EQ(errorOf(*clean, "neighbours", 32, out), "");
  EXPECT_EQ(out[0], 1);
  EXPECT_EQ(out[30], 31);
  auto racy = emulate(kernel(false), {"neighbours"});
  ASSERT_TRUE(racy);
  EXPECT_EQ(errorOf(*racy, "neighbours", 32, out),
            "cuda-emu: shared-memory race in kernel neighbours, CTA (0, 0): thread 1 writes "
            "byte 4 of words (offset 4), which thread 0 read since the last bar.sync");
}

TEST(SimtTest, AWarpSplitBetweenTwoBarriersIsAnError) {
  // bar.sync is barrier.sync.aligned: lanes 0-15 of a warp wait at one and
  // lanes 16-31 at another. Every thread reaches a barrier once, so counted
  // thread by thread the CTA would go on; on a GPU it is undefined (a hang).
  // The same split across warps (whole warps at each) is what the PTX ISA
  // allows.
  auto kernel = [](const char *split) {
    return std::string(kDeclarations) + R"(
define void @split(ptr %out) {
  %tid = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %low = )" + split + R"(
  br i1 %low, label %a, label %b
a:
  call void @llvm.nvvm.barrier0()
  br label %done
b:
  call void @llvm.nvvm.barrier0()
  br label %done
done:
  %i = zext i32 %tid to i64
  %slot = getelementptr i32, ptr %out, i64 %i
  store i32 %tid, ptr %slot
  ret void
}
)";
  };
  std::vector<int32_t> out(64);
  auto lanes = emulate(kernel("icmp ult i32 %tid, 16"), {"split"});
  ASSERT_TRUE(lanes);
  std::string message = errorOf(*lanes, "split", 32, out);
  EXPECT_NE(message.find("cuda-emu: warp 0 of kernel split"), std::string::npos) << message;
  EXPECT_NE(message.find("at bar.sync #1 and lane 0 at bar.sync #0 (bar.sync is aligned: a "
                         "warp's lanes must wait at the same one)"),
            std::string::npos)
      << message;
  auto warps = emulate(kernel("icmp ult i32 %tid, 32"), {"split"});
  ASSERT_TRUE(warps);
  EXPECT_EQ(errorOf(*warps, "split", 64, out), "");
  EXPECT_EQ(out[63], 63);
}

TEST(SimtTest, AStorePastTheBufferIsAnError) {
  std::string ir = std::string(kDeclarations) + R"(
define void @shifted(ptr %out) {
  %tid = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %i = zext i32 %tid to i64
  %j = add i64 %i, 1
  %slot = getelementptr i32, ptr %out, i64 %j
  store i32 %tid, ptr %slot
  ret void
}
)";
  auto module = emulate(ir, {"shifted"});
  ASSERT_TRUE(module);
  std::vector<int32_t> out(32);
  std::string error = errorOf(*module, "shifted", 32, out);
  EXPECT_NE(error.find(", 128 bytes into an argument's buffer of 128, in kernel shifted, "
                       "CTA (0, 0), thread 31"),
            std::string::npos)
      << error;
}

TEST(SimtTest, ALaneThatSkipsAWarpOpIsADeadlock) {
  // Lane 5 takes a branch around the shuffle the other lanes wait at and
  // exits: an error with the kernel and warp, not a hang. And a warp split
  // between a barrier and a shuffle: no thread can run.
  auto kernel = [](const char *skip, bool barrier) {
    return std::string(kDeclarations) + R"(
define void @skips(ptr %out) {
  %tid = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()
  %skip = )" + skip + R"(
  br i1 %skip, label %other, label %shuffle
other:
)" + (barrier ? "  call void @llvm.nvvm.barrier0()\n" : "") + R"(  ret void
shuffle:
  %v = call i32 @llvm.nvvm.shfl.sync.bfly.i32(i32 -1, i32 %tid, i32 1, i32 31)
  %i = zext i32 %tid to i64
  %slot = getelementptr i32, ptr %out, i64 %i
  store i32 %v, ptr %slot
  ret void
}
)";
  };
  std::vector<int32_t> out(64);
  auto lane5 = emulate(kernel("icmp eq i32 %tid, 5", false), {"skips"});
  ASSERT_TRUE(lane5);
  EXPECT_EQ(errorOf(*lane5, "skips", 32, out),
            "cuda-emu: warp 0 of kernel skips, CTA (0, 0): lane 5 exited, and the lanes of "
            "the mask wait for it");
  auto half = emulate(kernel("icmp ult i32 %tid, 16", true), {"skips"});
  ASSERT_TRUE(half);
  {
    std::string message = errorOf(*half, "skips", 64, out);
    EXPECT_NE(message.find("cuda-emu: deadlock in kernel skips: no thread can run"),
              std::string::npos)
        << message;
    // Warp 1 shuffles and exits; warp 0 is split.
    EXPECT_NE(message.find("CTA (0, 0): 16 threads at bar.sync (first 0), 16 at a "
                           "warp-synchronous op (first 16, warp 0), 32 exited"),
              std::string::npos)
        << message;
  }
}

TEST(SimtTest, AnUnknownIntrinsicIsNamed) {
  std::string ir = R"(
declare i32 @llvm.nvvm.read.ptx.sreg.clock()
define void @clocked(ptr %out) {
  %t = call i32 @llvm.nvvm.read.ptx.sreg.clock()
  store i32 %t, ptr %out
  ret void
}
)";
  llvm::LLVMContext context;
  llvm::SMDiagnostic diag;
  auto module = llvm::parseAssemblyString(ir, diag, context);
  ASSERT_TRUE(module);
  llvm::Error e = compileSimtObject(*module, {"clocked"}, "/nonexistent/x.so");
  EXPECT_EQ(llvm::toString(std::move(e)),
            "cellc: the SIMT emulator has no hook for the intrinsic "
            "llvm.nvvm.read.ptx.sreg.clock (in kernel clocked)");
}

} // namespace
