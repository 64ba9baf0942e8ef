//===- Package.h - A compiled cell's kernels.json, read without LLVM -*- C++ -*-===//
//
// A package is a directory that the compiler writes (`cellc --emit=package`):
// the kernels of both SAVE_GATES variants (PTX for CUDA, shared objects for
// the CPU) and kernels.json, which names the cell, its sizes and slots, and
// each kernel's arguments. The runtime reads it here into the driver's
// Interface: one reader for every target.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_RUNTIME_DRIVER_PACKAGE_H
#define CELLC_RUNTIME_DRIVER_PACKAGE_H

#include "runtime/driver/SequenceDriver.h"

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cellc::driver {

/// A JSON value: what kernels.json holds, and no more.
struct Json {
  enum class Kind { Null, Bool, Number, String, Array, Object };
  Kind kind = Kind::Null;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<Json> array;
  std::vector<std::pair<std::string, Json>> object;

  /// The member `key` of an object, or null when absent (or not an object).
  const Json *get(std::string_view key) const;
  int64_t integer() const { return static_cast<int64_t>(number); }
};

/// Parses `text`; an error names the byte offset where it went wrong.
Status parseJson(std::string_view text, Json &out);

/// What a package's kernels.json says.
struct PackageInfo {
  std::string directory;
  std::string cell, target, dtype;
  /// The knobs the kernels were built with, `name=value,...` (CPU).
  std::string config;
  std::map<std::string, int64_t> sizes;
  /// The cell's inputs, states, params and outputs with their shapes, in
  /// the kernels' order.
  std::vector<Slot> inputs, states, params, outputs;
  /// The declared dims of each state of several (a matrix state's
  /// `[NH, K, V]`), whose slot is the flat vector; callers pass and get back
  /// such a state in them.
  std::map<std::string, std::vector<int64_t>> stateDims;
  /// The kernels' interface, finished (Interface::finish).
  Interface interface;
  /// The CPU features the kernels use (CPU packages).
  std::vector<std::string> cpuFeatures;
  /// The files of the variant that replays (0) and of the one that saves
  /// gates (1), in `directory`: the CPU's shared objects, or CUDA's PTX.
  std::string objects[2];
  /// CUDA packages: the GPU architecture, the kernels' options, how many
  /// products run on the tensor cores (-1: not said), and the SIMT
  /// emulator's objects of each variant (empty: none).
  std::string arch, precision, strategy, storage;
  int64_t mmaSites = -1;
  std::string simtObjects[2];
};

/// The params the kernels read (the interface's, in their order), picked
/// by name from `given` in the package's slot order: every declared param,
/// a param the cell never reads included, so that a caller passes what the
/// cell declares. A view that is absent or has no elements is not given; a
/// param the kernels read must be (`required`), and is named where it is
/// not. The views given for params the kernels do not read go to `unread`
/// (a caller zeroes the gradients there). `given` as long as the
/// interface's params and not the slots is taken in the interface's order.
Status kernelParams(const PackageInfo &info, const std::vector<View> &given,
                    const std::string &what, bool required, std::vector<View> &out,
                    std::vector<View> *unread = nullptr);  // `out` may be `given`

/// Reads `<dir>/kernels.json`. Errors name the file and what is wrong.
Status readPackage(const std::string &dir, PackageInfo &out);
/// The same from the text of a kernels.json (`dir` only names it).
Status parsePackage(std::string_view text, const std::string &dir, PackageInfo &out);

/// `text` as a JSON string, quoted and escaped; `values` as a JSON list.
std::string jsonQuoted(const std::string &text);
std::string jsonList(const std::vector<int64_t> &values);

/// The package as JSON text (Describe.cpp): cell, target, dtype, arch,
/// precision, strategy, storage, mma_sites, sizes, slots, state_dims, the
/// objects of both variants and each kernel's launch and arguments.
std::string describePackage(const PackageInfo &package);

} // namespace cellc::driver

#endif // CELLC_RUNTIME_DRIVER_PACKAGE_H
