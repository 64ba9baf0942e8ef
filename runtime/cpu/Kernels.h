//===- Kernels.h - Call a CPU package's kernels, loaded with dlopen -*- C++ -*-===//
//
// Every kernel of a CPU package has one C entry, `cellc_packed_<name>(void
// **args)`, which takes a pointer to each argument (the compiler writes it:
// compiler/Pipelines/HostObject.cpp). Here: opening the shared object, and
// packing the arguments, memref descriptors and indices, for such a call.
//
//===----------------------------------------------------------------------===//

#ifndef CELLC_RUNTIME_CPU_KERNELS_H
#define CELLC_RUNTIME_CPU_KERNELS_H

#include "runtime/driver/SequenceDriver.h"

#include <cstdint>
#include <string>
#include <vector>

namespace cellc::runtime {

/// A kernel's packed entry.
using Entry = void (*)(void **);

/// One argument of a kernel: a contiguous row-major buffer, or an index.
struct KernelArg {
  void *data = nullptr;
  std::vector<int64_t> shape;
  int64_t index = 0;
  bool isIndex = false;

  static KernelArg buffer(void *data, std::vector<int64_t> shape) {
    KernelArg arg;
    arg.data = data;
    arg.shape = std::move(shape);
    return arg;
  }
  static KernelArg indexValue(int64_t value) {
    KernelArg arg;
    arg.index = value;
    arg.isIndex = true;
    return arg;
  }
};

/// A kernel's arguments as its entry takes them: every argument's words in
/// one buffer (an index, or a memref's descriptor: allocated and aligned
/// pointers, offset, sizes, strides) and a pointer to each. Laid out once,
/// a buffer's data or an index can be written again between calls.
class PackedArgs {
public:
  explicit PackedArgs(const std::vector<KernelArg> &args);
  PackedArgs(const PackedArgs &) = delete;
  PackedArgs &operator=(const PackedArgs &) = delete;

  void setData(size_t arg, const void *data) {
    words[first[arg]] = words[first[arg] + 1] = reinterpret_cast<int64_t>(data);
  }
  void setIndex(size_t arg, int64_t value) { words[first[arg]] = value; }
  void call(Entry entry) { entry(pointers.data()); }
  /// A pointer to each word in order: the parameters of a CUDA kernel,
  /// where NVPTX expands each memref descriptor into its words.
  std::vector<void *> eachWord() {
    std::vector<void *> each;
    each.reserve(words.size());
    for (int64_t &word : words)
      each.push_back(&word);
    return each;
  }

private:
  std::vector<int64_t> words;
  std::vector<size_t> first;
  std::vector<void *> descriptors, pointers;
};

/// Calls `entry` with `args` in its argument order: each buffer as a memref
/// descriptor. The caller has checked the shapes against the kernel's
/// interface.
void callPacked(Entry entry, const std::vector<KernelArg> &args);

/// Whether this CPU has the feature `name` (as LLVM and GCC name them:
/// "avx2", "fma", "avx512f", ...); false for a name it cannot check.
bool hostHas(const std::string &name);

/// A shared object of kernels, open for as long as this lives.
class SharedObject {
public:
  SharedObject() = default;
  ~SharedObject();
  SharedObject(const SharedObject &) = delete;
  SharedObject &operator=(const SharedObject &) = delete;

  /// Opens `path` (RTLD_LOCAL: both variants of a package define the same
  /// names). The error names the file and what dlopen said.
  driver::Status open(const std::string &path);
  /// The packed entry of kernel `name`, or null.
  Entry entry(const std::string &name) const;
  /// The address of the symbol `name`, or null.
  void *symbol(const std::string &name) const;

private:
  void *handle = nullptr;
};

} // namespace cellc::runtime

#endif // CELLC_RUNTIME_CPU_KERNELS_H
