//===- Simt.cpp - Run CUDA kernels on the CPU, thread by thread -----------===//

#include "runtime/emu/Simt.h"


#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <sys/mman.h>
#include <type_traits>
#include <ucontext.h>

using namespace cellc::emu;

namespace {

constexpr unsigned kWarp = 32;
/// Each thread's stack: the kernels keep their registers' arrays there.
constexpr size_t kStackBytes = 256 << 10;

enum class State { Runnable, AtBarrier, AtWarp, Done };

/// A lane's part in a warp-synchronous op, and what it gets back.
struct WarpOp {
  enum Kind { Shuffle, Mma } kind = Shuffle;
  uint32_t mode = 0, mask = 0, value = 0, b = 0, c = 0;
  uint32_t shape = 0;
  const uint32_t *aRegs = nullptr, *bRegs = nullptr;
  const float *cRegs = nullptr;
  float *dRegs = nullptr;
  uint64_t result = 0;
};

/// Who touched a byte of shared memory since the CTA's last barrier.
struct Shadow {
  uint32_t writeEpoch = 0, readEpoch = 0;
  int32_t writer = -1, reader = -1, otherReader = -1;
};

struct Cta;

struct Thread {
  ucontext_t context;
  void *stack = nullptr;
  Cta *cta = nullptr;
  unsigned tid = 0;
  State state = State::Runnable;
  WarpOp op;
  /// The bar.sync it waits at (its site in the kernel's module).
  int32_t barrierSite = -1;
  ~Thread() {
    if (stack)
      munmap(stack, kStackBytes);
  }
};

struct Cta {
  unsigned x = 0, y = 0;
  std::unique_ptr<char, decltype(&std::free)> shared{nullptr, &std::free};
  uint64_t sharedBytes = 0;
  std::vector<Shadow> shadow;
  /// The barriers passed so far, plus one: the epoch of the race check.
  uint32_t epoch = 1;
  std::vector<std::unique_ptr<Thread>> threads;
};

/// The launch that runs on this OS thread.
struct Grid {
  const Launch *launch = nullptr;
  const std::vector<Module::SharedVariable> *variables = nullptr;
  cellc::runtime::Entry entry = nullptr;
  std::vector<Cta *> resident;
  Thread *current = nullptr;
  ucontext_t scheduler;
  std::string error;
  LaunchStats stats;
  /// Yields at atomics and fences since a barrier, a warp op or a thread
  /// last completed: spinning with nothing else going on is a livelock.
  uint64_t spins = 0;
};

/// Spins with no barrier, warp op or exit anywhere: a grid barrier whose
/// CTAs are not all resident, or a flag nobody sets.
constexpr uint64_t kLivelockSpins = 2000000;

thread_local Grid *grid = nullptr;

Thread &self() { return *grid->current; }

std::string ctaName(const Cta &cta) {
  return "CTA (" + std::to_string(cta.x) + ", " + std::to_string(cta.y) + ")";
}

std::string kernelAt(const Cta &cta) {
  return "kernel " + grid->launch->kernel + ", " + ctaName(cta);
}

/// Back to the scheduler; the thread runs on when it is runnable again.
void yieldThread() {
  ++grid->stats.switches;
  swapcontext(&self().context, &grid->scheduler);
}

/// Ends the launch with `message`: the thread never runs again.
[[noreturn]] void abortLaunch(const std::string &message) {
  if (grid->error.empty())
    grid->error = "cuda-emu: " + message;
  self().state = State::Done;
  swapcontext(&self().context, &grid->scheduler);
  std::abort(); // never resumed
}

// --- Barriers and warps ---------------------------------------------------

/// bar.sync waits for the CTA's threads that have not exited: when each of
/// them is there, all go on, into the race check's next epoch.
void releaseBarrier(Cta &cta) {
  bool waiting = false;
  for (auto &u : cta.threads) {
    if (u->state != State::AtBarrier && u->state != State::Done)
      return;
    waiting |= u->state == State::AtBarrier;
  }
  if (!waiting)
    return;
  for (auto &u : cta.threads)
    if (u->state == State::AtBarrier)
      u->state = State::Runnable;
  ++cta.epoch;
  grid->spins = 0;
}

std::string warpName(Thread &t);

/// bar.sync is barrier.sync.aligned: the lanes of a warp that wait at one
/// must wait at the same one. On a GPU a warp whose lanes reach two
/// different bar.sync counts at the first, and the CTA hangs or goes on
/// early; here each thread would count on its own.
void checkAligned(Thread &t) {
  unsigned first = t.tid / kWarp * kWarp;
  for (unsigned i = first; i < first + kWarp && i < t.cta->threads.size(); ++i) {
    Thread &u = *t.cta->threads[i];
    if (u.state == State::AtBarrier && u.barrierSite != t.barrierSite)
      abortLaunch(warpName(t) + ": lane " + std::to_string(t.tid - first) +
                  " waits at bar.sync #" + std::to_string(t.barrierSite) + " and lane " +
                  std::to_string(i - first) + " at bar.sync #" +
                  std::to_string(u.barrierSite) +
                  " (bar.sync is aligned: a warp's lanes must wait at the same one)");
  }
}

void hook_barrier(int32_t site) {
  Thread &t = self();
  ++grid->stats.barriers;
  t.state = State::AtBarrier;
  t.barrierSite = site;
  checkAligned(t);
  releaseBarrier(*t.cta);
  yieldThread();
}

/// The lanes of `t`'s warp.
std::vector<Thread *> warpOf(Thread &t) {
  std::vector<Thread *> lanes;
  unsigned first = t.tid / kWarp * kWarp;
  for (unsigned i = first; i < first + kWarp && i < t.cta->threads.size(); ++i)
    lanes.push_back(t.cta->threads[i].get());
  return lanes;
}

std::string warpName(Thread &t) {
  return "warp " + std::to_string(t.tid / kWarp) + " of " + kernelAt(*t.cta);
}

float tf32(uint32_t bits) {
  // The tensor cores read a tf32 operand's sign, exponent and top 10
  // mantissa bits: the low 13 are dropped.
  bits &= 0xffffe000u;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float bf16(uint16_t half) {
  uint32_t bits = uint32_t(half) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

/// mma.sync over a whole warp, with the fragment layouts of the PTX ISA
/// ("Matrix Fragments for mma.m16n8k8" (.tf32) and "for mma.m16n8k16 with
/// floating point type" (.bf16)): with g = lane / 4 and q = lane % 4,
///   tf32 A (16 x 8):  a0 (g, q), a1 (g+8, q), a2 (g, q+4), a3 (g+8, q+4);
///        B (8 x 8):   b0 (q, g), b1 (q+4, g);
///   bf16 A (16 x 16): element i (low half first) at row g + 8 [i in 2,3,6,7],
///                     column 2q + (i & 1) + 8 [i >= 4];
///        B (16 x 8):  element i at row 2q + (i & 1) + 8 [i >= 2], column g;
///   C, D (16 x 8):    c_i at row g + 8 [i >= 2], column 2q + (i & 1).
/// The products are exact in double; the sum is rounded once to f32.
void runMma(const std::vector<Thread *> &lanes) {
  bool isBf16 = lanes[0]->op.shape == 1;
  int K = isBf16 ? 16 : 8;
  double A[16][16] = {}, B[16][8] = {}, C[16][8] = {};
  for (unsigned lane = 0; lane < kWarp; ++lane) {
    const WarpOp &op = lanes[lane]->op;
    unsigned g = lane / 4, q = lane % 4;
    if (isBf16) {
      for (unsigned i = 0; i < 8; ++i) {
        uint16_t half = uint16_t(op.aRegs[i / 2] >> (16 * (i % 2)));
        A[g + 8 * ((i >> 1) & 1)][2 * q + (i & 1) + 8 * (i >= 4)] = bf16(half);
      }
      for (unsigned i = 0; i < 4; ++i) {
        uint16_t half = uint16_t(op.bRegs[i / 2] >> (16 * (i % 2)));
        B[2 * q + (i & 1) + 8 * (i >= 2)][g] = bf16(half);
      }
    } else {
      A[g][q] = tf32(op.aRegs[0]);
      A[g + 8][q] = tf32(op.aRegs[1]);
      A[g][q + 4] = tf32(op.aRegs[2]);
      A[g + 8][q + 4] = tf32(op.aRegs[3]);
      B[q][g] = tf32(op.bRegs[0]);
      B[q + 4][g] = tf32(op.bRegs[1]);
    }
    for (unsigned i = 0; i < 4; ++i)
      C[g + 8 * (i >= 2)][2 * q + (i & 1)] = op.cRegs[i];
  }
  for (unsigned lane = 0; lane < kWarp; ++lane) {
    unsigned g = lane / 4, q = lane % 4;
    for (unsigned i = 0; i < 4; ++i) {
      unsigned row = g + 8 * (i >= 2), col = 2 * q + (i & 1);
      double sum = C[row][col];
      for (int k = 0; k < K; ++k)
        sum += A[row][k] * B[k][col];
      lanes[lane]->op.dRegs[i] = float(sum);
    }
  }
}

/// shfl.sync for every lane of `mask`, as the PTX ISA writes it.
void runShuffle(const std::vector<Thread *> &lanes, uint32_t mask) {
  for (unsigned lane = 0; lane < lanes.size(); ++lane) {
    if (!(mask >> lane & 1))
      continue;
    WarpOp &op = lanes[lane]->op;
    uint32_t bval = op.b & 31, cval = op.c & 31, segmask = (op.c >> 8) & 31;
    uint32_t maxLane = (lane & segmask) | (cval & ~segmask), minLane = lane & segmask;
    int32_t j = 0;
    bool pval = false;
    switch (op.mode) {
    case 0:
      j = int32_t(lane) - int32_t(bval);
      pval = j >= int32_t(maxLane);
      break;
    case 1:
      j = int32_t(lane + bval);
      pval = j <= int32_t(maxLane);
      break;
    case 2:
      j = int32_t(lane ^ bval);
      pval = j <= int32_t(maxLane);
      break;
    default:
      j = int32_t(minLane | (bval & ~segmask));
      pval = j <= int32_t(maxLane);
      break;
    }
    if (!pval)
      j = int32_t(lane);
    if (j < 0 || j >= int32_t(lanes.size()) || !(mask >> j & 1)) {
      abortLaunch("shfl.sync in " + warpName(*lanes[lane]) + ": lane " +
                  std::to_string(lane) + " reads lane " + std::to_string(j) +
                  ", which is not in the member mask");
    }
    op.result = lanes[j]->op.value | (uint64_t(pval) << 32);
  }
}

/// A lane arrives at a warp-synchronous op. The last of the lanes it waits
/// for runs the op for all of them.
void arriveAtWarpOp(WarpOp::Kind kind, uint32_t mask) {
  Thread &t = self();
  ++grid->stats.warpOps;
  t.op.kind = kind;
  t.op.mask = mask;
  t.state = State::AtWarp;
  std::vector<Thread *> lanes = warpOf(t);
  unsigned lane = t.tid % kWarp;
  if (!(mask >> lane & 1))
    abortLaunch(warpName(t) + ": lane " + std::to_string(lane) +
                " runs a warp-synchronous op outside its member mask");
  for (unsigned i = 0; i < lanes.size(); ++i) {
    if (!(mask >> i & 1))
      continue;
    Thread &u = *lanes[i];
    if (u.state == State::Done)
      abortLaunch(warpName(t) + ": lane " + std::to_string(i) +
                  " exited, and the lanes of the mask wait for it");
    if (u.state != State::AtWarp)
      return yieldThread(); // the others come later
    if (u.op.kind != kind || u.op.mask != mask || u.op.shape != t.op.shape)
      abortLaunch(warpName(t) + ": lanes " + std::to_string(lane) + " and " +
                  std::to_string(i) + " meet at different warp-synchronous ops");
  }
  if (kind == WarpOp::Mma) {
    if (lanes.size() != kWarp || mask != 0xffffffffu)
      abortLaunch("mma.sync in " + warpName(t) + " needs all 32 lanes");
    runMma(lanes);
  } else {
    runShuffle(lanes, mask);
  }
  for (unsigned i = 0; i < lanes.size(); ++i)
    if (mask >> i & 1)
      lanes[i]->state = State::Runnable;
  grid->spins = 0;
  yieldThread();
}

// --- Memory checks ---------------------------------------------------------

std::string variableAt(uint64_t offset) {
  for (const Module::SharedVariable &v : *grid->variables)
    if (offset >= v.offset && (offset < v.offset + v.bytes || v.bytes == 0))
      return "byte " + std::to_string(offset - v.offset) + " of " + v.name;
  return "byte " + std::to_string(offset) + " of shared memory";
}

[[noreturn]] void race(Thread &t, uint64_t offset, const char *does, int32_t other,
                       const char *did) {
  abortLaunch("shared-memory race in " + kernelAt(*t.cta) + ": thread " +
              std::to_string(t.tid) + " " + does + " " + variableAt(offset) +
              " (offset " + std::to_string(offset) + "), which thread " +
              std::to_string(other) + " " + did + " since the last bar.sync");
}

void checkShared(Thread &t, uint64_t offset, uint64_t bytes, bool write) {
  Cta &cta = *t.cta;
  ++grid->stats.sharedAccesses;
  if (offset + bytes > cta.sharedBytes)
    abortLaunch("shared-memory access out of bounds in " + kernelAt(cta) + ": thread " +
                std::to_string(t.tid) + " touches bytes " + std::to_string(offset) +
                " to " + std::to_string(offset + bytes) + " of " +
                std::to_string(cta.sharedBytes));
  int32_t me = int32_t(t.tid);
  for (uint64_t k = offset; k < offset + bytes; ++k) {
    Shadow &s = cta.shadow[k];
    bool written = s.writeEpoch == cta.epoch && s.writer != me;
    if (write) {
      if (written)
        race(t, k, "writes", s.writer, "wrote");
      if (s.readEpoch == cta.epoch && (s.reader != me || s.otherReader >= 0))
        race(t, k, "writes", s.reader != me ? s.reader : s.otherReader, "read");
      s.writeEpoch = cta.epoch;
      s.writer = me;
    } else {
      if (written)
        race(t, k, "reads", s.writer, "wrote");
      if (s.readEpoch != cta.epoch) {
        s.readEpoch = cta.epoch;
        s.reader = me;
        s.otherReader = -1;
      } else if (s.reader != me) {
        s.otherReader = me;
      }
    }
  }
}

void checkGlobal(Thread &t, uintptr_t address, uint64_t bytes, bool write,
                 const char *what, uintptr_t base = 0) {
  uintptr_t arena = uintptr_t(t.cta->shared.get());
  if (address >= arena && address < arena + t.cta->sharedBytes)
    return checkShared(t, address - arena, bytes, write);
  ++grid->stats.globalAccesses;
  const std::vector<Buffer> &buffers = grid->launch->buffers;
  if (buffers.empty())
    return;
  char at[32];
  std::snprintf(at, sizeof at, "%#lx", (unsigned long)address);
  std::string access = std::string("global ") + what + " of " + std::to_string(bytes) +
                       " bytes at " + at;
  std::string where = ", in " + kernelAt(*t.cta) + ", thread " + std::to_string(t.tid);
  // Within the buffer of the argument it derives from, where that is known
  // (a neighbouring buffer does not excuse it).
  for (const Buffer &b : buffers)
    if (base && b.begin == base) {
      if (address >= b.begin && address + bytes <= b.begin + b.bytes)
        return;
      abortLaunch(access + ", " + std::to_string(int64_t(address - b.begin)) +
                  " bytes into an argument's buffer of " + std::to_string(b.bytes) + where);
    }
  for (const Buffer &b : buffers)
    if (address >= b.begin && address + bytes <= b.begin + b.bytes)
      return;
  abortLaunch(access + " outside every buffer of the launch" + where);
}

// --- The hooks --------------------------------------------------------------

int32_t hook_tid_x() { return int32_t(self().tid); }
// One-dimensional blocks: y and z are 0 of 1.
int32_t hook_tid_y() { return 0; }
int32_t hook_tid_z() { return 0; }
int32_t hook_ntid_y() { return 1; }
int32_t hook_ntid_z() { return 1; }
int32_t hook_ctaid_z() { return 0; }
int32_t hook_nctaid_z() { return 1; }
int32_t hook_ntid_x() { return int32_t(grid->launch->block); }
int32_t hook_ctaid_x() { return int32_t(self().cta->x); }
int32_t hook_ctaid_y() { return int32_t(self().cta->y); }
int32_t hook_nctaid_x() { return int32_t(grid->launch->gridX); }
int32_t hook_nctaid_y() { return int32_t(grid->launch->gridY); }
int32_t hook_laneid() { return int32_t(self().tid % kWarp); }
void *hook_shared_base() { return self().cta->shared.get(); }

int64_t hook_shfl(int32_t mode, int32_t mask, int32_t value, int32_t b, int32_t c) {
  WarpOp &op = self().op;
  op.mode = uint32_t(mode);
  op.value = uint32_t(value);
  op.b = uint32_t(b);
  op.c = uint32_t(c);
  op.shape = 0;
  arriveAtWarpOp(WarpOp::Shuffle, uint32_t(mask));
  return int64_t(self().op.result);
}

void hook_mma(int32_t shape, void *a, void *b, void *c, void *d) {
  WarpOp &op = self().op;
  op.shape = uint32_t(shape);
  op.aRegs = static_cast<const uint32_t *>(a);
  op.bRegs = static_cast<const uint32_t *>(b);
  op.cRegs = static_cast<const float *>(c);
  op.dRegs = static_cast<float *>(d);
  arriveAtWarpOp(WarpOp::Mma, 0xffffffffu);
}

/// After an atomic or a fence: another thread or CTA may run.
void spin() {
  if (++grid->spins > kLivelockSpins)
    abortLaunch("livelock in kernel " + grid->launch->kernel + ": the threads have " +
                "spun on atomics " + std::to_string(kLivelockSpins) +
                " times with no barrier, warp op or exit anywhere (a grid barrier whose "
                "CTAs are not all resident needs a cooperative launch)");
  yieldThread();
}

void hook_fence() { spin(); }

void hook_atomic(void *address, int64_t bytes) {
  checkGlobal(self(), uintptr_t(address), uint64_t(bytes), true, "atomic");
  spin();
}

void hook_shared_access(void *address, int64_t bytes, int32_t write) {
  Thread &t = self();
  uintptr_t arena = uintptr_t(t.cta->shared.get());
  if (uintptr_t(address) < arena)
    abortLaunch("shared-memory access below the arena in " + kernelAt(*t.cta));
  checkShared(t, uintptr_t(address) - arena, uint64_t(bytes), write != 0);
}

void hook_global_access(void *address, int64_t bytes, int32_t write, void *base) {
  checkGlobal(self(), uintptr_t(address), uint64_t(bytes), write != 0,
              write ? "store" : "load", uintptr_t(base));
}

// Each hook has the type EmulatorHooks.def gives it: the object calls it
// through a pointer of that type.
namespace words {
using Void = void;
using I32 = int32_t;
using I64 = int64_t;
using Ptr = void *;
#define CELLC_EMU_HOOK(name, result, ...)                                      \
  static_assert(std::is_same_v<decltype(&hook_##name), result (*)(__VA_ARGS__)>, \
                "hook_" #name " does not have EmulatorHooks.def's type");
#include "dialects/Cell/IR/EmulatorHooks.def"
} // namespace words

/// The table the object calls through, in EmulatorHooks.def's order.
std::vector<void *> hookTable() {
  return {
#define CELLC_EMU_HOOK(name, ...) reinterpret_cast<void *>(&hook_##name),
#include "dialects/Cell/IR/EmulatorHooks.def"
  };
}

// --- The schedule -----------------------------------------------------------

void threadMain() {
  grid->entry(grid->launch->params);
  self().state = State::Done;
  // Returning resumes the scheduler (uc_link).
}

/// The thread's context: threadMain on its own stack, back to the scheduler
/// at its end.
void prepareFiber(Thread &t) {
  getcontext(&t.context);
  t.context.uc_stack.ss_sp = t.stack;
  t.context.uc_stack.ss_size = kStackBytes;
  t.context.uc_link = &grid->scheduler;
  makecontext(&t.context, threadMain, 0);
}

std::unique_ptr<Cta> makeCta(unsigned x, unsigned y, uint64_t sharedBytes) {
  auto cta = std::make_unique<Cta>();
  cta->x = x;
  cta->y = y;
  cta->sharedBytes = sharedBytes;
  size_t rounded = (sharedBytes + 63) / 64 * 64 + 64;
  cta->shared.reset(static_cast<char *>(std::aligned_alloc(64, rounded)));
  // Garbage, not zeros: a kernel that reads shared memory it never wrote
  // should not get lucky.
  std::memset(cta->shared.get(), 0x7f, rounded);
  cta->shadow.assign(sharedBytes, Shadow());
  for (unsigned tid = 0; tid < grid->launch->block; ++tid) {
    auto t = std::make_unique<Thread>();
    t->cta = cta.get();
    t->tid = tid;
    t->stack = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (t->stack == MAP_FAILED) {
      t->stack = nullptr;
      throw EmuError("cuda-emu: cannot map a thread's stack");
    }
    prepareFiber(*t);
    cta->threads.push_back(std::move(t));
  }
  return cta;
}

/// Who waits where, for a deadlock's message.
std::string describeWaits() {
  std::ostringstream os;
  for (Cta *cta : grid->resident) {
    std::vector<unsigned> barrier, warp, done;
    for (auto &t : cta->threads)
      (t->state == State::AtBarrier ? barrier
       : t->state == State::AtWarp  ? warp
                                    : done)
          .push_back(t->tid);
    if (barrier.empty() && warp.empty())
      continue;
    os << "\n  " << ctaName(*cta) << ": " << barrier.size() << " threads at bar.sync";
    if (!barrier.empty())
      os << " (first " << barrier.front() << ")";
    os << ", " << warp.size() << " at a warp-synchronous op";
    if (!warp.empty())
      os << " (first " << warp.front() << ", warp " << warp.front() / kWarp << ")";
    os << ", " << done.size() << " exited";
  }
  return os.str();
}

/// Runs the resident CTAs' threads until all have exited.
void runResident() {
  std::vector<Thread *> order;
  for (Cta *cta : grid->resident)
    for (auto &t : cta->threads)
      order.push_back(t.get());
  std::mt19937_64 random(grid->launch->shuffleSeed);
  while (true) {
    if (grid->launch->shuffleSeed)
      std::shuffle(order.begin(), order.end(), random);
    bool ran = false, live = false;
    for (Thread *t : order) {
      if (t->state != State::Runnable)
        continue;
      grid->current = t;
      swapcontext(&grid->scheduler, &t->context);
      grid->current = nullptr;
      ran = true;
      if (!grid->error.empty())
        throw EmuError(grid->error);
      if (t->state == State::Done) {
        grid->spins = 0;
        releaseBarrier(*t->cta);
      }
    }
    for (Thread *t : order)
      live |= t->state != State::Done;
    if (!live)
      return;
    if (!ran)
      throw EmuError("cuda-emu: deadlock in kernel " + grid->launch->kernel +
                     ": no thread can run" + describeWaits());
  }
}

} // namespace

Module::Module(const std::string &path) {
  if (cellc::driver::Status status = object.open(path))
    throw EmuError(status.message());
  auto *table = static_cast<void **>(object.symbol("cellc_emu_hooks"));
  auto *count = static_cast<const int64_t *>(object.symbol("cellc_emu_shared_count"));
  auto *bytes = static_cast<const int64_t *>(object.symbol("cellc_emu_static_shared_bytes"));
  if (!table || !count || !bytes)
    throw EmuError("cuda-emu: " + path + " is not an emulated CUDA object (no hook table)");
  std::vector<void *> hooks = hookTable();
  auto *hookCount = static_cast<const int64_t *>(object.symbol("cellc_emu_hook_count"));
  if (!hookCount || *hookCount != int64_t(hooks.size()))
    throw EmuError("cuda-emu: " + path + " was written by another cellc (its hooks are not "
                   "this runtime's): write it again with this one");
  std::copy(hooks.begin(), hooks.end(), table);
  struct Row {
    int64_t offset, bytes;
    const char *name;
  };
  auto *rows = static_cast<const Row *>(object.symbol("cellc_emu_shared"));
  for (int64_t i = 0; i < *count; ++i)
    shared.push_back({uint64_t(rows[i].offset), uint64_t(rows[i].bytes),
                      rows[i].bytes ? rows[i].name : "dynamic shared memory"});
  staticShared = uint64_t(*bytes);
}

LaunchStats Module::launch(const Launch &launch) const {
  cellc::runtime::Entry entry = object.entry(launch.kernel);
  if (!entry)
    throw EmuError("cuda-emu: no kernel '" + launch.kernel + "' in the object");
  if (launch.block == 0 || launch.block > 1024 || launch.gridX == 0 || launch.gridY == 0)
    throw EmuError("cuda-emu: a launch of " + launch.kernel + " needs 1 to 1024 threads "
                   "and a grid of at least one CTA");
  if (grid)
    throw EmuError("cuda-emu: a kernel cannot launch another");
  Grid state;
  state.launch = &launch;
  state.variables = &shared;
  state.entry = entry;
  grid = &state;
  struct Reset {
    ~Reset() { grid = nullptr; }
  } reset;
  uint64_t sharedBytes = staticShared + launch.dynamicShared;
  auto runCtas = [&](std::vector<std::unique_ptr<Cta>> ctas) {
    state.resident.clear();
    for (auto &cta : ctas)
      state.resident.push_back(cta.get());
    runResident();
  };
  if (launch.cooperative) {
    std::vector<std::unique_ptr<Cta>> all;
    for (unsigned y = 0; y < launch.gridY; ++y)
      for (unsigned x = 0; x < launch.gridX; ++x)
        all.push_back(makeCta(x, y, sharedBytes));
    runCtas(std::move(all));
  } else {
    for (unsigned y = 0; y < launch.gridY; ++y)
      for (unsigned x = 0; x < launch.gridX; ++x) {
        std::vector<std::unique_ptr<Cta>> one;
        one.push_back(makeCta(x, y, sharedBytes));
        runCtas(std::move(one));
      }
  }
  return state.stats;
}
