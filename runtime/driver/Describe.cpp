//===- Describe.cpp - A package as JSON text, for the C interfaces ------===//
//
// What cellc_cuda_package_describe and cellc_cpu_describe return: the
// package's kernels.json as the runtime read it, for Python (cellc.cuda and
// cellc._cellc_runtime) to take apart with its json module.
//
//===----------------------------------------------------------------------===//

#include "runtime/driver/Package.h"

#include <cstdio>
#include <sstream>

namespace cellc::driver {

/// JSON text: strings escaped, the rest as written.
std::string jsonQuoted(const std::string &text) {
  std::string out = "\"";
  for (char ch : text) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (static_cast<unsigned char>(ch) < 0x20) {
      char code[8];
      std::snprintf(code, sizeof code, "\\u%04x", ch);
      out += code;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string jsonList(const std::vector<int64_t> &values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i)
    out += (i ? ", " : "") + std::to_string(values[i]);
  return out + "]";
}

namespace {

std::string slotsOf(const std::vector<Slot> &slots) {
  std::string out = "[";
  for (size_t i = 0; i < slots.size(); ++i)
    out += (i ? ", [" : "[") + jsonQuoted(slots[i].name) + ", " + jsonList(slots[i].shape) + "]";
  return out + "]";
}

std::string kernelOf(const Kernel &k) {
  std::ostringstream out;
  out << "{\"batch_tile\": " << k.batchTile << ", \"threads\": " << k.threads
      << ", \"workspace_bytes\": " << k.workspaceBytes
      << ", \"dynamic_shared_bytes\": " << k.dynamicSharedBytes;
  if (k.strategy)
    out << ", \"strategy\": " << jsonQuoted(name(*k.strategy));
  if (k.ctas)
    out << ", \"ctas\": " << k.ctas << ", \"barrier_words\": " << k.barrierWords;
  if (k.heads)
    out << ", \"heads\": " << k.heads;
  if (k.globalWeights)
    out << ", \"global_weights\": " << k.globalWeights;
  if (k.registers[0] >= 0 || k.registers[1] >= 0)
    out << ", \"registers\": {\"replay\": " << k.registers[0]
        << ", \"save\": " << k.registers[1] << "}";
  out << ", \"args\": [";
  for (size_t i = 0; i < k.args.size(); ++i) {
    const KernelArg &a = k.args[i];
    out << (i ? ", " : "") << "{\"kind\": " << jsonQuoted(name(a.kind))
        << ", \"name\": " << jsonQuoted(a.name) << ", \"memref\": " << (a.element ? "true" : "false");
    if (!a.input.empty())
      out << ", \"input\": " << jsonQuoted(a.input);
    if (!a.biases.empty()) {
      out << ", \"biases\": [";
      for (size_t b = 0; b < a.biases.size(); ++b)
        out << (b ? ", " : "") << jsonQuoted(a.biases[b]);
      out << "]";
    }
    if (a.element)
      out << ", \"element\": " << jsonQuoted(elementName(*a.element))
          << ", \"shape\": " << jsonList(a.shape);
    out << "}";
  }
  out << "]}";
  return out.str();
}

} // namespace

std::string describePackage(const PackageInfo &p) {
  std::ostringstream out;
  out << "{\"directory\": " << jsonQuoted(p.directory) << ", \"cell\": " << jsonQuoted(p.cell)
      << ", \"target\": " << jsonQuoted(p.target) << ", \"dtype\": " << jsonQuoted(p.dtype)
      << ", \"arch\": " << jsonQuoted(p.arch) << ", \"precision\": " << jsonQuoted(p.precision)
      << ", \"strategy\": " << jsonQuoted(p.strategy) << ", \"storage\": " << jsonQuoted(p.storage);
  if (p.mmaSites >= 0)
    out << ", \"mma_sites\": " << p.mmaSites;
  out << ", \"sizes\": {";
  size_t i = 0;
  for (const auto &[name, value] : p.sizes)
    out << (i++ ? ", " : "") << jsonQuoted(name) << ": " << value;
  out << "}, \"slots\": {\"inputs\": " << slotsOf(p.inputs)
      << ", \"states\": " << slotsOf(p.states) << ", \"params\": " << slotsOf(p.params)
      << ", \"outputs\": " << slotsOf(p.outputs) << "}, \"state_dims\": {";
  i = 0;
  for (const auto &[name, dims] : p.stateDims)
    out << (i++ ? ", " : "") << jsonQuoted(name) << ": " << jsonList(dims);
  out << "}, \"ptx\": {\"replay\": " << jsonQuoted(p.objects[0])
      << ", \"save\": " << jsonQuoted(p.objects[1]) << "}";
  if (!p.simtObjects[0].empty())
    out << ", \"simt\": {\"replay\": " << jsonQuoted(p.simtObjects[0])
        << ", \"save\": " << jsonQuoted(p.simtObjects[1]) << "}";
  out << ", \"kernels\": {" << jsonQuoted(p.cell + "_fwd") << ": "
      << kernelOf(p.interface.forward) << ", " << jsonQuoted(p.cell + "_bwd") << ": "
      << kernelOf(p.interface.backward) << "}}";
  return out.str();
}


} // namespace cellc::driver
