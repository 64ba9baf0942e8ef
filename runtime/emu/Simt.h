//===- Simt.h - Run CUDA kernels on the CPU, thread by thread ---*- C++ -*-===//
//
// The SIMT emulator's runtime half. It runs the CUDA kernels' own code,
// retargeted to the host (compiler/Pipelines/SimtToHost.cpp), with CUDA's
// threads, warps and barriers: every thread of a CTA is a fiber (ucontext),
// and a fiber gives way at bar.sync, at each warp-synchronous op (where the
// lanes of its warp meet) and after each atomic and fence. A cooperative
// grid's CTAs are all resident at once, as on the device; other grids run a
// CTA at a time. The schedule is deterministic; a seed shuffles the order
// of the threads between sync points.
//
// It checks what hardware does not: a shared-memory race between two
// barriers, a global access outside the launch's buffers, and a thread or
// lane that never reaches the barrier or warp op that the others wait at
// (a deadlock, reported, never a hang). Each is an EmuError that names the
// kernel, the CTA and the threads.
//
// No LLVM or MLIR: it opens an object with dlopen, as runtime/cpu does.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_RUNTIME_EMU_SIMT_H
#define CELLC_RUNTIME_EMU_SIMT_H

#include "runtime/cpu/Kernels.h"

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace cellc::emu {

/// A kernel's failure under the emulator (a race, an access out of bounds,
/// a deadlock), or a bad object or launch.
class EmuError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// A range of host memory that the kernel may access as global memory.
struct Buffer {
  uintptr_t begin = 0;
  uint64_t bytes = 0;
};

/// One launch, as cuLaunchKernel takes it.
struct Launch {
  std::string kernel;
  unsigned gridX = 1, gridY = 1, block = 1;
  /// Bytes of dynamic shared memory per CTA.
  unsigned dynamicShared = 0;
  /// All CTAs resident together (the persistent strategy's grid barriers).
  bool cooperative = false;
  /// A pointer to each argument's value.
  void **params = nullptr;
  /// The global memory the kernel may touch; none: not checked.
  std::vector<Buffer> buffers;
  /// Nonzero: the order of the runnable threads is shuffled with this seed
  /// at each round of the schedule.
  uint64_t shuffleSeed = 0;
};

/// What the emulator counted in a launch.
struct LaunchStats {
  uint64_t switches = 0, barriers = 0, warpOps = 0, sharedAccesses = 0,
           globalAccesses = 0;
};

/// An emulated object (`cellc_packed_<kernel>` entries, the hook table and
/// the shared-memory layout), open for as long as this lives.
class Module {
public:
  /// Opens `path`; throws EmuError when it is not an emulated object.
  explicit Module(const std::string &path);

  /// Runs `launch` to the end; throws EmuError with what went wrong.
  LaunchStats launch(const Launch &launch) const;
  /// The bytes of static shared memory a CTA of the object's kernels takes.
  uint64_t staticSharedBytes() const { return staticShared; }

  /// A shared variable's place in each CTA's arena.
  struct SharedVariable {
    uint64_t offset = 0, bytes = 0;
    std::string name;
  };

private:
  runtime::SharedObject object;
  std::vector<SharedVariable> shared;
  uint64_t staticShared = 0;
};

} // namespace cellc::emu

#endif // CELLC_RUNTIME_EMU_SIMT_H
