//===- Package.cpp - AOT packages of a cell's kernels, CUDA and CPU -------===//
//
// A package is a directory with the kernels of both SAVE_GATES variants (PTX
// for CUDA, shared objects for the CPU) and kernels.json: the cell, sizes,
// slots, options and each kernel's arguments (and launch shape, or scratch).
// The runtime (runtime/driver/Package.cpp reads kernels.json; runtime/cpu,
// runtime/cuda and python/cellc/cuda.py run the kernels) needs neither MLIR
// nor LLVM.
//
//===----------------------------------------------------------------------===//

#include "compiler/Pipelines/Pipelines.h"

#include "compiler/Conversion/Passes.h"
#include "compiler/Conversion/Common/KernelABI.h"
#include "dialects/Cell/IR/CellOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/NVVMDialect.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

using namespace cellc;

static llvm::Error fail(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
}

namespace {

/// What every package says of its cell: the format, its name, dtype and
/// sizes, and its inputs, params, states and outputs with their shapes, in
/// the kernels' order (what a runtime binds tensors to).
llvm::json::Object describeCell(mlir::cell::DefOp def, llvm::StringRef target,
                                llvm::StringRef dtype) {
  llvm::json::Object meta;
  meta["format"] = 2;
  meta["target"] = target.str();
  meta["cell"] = def.getSymName().str();
  meta["dtype"] = dtype.str();
  llvm::json::Object sizeObj;
  if (auto sizes = def->getAttrOfType<mlir::DictionaryAttr>("sizes"))
    for (auto entry : sizes)
      sizeObj[entry.getName().str()] =
          llvm::cast<mlir::IntegerAttr>(entry.getValue()).getInt();
  meta["sizes"] = std::move(sizeObj);
  auto shapeOf = [](mlir::Type type) {
    llvm::json::Array shape;
    for (int64_t d : llvm::cast<mlir::RankedTensorType>(type).getShape())
      shape.push_back(d);
    return shape;
  };
  llvm::json::Object slots;
  auto named = [&](mlir::ArrayAttr names, mlir::TypeRange types) {
    llvm::json::Array list;
    for (auto [n, t] : llvm::zip(names.getAsValueRange<mlir::StringAttr>(), types))
      list.push_back(llvm::json::Array{n.str(), shapeOf(t)});
    return list;
  };
  slots["inputs"] = named(def.getInputNamesAttr(), mlir::ValueRange(def.getInputs()).getTypes());
  slots["states"] = named(def.getStateNamesAttr(), mlir::ValueRange(def.getStates()).getTypes());
  slots["outputs"] = named(def.getOutputNamesAttr(), def.getYield().getOutputs().getTypes());
  llvm::json::Array params;
  for (auto param : def.getBody().getOps<mlir::cell::ParamOp>())
    params.push_back(llvm::json::Array{param.getName().str(), shapeOf(param.getType())});
  slots["params"] = std::move(params);
  meta["slots"] = std::move(slots);
  // A matrix state's declared dims ([NH, K, V]); its slot is the flat vector.
  if (auto dims = def->getAttrOfType<mlir::DictionaryAttr>("state_dims")) {
    llvm::json::Object stateDims;
    for (auto entry : dims) {
      llvm::json::Array shape;
      for (int64_t d : llvm::cast<mlir::DenseI64ArrayAttr>(entry.getValue()).asArrayRef())
        shape.push_back(d);
      stateDims[entry.getName().str()] = std::move(shape);
    }
    meta["state_dims"] = std::move(stateDims);
  }
  return meta;
}

/// A kernel's arguments as kernels.json lists them (runtime/driver/Package.cpp
/// reads them back), from its `cell.kernel_args` and argument types.
llvm::json::Array argsOf(mlir::Operation *kernel, mlir::TypeRange types) {
  llvm::json::Array args;
  for (auto [arg, type] : llvm::zip(mlir::cell::kernelArgsOf(kernel), types)) {
    // The words come from KernelInterface.def, through name().
    llvm::json::Object a;
    a["kind"] = name(arg.getKind());
    a["name"] = arg.getName().str();
    if (!arg.getInput().empty())
      a["input"] = arg.getInput().str();
    if (arg.getKind() == ArgKind::Projection) {
      llvm::json::Array biases;
      for (mlir::StringAttr b : arg.getBiases())
        biases.push_back(b.str());
      a["biases"] = std::move(biases);
    }
    if (arg.getSameAs() >= 0)
      a["same_as"] = arg.getSameAs();
    if (arg.getZero())
      a["zero"] = true;
    llvm::json::Array shape;
    if (auto memref = llvm::dyn_cast<mlir::MemRefType>(type)) {
      for (int64_t d : memref.getShape())
        shape.push_back(mlir::ShapedType::isDynamic(d) ? -1 : d);
      std::string element;
      llvm::raw_string_ostream os(element);
      os << memref.getElementType();
      a["element"] = element;
    }
    a["shape"] = std::move(shape);
    a["memref"] = llvm::isa<mlir::MemRefType>(type);
    args.push_back(std::move(a));
  }
  return args;
}

/// The bytes a CPU kernel allocates for itself as it runs (memref.alloc: a
/// tile's buffers and packed weights), which the driver counts per instance.
int64_t scratchBytesOf(mlir::func::FuncOp func) {
  int64_t bytes = 0;
  func.walk([&](mlir::memref::AllocOp alloc) {
    mlir::MemRefType type = alloc.getType();
    if (type.hasStaticShape())
      bytes += type.getNumElements() * type.getElementTypeBitWidth() / 8;
  });
  return bytes;
}

/// The kernels of one SAVE_GATES variant of `cell`, built with `options`.
llvm::Expected<mlir::OwningOpRef<mlir::ModuleOp>>
buildVariant(mlir::ModuleOp cell, PipelineOptions options, bool saveGates,
             llvm::StringRef target) {
  mlir::OwningOpRef<mlir::ModuleOp> module = cell.clone();
  options.saveGates = saveGates;
  mlir::PassManager pm(cell.getContext());
  buildPipeline(pm, Stage::Kernels, options);
  if (mlir::failed(pm.run(*module)))
    return fail("cellc: building the " + target + " kernels failed");
  return module;
}

llvm::Error writeJson(llvm::StringRef dir, llvm::json::Object meta) {
  std::error_code ec;
  llvm::raw_fd_ostream out((dir + "/kernels.json").str(), ec);
  if (ec)
    return fail("cellc: error: cannot write kernels.json: " + ec.message());
  out << llvm::formatv("{0:2}", llvm::json::Value(std::move(meta))) << "\n";
  return llvm::Error::success();
}

} // namespace

llvm::Error cellc::writePackage(mlir::ModuleOp cell, llvm::StringRef dir,
                                const PipelineOptions &cuda, llvm::StringRef arch,
                                llvm::StringRef dtype, bool simt,
                                llvm::StringRef simtMutation) {
  mlir::MLIRContext &context = *cell.getContext();
  if (std::error_code ec = llvm::sys::fs::create_directories(dir))
    return fail("cellc: error: cannot create '" + dir + "': " + ec.message());
  auto def = *cell.getOps<mlir::cell::DefOp>().begin();
  llvm::json::Object meta = describeCell(def, "cuda", dtype);
  meta["arch"] = arch.str();
  meta["precision"] = name(cuda.precision);
  meta["strategy"] = name(cuda.strategy);
  meta["storage"] = name(cuda.storage);
  llvm::json::Object variants, simtObjects, kernels;
  /// ptxas's registers of each kernel, by variant.
  std::map<std::string, llvm::json::Object> registers;
  for (bool saveGates : {true, false}) {
    auto built = buildVariant(cell, cuda, saveGates, "CUDA");
    if (!built)
      return built.takeError();
    mlir::OwningOpRef<mlir::ModuleOp> module = std::move(*built);
    module->walk([&](mlir::gpu::GPUFuncOp func) {
      llvm::json::Object k;
      k["batch_tile"] = func->getAttrOfType<mlir::IntegerAttr>("cell.batch_tile").getInt();
      k["threads"] = func->getAttrOfType<mlir::IntegerAttr>("cell.threads").getInt();
      k["workgroup_bytes"] =
          func->getAttrOfType<mlir::IntegerAttr>("cell.workgroup_bytes").getInt();
      k["strategy"] = func->getAttrOfType<mlir::StringAttr>("cell.strategy").str();
      if (auto n = func->getAttrOfType<mlir::IntegerAttr>("cell.ctas"))
        k["ctas"] = n.getInt();
      if (auto n = func->getAttrOfType<mlir::IntegerAttr>("cell.heads"))
        k["heads"] = n.getInt();
      if (auto n = func->getAttrOfType<mlir::IntegerAttr>("cell.workspace_bytes"))
        k["workspace_bytes"] = n.getInt();
      if (auto n = func->getAttrOfType<mlir::IntegerAttr>("cell.barrier_words"))
        k["barrier_words"] = n.getInt();
      if (auto n = func->getAttrOfType<mlir::IntegerAttr>("cell.global_weights"))
        k["global_weights"] = n.getInt();
      if (auto n = func->getAttrOfType<mlir::IntegerAttr>("cell.dynamic_shared_bytes"))
        k["dynamic_shared_bytes"] = n.getInt();
      k["args"] = argsOf(func, func.getArgumentTypes());
      kernels[func.getName().str()] = std::move(k);
    });
    // The kernels are built and specialized; the NVVM lowering is left.
    mlir::PassManager nvvm(&context);
    nvvm.addPass(mlir::cell::createConvertKernelsToNVVM());
    if (mlir::failed(nvvm.run(*module)))
      return fail("cellc: lowering the CUDA kernels to NVVM failed");
    // What runs on the tensor cores: a product whose depth the mma shape
    // does not divide falls back to FMAs, and a reader should know it.
    int64_t mmas = 0;
    module->walk([&](mlir::Operation *op) {
      auto inlineAsm = llvm::dyn_cast<mlir::LLVM::InlineAsmOp>(op);
      mmas += llvm::isa<mlir::NVVM::MmaOp>(op) ||
              (inlineAsm && inlineAsm.getAsmString().starts_with("mma.sync"));
    });
    if (saveGates)
      meta["mma_sites"] = mmas;
    if (saveGates && mmas == 0 && cuda.precision != Precision::Ieee)
      mlir::emitWarning(def.getLoc())
          << "precision " << name(cuda.precision)
          << " runs no product on the tensor cores at these sizes (16 rows a tile and a "
             "depth that "
          << (cuda.precision == Precision::Tf32 ? 8 : 16)
          << " divides); the products run on fp32 FMAs";
    // The emulator's object first: serializing to PTX replaces the
    // gpu.module with its binary.
    if (simt) {
      std::string object = saveGates ? "save.simt.so" : "replay.simt.so";
      if (llvm::Error e =
              writeSimtSharedObject(*module, (dir + "/" + object).str(), simtMutation))
        return e;
      simtObjects[saveGates ? "save" : "replay"] = object;
    }
    auto ptx = serializeToPTX(*module, arch);
    if (!ptx)
      return ptx.takeError();
    // Registers bound what a cooperative grid keeps resident: a persistent
    // package records ptxas's figure, where ptxas is, for the emulator's
    // device model (a GPU's driver knows its own).
    // A ptxas that cannot assemble it (another toolkit's, older than the
    // arch) leaves the figure unknown; the driver's JIT reads the PTX.
    if (cuda.strategy == KernelStrategy::Persistent) {
      auto report = ptxasReport(*ptx, arch);
      if (!report)
        mlir::emitWarning(def.getLoc())
            << "ptxas did not assemble the kernels, so the package records no "
               "registers for the emulator's device model: "
            << llvm::toString(report.takeError());
      else if (*report)
        for (auto &[kernel, figures] : **report)
          registers[kernel][saveGates ? "save" : "replay"] = figures.registers;
    }
    std::string name = saveGates ? "save.ptx" : "replay.ptx";
    std::error_code ec;
    llvm::raw_fd_ostream out((dir + "/" + name).str(), ec);
    if (ec)
      return fail("cellc: error: cannot write " + name + ": " + ec.message());
    out << *ptx;
    variants[saveGates ? "save" : "replay"] = name;
  }
  meta["ptx"] = std::move(variants);
  if (simt)
    meta["simt"] = std::move(simtObjects);
  for (auto &[kernel, figures] : registers)
    if (llvm::json::Object *k = kernels.getObject(kernel))
      (*k)["registers"] = std::move(figures);
  meta["kernels"] = std::move(kernels);
  return writeJson(dir, std::move(meta));
}

llvm::Expected<CpuPackage> cellc::buildCpuPackage(mlir::ModuleOp cell,
                                                  const PipelineOptions &cpu,
                                                  llvm::StringRef dtype,
                                                  llvm::StringRef config, bool lower) {
  mlir::MLIRContext &context = *cell.getContext();
  auto def = *cell.getOps<mlir::cell::DefOp>().begin();
  CpuPackage package;
  package.meta = describeCell(def, "cpu", dtype);
  package.meta["strategy"] = name(cpu.strategy);
  if (!config.empty())
    package.meta["config"] = config.str();
  package.meta["objects"] = llvm::json::Object{{"save", "save.so"}, {"replay", "replay.so"}};
  // The code is for this CPU: a runtime on one without these refuses it.
  llvm::json::Array features;
  for (const std::string &f : hostVectorFeatures())
    features.push_back(f);
  package.meta["cpu_features"] = std::move(features);
  std::string names[2] = {(def.getSymName() + "_fwd").str(), (def.getSymName() + "_bwd").str()};
  llvm::json::Object kernels[2];
  for (bool saveGates : {true, false}) {
    auto built = buildVariant(cell, cpu, saveGates, "CPU");
    if (!built)
      return built.takeError();
    mlir::OwningOpRef<mlir::ModuleOp> module = std::move(*built);
    for (int k : {0, 1}) {
      auto func = module->lookupSymbol<mlir::func::FuncOp>(names[k]);
      if (!func)
        return fail("internal error: no kernel @" + names[k]);
      // The arguments are the same in both variants; the scratch is not.
      if (saveGates) {
        kernels[k]["args"] = argsOf(func, func.getArgumentTypes());
        for (const char *attr :
             {"batch_tile", "workspace_bytes", "barrier_words", "profile_slices",
              "profile_shift"})
          if (auto n = func->getAttrOfType<mlir::IntegerAttr>(std::string("cell.") + attr))
            kernels[k][attr] = n.getInt();
        if (auto sites = func->getAttrOfType<mlir::ArrayAttr>("cell.profile_sites")) {
          llvm::json::Array names;
          for (auto site : sites.getAsValueRange<mlir::StringAttr>())
            names.push_back(site.str());
          kernels[k]["profile_sites"] = std::move(names);
        }
      }
      llvm::json::Object *scratch = kernels[k].getObject("scratch_bytes");
      if (!scratch) {
        kernels[k]["scratch_bytes"] = llvm::json::Object();
        scratch = kernels[k].getObject("scratch_bytes");
      }
      (*scratch)[saveGates ? "save" : "replay"] = scratchBytesOf(func);
    }
    mlir::PassManager toLLVM(&context);
    toLLVM.addPass(mlir::cell::createConvertKernelsToLLVM());
    if (lower && mlir::failed(toLLVM.run(*module)))
      return fail("cellc: lowering the CPU kernels to LLVM failed");
    package.variants[saveGates ? 1 : 0] = std::move(module);
  }
  llvm::json::Object all;
  for (int k : {0, 1})
    all[names[k]] = std::move(kernels[k]);
  package.meta["kernels"] = std::move(all);
  return package;
}

std::string CpuPackage::json() const {
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::formatv("{0:2}", llvm::json::Value(llvm::json::Object(meta))) << "\n";
  return text;
}

llvm::Error cellc::writeCpuPackage(const CpuPackage &package, llvm::StringRef dir) {
  if (std::error_code ec = llvm::sys::fs::create_directories(dir))
    return fail("cellc: error: cannot create '" + dir + "': " + ec.message());
  for (int variant : {1, 0})
    if (llvm::Error e = writeHostSharedObject(
            package.variants[variant].get(), (dir + (variant ? "/save.so" : "/replay.so")).str()))
      return e;
  return writeJson(dir, llvm::json::Object(package.meta));
}
