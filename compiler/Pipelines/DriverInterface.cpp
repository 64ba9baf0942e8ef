//===- DriverInterface.cpp - The driver's view of a cell's kernels --------===//
//
// What the sequence driver knows of a cell, read from its kernels at
// Stage::Kernels: each argument's kind and memref type, and the bytes each
// kernel allocates as it runs; and the memory plan that `--emit=plan`
// prints from it.
//
//===----------------------------------------------------------------------===//

#include "compiler/Pipelines/Pipelines.h"

#include "compiler/Conversion/Common/KernelABI.h"
#include "dialects/Cell/IR/CellOps.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "llvm/Support/FormatVariadic.h"

using namespace cellc;

namespace {

llvm::Error fail(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
}

/// The bytes a kernel allocates for itself as it runs (memref.alloc: a
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

/// A kernel's arguments, from its `cell.kernel_args` and argument types.
driver::Kernel kernelOf(mlir::func::FuncOp func) {
  driver::Kernel kernel;
  for (auto [attr, type] :
       llvm::zip(mlir::cell::kernelArgsOf(func), func.getArgumentTypes())) {
    driver::KernelArg arg;
    arg.kind = attr.getKind();
    arg.name = attr.getName().str();
    arg.input = attr.getInput().str();
    for (mlir::StringAttr b : attr.getBiases())
      arg.biases.push_back(b.str());
    arg.sameAs = attr.getSameAs();
    arg.zero = attr.getZero();
    if (auto memref = llvm::dyn_cast<mlir::MemRefType>(type)) {
      for (int64_t d : memref.getShape())
        arg.shape.push_back(mlir::ShapedType::isDynamic(d) ? -1 : d);
      std::string element;
      llvm::raw_string_ostream os(element);
      os << memref.getElementType();
      arg.element = driver::parseElement(os.str());
    }
    kernel.args.push_back(std::move(arg));
  }
  return kernel;
}

} // namespace

llvm::Error cellc::readKernels(mlir::ModuleOp kernels, llvm::StringRef cell,
                               bool saveGates, driver::Interface &interface) {
  auto fwd = kernels.lookupSymbol<mlir::func::FuncOp>((cell + "_fwd").str());
  auto bwd = kernels.lookupSymbol<mlir::func::FuncOp>((cell + "_bwd").str());
  if (!fwd || !bwd)
    return fail("internal error: no kernels @" + cell + "_fwd and _bwd");
  if (saveGates) {
    interface.forward = kernelOf(fwd);
    interface.backward = kernelOf(bwd);
  }
  interface.forward.scratchBytes[saveGates] = scratchBytesOf(fwd);
  interface.backward.scratchBytes[saveGates] = scratchBytesOf(bwd);
  return llvm::Error::success();
}

llvm::Error cellc::printMemoryPlan(mlir::ModuleOp cellIR, PipelineOptions options,
                                   int64_t steps, int64_t batch,
                                   llvm::raw_ostream &os) {
  auto def = *cellIR.getOps<mlir::cell::DefOp>().begin();
  mlir::Type element =
      llvm::cast<mlir::RankedTensorType>(def.getStates()[0].getType()).getElementType();
  driver::Interface interface;
  if (element.isF32())
    interface.compute = driver::Element::F32;
  else if (element.isF64())
    interface.compute = driver::Element::F64;
  else
    return llvm::Error::success();
  for (bool saveGates : {true, false}) {
    mlir::OwningOpRef<mlir::ModuleOp> kernels = cellIR.clone();
    mlir::PassManager pm(cellIR.getContext());
    options.saveGates = saveGates;
    buildPipeline(pm, Stage::Kernels, options);
    if (mlir::failed(pm.run(*kernels)))
      return fail("the passes failed");
    if (llvm::Error e = readKernels(*kernels, def.getSymName(), saveGates, interface))
      return e;
  }
  if (driver::Status e = interface.finish())
    return fail(e.message());

  auto mib = [](int64_t bytes) { return llvm::formatv("{0,9:F1}", bytes / 1048576.0); };
  os << llvm::formatv("a training step of T = {0} steps x B = {1} rows on one thread, "
                      "MiB (SequenceDriver::plan):\n",
                      steps, batch);
  os << "  mode            kept  fwd peak  bwd peak      peak     floor  piece\n";
  driver::MemoryPlan plan;
  for (const char *text : {"none", "full", "chunk:16", "chunk:64"}) {
    if (driver::Status e = driver::SequenceDriver::plan(
            interface, steps, batch, *driver::Recompute::parse(text), plan))
      return fail(e.message());
    os << llvm::formatv("  {0,-10} {1} {2} {3} {4} {5} {6,6}\n", text,
                        mib(plan.driver.kept), mib(plan.driver.forwardPeak),
                        mib(plan.driver.backwardPeak), mib(plan.peak()),
                        mib(plan.floor()), plan.pieceSteps);
  }
  // The caller's buffers are the same in every mode.
  os << llvm::formatv(
      "  kept: what forward keeps for backward (an output that is a state is not "
      "counted twice);\n"
      "  fwd/bwd peak: the most the runtime holds at once in each, kept bytes and the "
      "kernels' own buffers included;\n"
      "  peak: the most held at once over the step with the outputs ({0} MiB), their "
      "gradients ({1} MiB) and the inputs' and params' gradients ({2} MiB);\n"
      "  floor: what any implementation holds at the end: those gradients, the "
      "outputs and the kept states; piece: the steps of a piece\n",
      llvm::formatv("{0:F1}", plan.outputs / 1048576.0),
      llvm::formatv("{0:F1}", plan.gradOutputs / 1048576.0),
      llvm::formatv("{0:F1}", (plan.gradInputs + plan.gradParams) / 1048576.0));
  return llvm::Error::success();
}
