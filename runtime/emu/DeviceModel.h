//===- DeviceModel.h - What a GPU holds, for the SIMT emulator -*- C++ -*-===//
//
// The emulator runs any grid: every CTA of a cooperative launch is resident,
// and a CTA may take any shared memory. A GPU refuses what it cannot hold,
// so the emulator refuses it too, under a model of one GPU's limits: an
// H100 or H200 (sm_90) by default, the GPUs this project's runs get. The
// occupancy follows the CUDA occupancy calculator's rules for sm_90:
// threads, CTAs, registers (allocated per warp, 256 at a time, from each of
// the SM's four 16K-register files) and shared memory (with the 1 KiB a CTA
// reserves) per SM, times the SMs.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_RUNTIME_EMU_DEVICEMODEL_H
#define CELLC_RUNTIME_EMU_DEVICEMODEL_H

#include "runtime/cuda/Device.h"

#include <cstdint>

namespace cellc::emu {

struct DeviceModel {
  /// An H100 SXM or H200: 132 SMs of sm_90.
  static DeviceModel h100();

  const char *name = "";
  int64_t sms = 0;
  int64_t threadsPerSm = 0, ctasPerSm = 0;
  int64_t registersPerSm = 0, registersPerThread = 0;
  /// Shared memory: per SM, the most a CTA may opt in to, and what each
  /// resident CTA reserves besides its own.
  int64_t sharedPerSm = 0, sharedPerCta = 0, sharedReservedPerCta = 0;
  int64_t threadsPerCta = 1024, gridX = (int64_t(1) << 31) - 1, gridY = 65535;

  /// How many CTAs of `threads` threads, `sharedBytes` of shared memory
  /// (static and dynamic) and `registers` per thread (-1: not known, not
  /// counted) fit on an SM, and on the GPU.
  cuda::Residency residency(int64_t threads, int64_t sharedBytes, int64_t registers) const;
  /// What the driver would refuse of `spec` (a kernel with `staticShared`
  /// bytes of static shared memory), in its words.
  cuda::Status admit(const cuda::LaunchSpec &spec, int64_t staticShared) const;
};

} // namespace cellc::emu

#endif // CELLC_RUNTIME_EMU_DEVICEMODEL_H
