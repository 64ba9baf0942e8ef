//===- DeviceModel.cpp - What a GPU holds, for the SIMT emulator -----------===//

#include "runtime/emu/DeviceModel.h"

#include <algorithm>
#include <string>

using namespace cellc;
using namespace cellc::emu;
using cuda::Residency;
using cuda::Status;

DeviceModel DeviceModel::h100() {
  DeviceModel m;
  m.name = "an H100/H200 (sm_90, 132 SMs)";
  m.sms = 132;
  m.threadsPerSm = 2048;
  m.ctasPerSm = 32;
  m.registersPerSm = 65536;
  m.registersPerThread = 255;
  m.sharedPerSm = 233472;
  m.sharedPerCta = 232448;
  m.sharedReservedPerCta = 1024;
  return m;
}

Residency DeviceModel::residency(int64_t threads, int64_t sharedBytes,
                                 int64_t registers) const {
  Residency r;
  r.sms = sms;
  int64_t warps = (std::max<int64_t>(threads, 1) + 31) / 32;
  int64_t perSm = std::min(ctasPerSm, threadsPerSm / (warps * 32));
  if (registers > 0) {
    // A warp's registers in units of 256, from one of four files a quarter
    // of the SM's each.
    int64_t perWarp = (registers * 32 + 255) / 256 * 256;
    int64_t warpsFit = 4 * ((registersPerSm / 4) / perWarp);
    perSm = std::min(perSm, warpsFit / warps);
  }
  int64_t shared = (sharedBytes + sharedReservedPerCta + 127) / 128 * 128;
  perSm = std::min(perSm, sharedPerSm / shared);
  r.perSm = std::max<int64_t>(perSm, 0);
  return r;
}

Status DeviceModel::admit(const cuda::LaunchSpec &spec, int64_t staticShared) const {
  const std::string kernel = "kernel " + spec.kernel;
  auto invalid = [&](const std::string &what) {
    return Status::error(kernel + ": " + what +
                         ": CUDA_ERROR_INVALID_VALUE (invalid argument) on " + name);
  };
  if (spec.block == 0 || int64_t(spec.block) > threadsPerCta)
    return invalid("a CTA of " + std::to_string(spec.block) + " threads (cuLaunchKernel)");
  if (spec.gridX == 0 || spec.gridY == 0 || int64_t(spec.gridX) > gridX ||
      int64_t(spec.gridY) > gridY)
    return invalid("a grid of " + std::to_string(spec.gridX) + " x " +
                   std::to_string(spec.gridY) + " CTAs (cuLaunchKernel)");
  int64_t shared = staticShared + spec.sharedBytes;
  if (shared > sharedPerCta)
    return invalid("asking for " + std::to_string(shared) +
                   " bytes of shared memory, past the " + std::to_string(sharedPerCta) +
                   " a CTA may opt in to (cuFuncSetAttribute)");
  if (spec.registers > registersPerThread ||
      (spec.registers > 0 && spec.registers * int64_t(spec.block) > registersPerSm))
    return Status::error(kernel + ": cuLaunchKernel: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES (too "
                         "many resources requested for launch): " +
                         std::to_string(spec.registers) + " registers x " +
                         std::to_string(spec.block) + " threads on " + name);
  if (spec.cooperative) {
    Residency fits = residency(spec.block, shared, spec.registers);
    if (int64_t(spec.gridX) * spec.gridY > fits.total())
      return cuda::cooperativeTooLarge(spec, fits);
  }
  return Status();
}
