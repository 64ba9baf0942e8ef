//===- CudaCell.h - A CUDA package, run through the sequence driver -*- C++ -*-===//
//
// A CUDA package (`cellc --emit=package --target=cuda`) loaded on a GPU, or
// in the SIMT emulator, and run by the sequence driver over the CUDA
// backend: one call per forward and one per backward, each in one
// workspace that the caller gives. A call is planned dry first; where the
// workspace given is smaller than it needs, nothing runs and the call says
// how much it needs (the Python layer then allocates that and calls again).
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_RUNTIME_CUDA_CUDACELL_H
#define CELLC_RUNTIME_CUDA_CUDACELL_H

#include "runtime/cuda/CudaBackend.h"
#include "runtime/driver/Package.h"

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace cellc::cuda {

class CudaCell {
public:
  /// The device that runs the kernels in the SIMT emulator.
  static constexpr int kEmulator = -1;
  /// The most pieces a full call's sequence is cut into.
  static constexpr int64_t kMaxPieces = 8;

  /// Loads `package`'s kernels on GPU `device` (its PTX), or in the
  /// emulator (its SIMT objects; `shuffleSeed` nonzero shuffles the
  /// threads' order between sync points).
  static Status open(const driver::PackageInfo &package, int device, uint64_t shuffleSeed,
                     std::unique_ptr<CudaCell> &out);

  const driver::PackageInfo &package() const { return info; }
  bool emulated() const { return device->onHost(); }

  /// One call's arguments (views with data pointers on the device, or on
  /// the host for the emulator) and its workspace.
  struct Call {
    driver::Recompute mode;
    driver::Sequence seq;
    std::vector<driver::View> outputs, finals;
    /// A training forward keeps into these (keptLayout); its backward reads
    /// them and the outputs that keptOutputs names.
    std::vector<driver::View> kept;
    bool training = false;
    std::vector<driver::View> gradOutputs, gradFinals, gradInputs, gradParams, gradInitial;
    void *workspace = nullptr;
    int64_t workspaceBytes = 0;
    void *stream = nullptr;
    /// Set by the call: the workspace it needs; the gradients given for
    /// params the kernels do not read (zeroed).
    int64_t needed = 0;
    std::vector<driver::View> unreadGrads;
  };
  /// Runs a forward (or its backward). Where `call.workspaceBytes` is
  /// below what the call needs, nothing runs and `tooSmall` is set.
  Status forward(Call &call, bool &tooSmall);
  Status backward(Call &call, bool &tooSmall);

  /// What a training forward in `mode` keeps (the caller allocates it), and
  /// the outputs it keeps as states' histories.
  std::vector<driver::KeptBuffer> keptLayout(driver::Recompute mode, bool hasLengths) const;
  std::vector<int64_t> keptOutputs(driver::Recompute mode, bool hasLengths) const;

  /// What a training step of `steps` x `batch` holds on the device: the
  /// caller's buffers, what forward keeps, and each call's workspace.
  Status plan(int64_t steps, int64_t batch, driver::Recompute mode, driver::MemoryPlan &out);

  /// Rows per piece on the device: the whole sequence in none and chunk:K
  /// (where a chunk bounds the pieces), and in full the longest span whose
  /// projections take no more than what full keeps of the sequence, but at
  /// least kPieceRows rows and a kMaxPieces-th of the sequence.
  int64_t pieceRows(driver::Recompute mode, int64_t steps, int64_t batch,
                    bool hasLengths) const;

  /// Launches a kernel of the package on `args` alone, outside the driver
  /// (tests of the emulator's checks): a stream's launch, nothing placed.
  Status launch(bool backward, bool saveGates, const std::vector<driver::Arg> &args,
                int64_t batch, void *stream);
  /// The launch a call makes of the forward (or backward) kernel over
  /// `batch` rows, and what the device keeps resident of it; an error where
  /// the device would refuse it. Nothing runs.
  Status admitLaunch(bool backward, bool saveGates, int64_t batch, LaunchSpec &spec,
                     Residency &fits);
  /// What the device was asked since the last reset (Device::calls).
  std::vector<std::pair<std::string, int64_t>> deviceCalls(bool reset);
  /// Registers per thread of `kernel` in a variant (GPU only).
  Status registers(const std::string &kernel, bool saveGates, int &out);

  /// The driver's figures for the last calls, and the workspace each used.
  driver::MemoryStats stats() const;
  int64_t workspaceUsed(bool backward) const;

private:
  CudaCell() = default;
  /// Runs `body` dry (once per kind of call: `layouts`), then where the
  /// workspace suffices for real.
  template <typename F> Status twice(Call &call, bool backward, bool &tooSmall, F &&body);
  /// What makes two calls place the same buffers in the same order.
  static std::string layoutKey(const Call &call, bool backward);
  /// The workspace each kind of call needs, from its dry run.
  std::map<std::string, int64_t> layouts;
  static constexpr size_t kLayouts = 256;
  /// The element types of the call's tensors, against the cell's.
  Status checkElements(const Call &call, bool backward) const;

  mutable std::mutex lock;
  driver::PackageInfo info;
  std::shared_ptr<Device> device;
  std::shared_ptr<CudaBackend> backend;
  std::unique_ptr<driver::SequenceDriver> driver;
  int64_t lastWorkspace[2] = {0, 0};
};

} // namespace cellc::cuda

#endif // CELLC_RUNTIME_CUDA_CUDACELL_H
