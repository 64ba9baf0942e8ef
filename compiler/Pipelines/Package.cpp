//===- Package.cpp - AOT packages of CUDA kernels -------------------------===//
//
// A package is a directory with the PTX of both SAVE_GATES variants and
// kernels.json: the cell, sizes, options and each kernel's launch shape and
// arguments. The CUDA runtime (runtime/cuda, python/cellc/cuda.py) runs it
// without MLIR or LLVM.
//
//===----------------------------------------------------------------------===//

#include "compiler/Pipelines/Pipelines.h"

#include "compiler/Conversion/Passes.h"
#include "compiler/Conversion/Common/KernelABI.h"
#include "dialects/Cell/IR/CellOps.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

using namespace cellc;

static llvm::Error fail(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
}

llvm::Error cellc::writePackage(mlir::ModuleOp cell, llvm::StringRef dir,
                                const PipelineOptions &cuda, llvm::StringRef arch,
                                llvm::StringRef dtype) {
  mlir::MLIRContext &context = *cell.getContext();
  if (std::error_code ec = llvm::sys::fs::create_directories(dir))
    return fail("cellc: error: cannot create '" + dir + "': " + ec.message());
  auto def = *cell.getOps<mlir::cell::DefOp>().begin();
  llvm::json::Object meta;
  meta["format"] = 2;
  meta["cell"] = def.getSymName().str();
  meta["arch"] = arch.str();
  meta["dtype"] = dtype.str();
  meta["precision"] = name(cuda.precision);
  meta["strategy"] = name(cuda.strategy);
  meta["storage"] = name(cuda.storage);
  llvm::json::Object sizeObj;
  if (auto sizes = def->getAttrOfType<mlir::DictionaryAttr>("sizes"))
    for (auto entry : sizes)
      sizeObj[entry.getName().str()] =
          llvm::cast<mlir::IntegerAttr>(entry.getValue()).getInt();
  meta["sizes"] = std::move(sizeObj);
  // The cell's inputs, params, states and outputs with their shapes, in the
  // kernels' order: what a runtime binds tensors to.
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
  llvm::json::Object variants, kernels;
  for (bool saveGates : {true, false}) {
    mlir::OwningOpRef<mlir::ModuleOp> module = cell.clone();
    PipelineOptions options = cuda;
    options.saveGates = saveGates;
    mlir::PassManager pm(&context);
    buildPipeline(pm, Stage::Kernels, options);
    if (mlir::failed(pm.run(*module)))
      return fail("cellc: building the CUDA kernels failed");
    module->walk([&](mlir::gpu::GPUFuncOp func) {
      llvm::json::Object k;
      k["batch_tile"] = func->getAttrOfType<mlir::IntegerAttr>("cell.batch_tile").getInt();
      k["threads"] = func->getAttrOfType<mlir::IntegerAttr>("cell.threads").getInt();
      k["workgroup_bytes"] =
          func->getAttrOfType<mlir::IntegerAttr>("cell.workgroup_bytes").getInt();
      k["strategy"] = func->getAttrOfType<mlir::StringAttr>("cell.strategy").str();
      if (auto n = func->getAttrOfType<mlir::IntegerAttr>("cell.ctas"))
        k["ctas"] = n.getInt();
      if (auto n = func->getAttrOfType<mlir::IntegerAttr>("cell.workspace_bytes"))
        k["workspace_bytes"] = n.getInt();
      if (auto n = func->getAttrOfType<mlir::IntegerAttr>("cell.dynamic_shared_bytes"))
        k["dynamic_shared_bytes"] = n.getInt();
      llvm::json::Array args;
      for (auto [arg, type] :
           llvm::zip(mlir::cell::kernelArgsOf(func), func.getArgumentTypes())) {
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
      k["args"] = std::move(args);
      kernels[func.getName().str()] = std::move(k);
    });
    // The kernels are built and specialized; the NVVM lowering is left.
    mlir::PassManager nvvm(&context);
    nvvm.addPass(mlir::cell::createConvertKernelsToNVVM());
    if (mlir::failed(nvvm.run(*module)))
      return fail("cellc: lowering the CUDA kernels to NVVM failed");
    auto ptx = serializeToPTX(*module, arch);
    if (!ptx)
      return ptx.takeError();
    std::string name = saveGates ? "save.ptx" : "replay.ptx";
    std::error_code ec;
    llvm::raw_fd_ostream out((dir + "/" + name).str(), ec);
    if (ec)
      return fail("cellc: error: cannot write " + name + ": " + ec.message());
    out << *ptx;
    variants[saveGates ? "save" : "replay"] = name;
  }
  meta["ptx"] = std::move(variants);
  meta["kernels"] = std::move(kernels);
  std::error_code ec;
  llvm::raw_fd_ostream out((dir + "/kernels.json").str(), ec);
  if (ec)
    return fail("cellc: error: cannot write kernels.json: " + ec.message());
  out << llvm::formatv("{0:2}", llvm::json::Value(std::move(meta))) << "\n";
  return llvm::Error::success();
}
