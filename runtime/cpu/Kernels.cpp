//===- Kernels.cpp - Call a CPU package's kernels, loaded with dlopen -----===//

#include "runtime/cpu/Kernels.h"

#include <dlfcn.h>

using namespace cellc;
using namespace cellc::runtime;

void cellc::runtime::callPacked(Entry entry, const std::vector<KernelArg> &args) {
  std::vector<std::vector<int64_t>> descriptors(args.size());
  std::vector<void *> descriptorPointers(args.size());
  std::vector<void *> pointers(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    const KernelArg &arg = args[i];
    std::vector<int64_t> &desc = descriptors[i];
    if (arg.isIndex) {
      desc.push_back(arg.index);
      pointers[i] = desc.data();
      continue;
    }
    desc.push_back(reinterpret_cast<int64_t>(arg.data));
    desc.push_back(reinterpret_cast<int64_t>(arg.data));
    desc.push_back(0);
    desc.insert(desc.end(), arg.shape.begin(), arg.shape.end());
    std::vector<int64_t> strides(arg.shape.size());
    int64_t stride = 1;
    for (size_t d = arg.shape.size(); d-- > 0;) {
      strides[d] = stride;
      stride *= arg.shape[d];
    }
    desc.insert(desc.end(), strides.begin(), strides.end());
    // A memref is passed as a pointer to its descriptor.
    descriptorPointers[i] = desc.data();
    pointers[i] = &descriptorPointers[i];
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
