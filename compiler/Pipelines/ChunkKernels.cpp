//===- ChunkKernels.cpp - The chunk form's CUDA kernels, for the emulator -===//
//
// runtime/cuda/ChunkKernels.cu as clang compiles it for the NVPTX backend
// (ChunkKernels.ll.inc, which scripts/gen-chunk-kernels.sh writes beside the
// PTX the runtime loads on a GPU), retargeted to the host by SimtToHost: the
// SIMT emulator's object of the same kernels.
//
//===----------------------------------------------------------------------===//

#include "compiler/Pipelines/Pipelines.h"

#include "llvm/AsmParser/Parser.h"
#include "llvm/IR/Constants.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/Metadata.h"
#include "llvm/IR/Module.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/raw_ostream.h"

namespace {

const char *const kChunkKernelsIR =
#include "compiler/Pipelines/ChunkKernels.ll.inc"
    ;

} // namespace

llvm::Error cellc::writeChunkKernelsSimt(llvm::StringRef path, llvm::StringRef mutation) {
  llvm::LLVMContext context;
  llvm::SMDiagnostic diagnostic;
  std::unique_ptr<llvm::Module> ir =
      llvm::parseAssemblyString(kChunkKernelsIR, diagnostic, context);
  if (!ir) {
    std::string message;
    llvm::raw_string_ostream os(message);
    diagnostic.print("ChunkKernels.ll", os);
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "internal error: the chunk kernels' IR: " + message);
  }
  // The kernels, as clang marks them for the NVPTX backend.
  std::vector<std::string> kernels;
  if (llvm::NamedMDNode *annotations = ir->getNamedMetadata("nvvm.annotations"))
    for (llvm::MDNode *node : annotations->operands())
      if (node->getNumOperands() == 3)
        if (auto *name = llvm::dyn_cast<llvm::MDString>(node->getOperand(1)))
          if (name->getString() == "kernel")
            if (auto *f = llvm::mdconst::dyn_extract_or_null<llvm::Function>(
                    node->getOperand(0)))
              kernels.push_back(f->getName().str());
  // The NVPTX target's own attributes, which mean nothing to the host's.
  for (llvm::Function &f : *ir) {
    f.removeFnAttr("target-cpu");
    f.removeFnAttr("target-features");
  }
  return compileSimtObject(*ir, kernels, path, mutation);
}
