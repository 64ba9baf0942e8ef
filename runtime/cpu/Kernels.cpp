//===- Kernels.cpp - Call a CPU package's kernels, loaded with dlopen -----===//

#include "runtime/cpu/Kernels.h"

#include <dlfcn.h>

using namespace cellc;
using namespace cellc::runtime;

PackedArgs::PackedArgs(const std::vector<KernelArg> &args)
    : first(args.size()), descriptors(args.size()), pointers(args.size()) {
  // Sized first, so that pointers into the words stay valid. A step of a
  // small batch launches kernels of microseconds, where a vector per
  // argument showed.
  size_t count = 0;
  for (const KernelArg &arg : args)
    count += arg.isIndex ? 1 : 3 + 2 * arg.shape.size();
  words.resize(count);
  size_t at = 0;
  for (size_t i = 0; i < args.size(); ++i) {
    const KernelArg &arg = args[i];
    first[i] = at;
    int64_t *desc = words.data() + at;
    if (arg.isIndex) {
      desc[0] = arg.index;
      pointers[i] = desc;
      ++at;
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
    descriptors[i] = desc;
    pointers[i] = &descriptors[i];
    at += 3 + 2 * rank;
  }
}

void cellc::runtime::callPacked(Entry entry, const std::vector<KernelArg> &args) {
  PackedArgs(args).call(entry);
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
