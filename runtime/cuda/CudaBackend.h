//===- CudaBackend.h - The sequence driver's CUDA backend -------*- C++ -*-===//
//
// The driver's Backend for CUDA packages, in C++: a call's buffers placed in
// one workspace that the caller gives (from Python, one torch allocation, so
// that torch's allocator counts it), the cell's kernels launched with their
// grids and memref descriptors, and the GEMMs, sums and copies handed to a
// Device (a GPU, or the SIMT emulator). Nothing calls back into Python.
//
// A call runs twice on the host: first dry (buffers placed, nothing run),
// which measures the workspace the call needs, then for real in a workspace
// at least that large. The driver makes the same requests in the same order
// both times, so every buffer lands where the dry run put it.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_RUNTIME_CUDA_CUDABACKEND_H
#define CELLC_RUNTIME_CUDA_CUDABACKEND_H

#include "runtime/cuda/Device.h"

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace cellc::cuda {

/// Places buffers in a workspace: first fit over the free ranges, then the
/// top; aligned to kAlignment. The same requests in the same order land in
/// the same places, whatever the workspace's address.
class Arena {
public:
  static constexpr int64_t kAlignment = 256;

  /// Starts over in `capacity` bytes (-1: as many as the requests take).
  void reset(int64_t capacity);
  /// The offset of `bytes` placed, or -1 where they do not fit.
  int64_t allocate(int64_t bytes);
  void release(int64_t offset);
  /// The most bytes in use at once (the top's highest point) since `reset`.
  int64_t high() const { return highWater; }
  /// The buffers in use now.
  size_t live() const { return used.size(); }

private:
  int64_t capacity = -1, top = 0, highWater = 0;
  std::map<int64_t, int64_t> free, used;
};

/// How a call's GEMMs run: the bytes of its workspace that the GEMM
/// library gets (cuBLAS's workspace, set for each call, so that it
/// allocates none of its own and a call can be captured in a CUDA graph),
/// and whether f32 products run in TF32 (a tf32 package's).
struct GemmSetup {
  static constexpr int64_t kWorkspaceBytes = int64_t(4) << 20;
  int64_t workspaceBytes = kWorkspaceBytes;
  bool tf32 = false;
};

/// The sequence driver's backend over a Device.
class CudaBackend : public driver::Backend {
public:
  using Gemms = GemmSetup;
  /// cuBLAS's guidance: 32 MiB on Hopper (sm_90) and later, 4 MiB before.
  static constexpr int64_t kGemmWorkspaceBytes = GemmSetup::kWorkspaceBytes;
  static constexpr int64_t kHopperGemmWorkspaceBytes = int64_t(32) << 20;
  /// The GEMMs of a package for `arch` ("sm_90") at `precision` ("tf32").
  static Gemms gemmsFor(const std::string &arch, const std::string &precision);

  /// Runs the kernels of `cell` (named `<name>_fwd` and `_bwd`, with the
  /// launch facts in its Kernels) on `device`.
  CudaBackend(std::shared_ptr<Device> device, std::string name, const driver::Interface &cell,
              Gemms gemms = Gemms());
  /// Rows per part of the first pass of column sums (at most kMaxParts).
  static constexpr int64_t kRowsPerPart = 2048, kMaxParts = 64;

  /// Starts a dry call: buffers are placed in a workspace without bounds,
  /// and nothing runs.
  void beginDry();
  /// Starts a call in `workspace` (`bytes`; a device pointer, or host
  /// memory for the emulator) on `stream`.
  Status beginCall(void *workspace, int64_t bytes, void *stream);
  /// Ends a call: an error if a buffer is still placed (the caller's
  /// workspace is free for others once the call returns).
  Status endCall();
  /// The most workspace the call has used.
  int64_t used() const { return arena.high(); }

  Status allocate(int64_t elements, Element element, bool zero,
                  driver::Buffer &out) override;
  void release(const driver::Buffer &buffer) override;
  Status launch(bool backward, bool saveGates, const std::vector<driver::Arg> &args,
                int64_t batch) override;
  /// A persistent grid's rows: as many tiles as the device keeps resident.
  int64_t tilesAtOnce(bool backward, bool saveGates, int64_t batch, int64_t tiles) override;
  /// The launch of the forward (or backward) kernel over `batch` rows, as
  /// `launch` makes it: its grid (the tiles, or for a cooperative grid as
  /// many tiles at a time as the device keeps resident), block and shared
  /// memory, without arguments; and whether the device admits it. Nothing
  /// runs.
  Status admitLaunch(bool backward, bool saveGates, int64_t batch, LaunchSpec &spec);
  Status gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k,
              const driver::View &a, int64_t lda, const driver::View &b, int64_t ldb,
              double beta, const driver::View &c, int64_t ldc) override;
  Status columnSums(const driver::View &m, int64_t rows, int64_t cols,
                    const driver::View &acc) override;
  Status fillRows(const driver::View &m, int64_t rows, int64_t cols,
                  const std::vector<driver::View> &vectors) override;
  Status copy(const driver::View &from, const driver::View &to) override;
  Status add(const driver::View &from, const driver::View &to) override;
  Status upload(const void *host, int64_t bytes, const driver::View &to) override;
  Status transpose(const driver::View &from, const driver::View &to) override;
  Status maskPastLengths(const driver::View &v, const driver::View &lengths,
                         int64_t first) override;
  Status gatherAtLengths(const driver::View &from, int64_t t0, const driver::View &lengths,
                         const driver::View &to) override;
  Status addAtLengths(const driver::View &from, const driver::View &lengths, int64_t step,
                      const driver::View &to) override;

private:
  /// A launch's grid and sizes (`admitLaunch`).
  Status plan(bool backward, bool saveGates, int64_t batch, LaunchSpec &spec);
  /// A buffer of `bytes` in the workspace, for the backend's own use.
  Status place(int64_t bytes, void *&data, int64_t &offset);

  std::shared_ptr<Device> dev;
  /// The forward and backward kernels' names.
  std::string names[2];
  const driver::Interface &cell;
  Arena arena;
  char *base = nullptr;
  bool dry = false, inCall = false;
  /// Whether the call made the device current (`Device::begin`).
  bool onDevice = false;
  Gemms gemms;
  /// The GEMM library's workspace, placed at the call's first GEMM (-1:
  /// none yet).
  int64_t gemmWorkspace = -1;
  /// A GEMM operand converted to the other's type (a param, f32, as bf16
  /// next to bf16 sequences), kept for the call: each weight is converted
  /// once a call, not once a GEMM. By (data, element, span).
  std::map<std::tuple<const void *, int, int64_t>, int64_t> converted;
};

} // namespace cellc::cuda

#endif // CELLC_RUNTIME_CUDA_CUDABACKEND_H
