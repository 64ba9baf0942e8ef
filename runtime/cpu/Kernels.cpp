//===- Kernels.cpp - Call a CPU package's kernels, loaded with dlopen -----===//

#include "runtime/cpu/Kernels.h"

#include <dlfcn.h>

using namespace cellc;
using namespace cellc::runtime;

void cellc::runtime::callPacked(Entry entry, const std::vector<KernelArg> &args) {
  // Every argument's words in one buffer, sized first so that pointers into
  // it stay valid: an index, or a memref's descriptor (allocated and aligned
  // pointers, offset, sizes, strides). A step of a small batch launches
  // kernels of microseconds, where a vector per argument showed.
  size_t words = 0;
  for (const KernelArg &arg : args)
    words += arg.isIndex ? 1 : 3 + 2 * arg.shape.size();
  std::vector<int64_t> descriptors(words);
  std::vector<void *> descriptorPointers(args.size());
  std::vector<void *> pointers(args.size());
  int64_t *desc = descriptors.data();
  for (size_t i = 0; i < args.size(); ++i) {
    const KernelArg &arg = args[i];
    if (arg.isIndex) {
      desc[0] = arg.index;
      pointers[i] = desc++;
      continue;
    }
    size_t rank = arg.shape.size();
    desc[0] = desc[1] = reinterpret_cast<int64_t>(arg.data);
    desc[2] = 0;
    int64_t stride = 1;
    for (size_t d = rank; d-- > 0;) {
      desc[3 + d] = arg.shape[d];
      desc[3 + rank + d] = stride;
      stride *= arg.shape[d];
    }
    // A memref is passed as a pointer to its descriptor.
    descriptorPointers[i] = desc;
    pointers[i] = &descriptorPointers[i];
    desc += 3 + 2 * rank;
  }
  entry(pointers.data());
}

bool cellc::runtime::hostHas(const std::string &name) {
  __builtin_cpu_init();
#if defined(__x86_64__) || defined(__i386__)
#define CELLC_CPU_FEATURE(text)                                                \
  if (name == text)                                                            \
    return __builtin_cpu_supports(text);
#include "dialects/Cell/IR/KernelInterface.def"
#endif
  return false;
}

SharedObject::~SharedObject() {
  if (handle)
    dlclose(handle);
}

driver::Status SharedObject::open(const std::string &path) {
  handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char *why = dlerror();
    return driver::Status::error("cannot load the kernels " + path + ": " +
                                 (why ? why : "unknown error"));
  }
  return driver::Status();
}

void *SharedObject::symbol(const std::string &name) const {
  return handle ? dlsym(handle, name.c_str()) : nullptr;
}

Entry SharedObject::entry(const std::string &name) const {
  return handle ? reinterpret_cast<Entry>(dlsym(handle, ("cellc_packed_" + name).c_str()))
                : nullptr;
}
