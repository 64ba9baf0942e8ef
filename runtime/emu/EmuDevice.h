//===- EmuDevice.h - The CUDA backend's leaves in the SIMT emulator -*- C++ -*-===//
//
// The same calls as a GPU gets, on host memory: the package's kernels in
// the SIMT emulator (Simt.h: every CUDA thread a fiber, with its race,
// bounds and deadlock checks), the GEMMs on the host's BLAS where the
// runtime has one (a loop otherwise), and the sums and copies as loops.
// bf16 is rounded where the GPU rounds it: a GEMM's operands and results,
// and every store. A launch that a GPU would refuse (DeviceModel.h: an
// H100/H200's limits; $CELLC_EMU_SMS, a GPU of that many SMs) is refused,
// in the driver's words.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_RUNTIME_EMU_EMUDEVICE_H
#define CELLC_RUNTIME_EMU_EMUDEVICE_H

#include "runtime/cuda/Device.h"
#include "runtime/emu/DeviceModel.h"
#include "runtime/emu/Simt.h"

#include <memory>
#include <string>

namespace cellc::emu {

class EmuDevice : public cuda::Device {
public:
  /// Opens the emulated objects of the variant that replays and of the one
  /// that saves gates. Throws EmuError. `shuffleSeed` (nonzero) shuffles
  /// the threads' order between sync points.
  EmuDevice(const std::string &replayObject, const std::string &saveObject,
            uint64_t shuffleSeed);

  bool onHost() const override { return true; }
  cuda::Status begin(void *) override { return cuda::Status(); }
  /// Under the device model (an H100/H200 by default).
  cuda::Status residency(const cuda::LaunchSpec &spec, cuda::Residency &out) override;
  cuda::Status admit(const cuda::LaunchSpec &spec) override;
  cuda::Status launch(const cuda::LaunchSpec &spec) override;
  cuda::Status gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, const void *a,
                    int64_t lda, const void *b, int64_t ldb, cuda::Element ab, double beta,
                    void *c, int64_t ldc, cuda::Element ce, void *workspace,
                    int64_t workspaceBytes) override;
  cuda::Status zero(void *data, int64_t bytes) override;
  cuda::Status copyBytes(const void *from, void *to, int64_t bytes) override;
  cuda::Status convert(const void *from, cuda::Element fromElement, void *to,
                       cuda::Element toElement, int64_t n) override;
  cuda::Status accumulate(const void *from, cuda::Element fromElement, void *to,
                          cuda::Element toElement, int64_t n) override;
  cuda::Status fillRows(void *m, cuda::Element element, int64_t rows, int64_t cols,
                        const std::vector<const float *> &vectors) override;
  cuda::Status columnSums(const void *m, cuda::Element element, int64_t rows, int64_t cols,
                          int64_t parts, int64_t per, float *partials, float *acc) override;

private:
  std::unique_ptr<Module> variants[2];
  uint64_t shuffleSeed;
  DeviceModel model = DeviceModel::h100();
};

} // namespace cellc::emu

#endif // CELLC_RUNTIME_EMU_EMUDEVICE_H
