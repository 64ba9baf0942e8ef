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

#include <map>
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
                    void *c, int64_t ldc, cuda::Element ce, bool tf32, void *workspace,
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
  cuda::Status transpose(const void *from, void *to, int64_t rows, int64_t cols,
                         cuda::Element element) override;
  cuda::Status upload(const void *host, void *to, int64_t bytes) override;
  cuda::Status maskPastLengths(void *v, cuda::Element e, int64_t len, int64_t B, int64_t n,
                               const int32_t *lengths, int64_t first) override;
  cuda::Status gatherAtLengths(const void *from, cuda::Element fromElement, int64_t len,
                               int64_t B, int64_t n, int64_t t0, const int32_t *lengths,
                               void *to, cuda::Element toElement) override;
  cuda::Status addAtLengths(const float *from, int64_t B, int64_t n, const int32_t *lengths,
                            int64_t step, float *to) override;
  /// Every call since the last reset, by kind: what a GPU's API would be
  /// asked (the cell's launches, the GEMMs, the runtime's own kernels, the
  /// copies and memsets).
  std::vector<std::pair<std::string, int64_t>> calls(bool reset) override;

private:
  std::unique_ptr<Module> variants[2];
  uint64_t shuffleSeed;
  DeviceModel model = DeviceModel::h100();
  std::map<std::string, int64_t> counts;
  void count(const char *what) { ++counts[what]; }
};

} // namespace cellc::emu

#endif // CELLC_RUNTIME_EMU_EMUDEVICE_H
