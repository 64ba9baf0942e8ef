//===- SimtToHost.cpp - The CUDA kernels' LLVM IR, run on the host --------===//
//
// The SIMT emulator's compiler half. It takes the LLVM IR that PTX.cpp hands
// to the NVPTX backend and retargets it to the host. Only what is CUDA's is
// rewritten, each into a call of a hook of the emulator
// (dialects/Cell/IR/EmulatorHooks.def, implemented by runtime/emu/Simt.cpp):
//
//   - the special registers (llvm.nvvm.read.ptx.sreg.*);
//   - bar.sync (llvm.nvvm.barrier0), shfl.sync (llvm.nvvm.shfl.sync.*) and
//     mma.sync (the tf32 intrinsic and the bf16 inline PTX);
//   - fence.acq_rel.gpu and the grid barrier's inline PTX (ld.acquire,
//     atom.acq_rel, st.relaxed, red.release, nanosleep), and a hook after
//     each atomic (before the barrier's);
//   - shared memory (address space 3): each variable at its offset in the
//     calling CTA's arena, and a hook before each access (the race check);
//   - global memory: a hook before each access (the bounds check);
//   - bf16 conversions, expanded as cvt.rn.bf16.f32 rounds.
//
// Everything else is the kernels' own code, compiled for the host as it
// stands. An NVVM intrinsic or a PTX string with no hook is an error that
// names it.
//
//===----------------------------------------------------------------------===//

#include "compiler/Pipelines/Pipelines.h"

#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Target/LLVMIR/Dialect/GPU/GPUToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/NVVM/NVVMToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Export.h"
#include "llvm/ADT/StringSwitch.h"
#include "llvm/Analysis/ValueTracking.h"
#include "llvm/IR/IRBuilder.h"
#include "llvm/IR/InlineAsm.h"
#include "llvm/IR/Instructions.h"
#include "llvm/IR/InstIterator.h"
#include "llvm/IR/IntrinsicInst.h"
#include "llvm/IR/Module.h"
#include "llvm/IR/ReplaceConstant.h"
#include "llvm/IR/Verifier.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>

using namespace cellc;

namespace {

llvm::Error fail(const llvm::Twine &message) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), message);
}

/// The hooks, numbered in EmulatorHooks.def's order.
enum class Hook {
#define CELLC_EMU_HOOK(name, ...) name,
#include "dialects/Cell/IR/EmulatorHooks.def"
  Count
};

/// shfl.sync's modes, as the hook takes them.
enum ShuffleMode { Up = 0, Down = 1, Bfly = 2, Idx = 3 };
/// mma.sync's shapes, as the hook takes them.
enum MmaShape { Tf32M16N8K8 = 0, Bf16M16N8K16 = 1 };

/// Rewrites one module (see the file comment).
class SimtToHost {
public:
  SimtToHost(llvm::Module &module, int dropBarrier, bool swapMmaA)
      : module(module), dropBarrier(dropBarrier), swapMmaA(swapMmaA), context(module.getContext()),
        ptr(llvm::PointerType::getUnqual(context)), i32(llvm::Type::getInt32Ty(context)),
        i64(llvm::Type::getInt64Ty(context)), f32(llvm::Type::getFloatTy(context)) {}

  llvm::Error run();

private:
  llvm::Function *hook(Hook which);
  void declareHookTable();
  llvm::Error placeSharedMemory();
  llvm::Error rewriteCall(llvm::CallInst *call);
  llvm::Error rewriteIntrinsic(llvm::CallInst *call, llvm::StringRef name);
  llvm::Error rewriteInlineAsm(llvm::CallInst *call, llvm::StringRef text);
  /// The grid barrier's inline PTX (Persistent.cpp) as host atomics, each
  /// after the atomic hook; `call` itself where the PTX has no result, null
  /// where `text` is not one of them.
  llvm::Value *emitBarrierPtx(llvm::CallInst *call, llvm::StringRef text);
  llvm::Value *emitShuffle(llvm::CallInst *call, ShuffleMode mode, bool predicate);
  llvm::Value *emitMma(llvm::CallInst *call, MmaShape shape);
  void checkAccess(llvm::Instruction *inst, llvm::Value *address, llvm::Type *type,
                   bool write);
  void expandBf16(llvm::Instruction *inst);
  void bf16AsBits(llvm::Instruction *access);
  std::string where(llvm::Instruction *inst) const;

  llvm::Module &module;
  /// The planted bug: the bar.sync to drop (-1: none), A's registers swapped.
  int dropBarrier;
  bool swapMmaA;
  int barriers = 0;
  llvm::LLVMContext &context;
  llvm::Type *ptr, *i32, *i64, *f32;
  llvm::GlobalVariable *table = nullptr;
  llvm::Function *hooks[size_t(Hook::Count)] = {};
};

std::string SimtToHost::where(llvm::Instruction *inst) const {
  return "in kernel " + inst->getFunction()->getName().str();
}

/// The hook's type, from EmulatorHooks.def's words.
llvm::FunctionType *hookType(llvm::LLVMContext &context, Hook which) {
  // The .def's type words, as LLVM types.
  [[maybe_unused]] llvm::Type *Void = llvm::Type::getVoidTy(context),
                              *I32 = llvm::Type::getInt32Ty(context),
                              *I64 = llvm::Type::getInt64Ty(context),
                              *Ptr = llvm::PointerType::getUnqual(context);
  switch (which) {
#define CELLC_EMU_HOOK(name, result, ...)                                      \
  case Hook::name:                                                             \
    return llvm::FunctionType::get(result, std::vector<llvm::Type *>{__VA_ARGS__}, \
                                   false);
#include "dialects/Cell/IR/EmulatorHooks.def"
  case Hook::Count:
    break;
  }
  llvm_unreachable("not a hook");
}

llvm::StringRef hookName(Hook which) {
  static constexpr llvm::StringLiteral names[] = {
#define CELLC_EMU_HOOK(name, ...) #name,
#include "dialects/Cell/IR/EmulatorHooks.def"
  };
  return names[size_t(which)];
}

void SimtToHost::declareHookTable() {
  auto *type = llvm::ArrayType::get(ptr, size_t(Hook::Count));
  table = new llvm::GlobalVariable(module, type, /*isConstant=*/false,
                                   llvm::GlobalValue::ExternalLinkage,
                                   llvm::Constant::getNullValue(type), "cellc_emu_hooks");
  // The table's length and the hooks' signatures are this compiler's: the
  // runtime loads only an object with as many hooks as it has.
  new llvm::GlobalVariable(module, i64, true, llvm::GlobalValue::ExternalLinkage,
                           llvm::ConstantInt::get(i64, size_t(Hook::Count)),
                           "cellc_emu_hook_count");
}

/// A function that calls the hook through the table: inlined at each use.
llvm::Function *SimtToHost::hook(Hook which) {
  llvm::Function *&f = hooks[size_t(which)];
  if (f)
    return f;
  llvm::FunctionType *type = hookType(context, which);
  f = llvm::Function::Create(type, llvm::GlobalValue::InternalLinkage,
                             "cellc_emu_" + hookName(which), module);
  f->addFnAttr(llvm::Attribute::AlwaysInline);
  llvm::IRBuilder<> b(llvm::BasicBlock::Create(context, "entry", f));
  llvm::Value *slot = b.CreateConstGEP2_64(table->getValueType(), table, 0, size_t(which));
  llvm::Value *target = b.CreateLoad(ptr, slot);
  std::vector<llvm::Value *> args;
  for (llvm::Argument &a : f->args())
    args.push_back(&a);
  llvm::Value *result = b.CreateCall(type, target, args);
  if (type->getReturnType()->isVoidTy())
    b.CreateRetVoid();
  else
    b.CreateRet(result);
  return f;
}

/// Lays the shared variables out in one arena per CTA: each static one at an
/// aligned offset, the dynamic one (an extern array of no size) after them.
/// The table `cellc_emu_shared` ({offset, bytes, name} each, then
/// `cellc_emu_shared_count`) names them for the race check's messages.
llvm::Error SimtToHost::placeSharedMemory() {
  std::vector<llvm::GlobalVariable *> shared;
  for (llvm::GlobalVariable &g : module.globals())
    if (g.getAddressSpace() == 3)
      shared.push_back(&g);
  const llvm::DataLayout &layout = module.getDataLayout();
  std::vector<uint64_t> offsets;
  uint64_t end = 0;
  std::vector<llvm::GlobalVariable *> dynamic;
  for (llvm::GlobalVariable *g : shared) {
    uint64_t bytes = layout.getTypeAllocSize(g->getValueType());
    if (bytes == 0) {
      dynamic.push_back(g);
      continue;
    }
    end = llvm::alignTo(end, std::max<uint64_t>(16, g->getAlign().valueOrOne().value()));
    offsets.push_back(end);
    end += bytes;
  }
  end = llvm::alignTo(end, 16);
  std::vector<llvm::Constant *> rows;
  auto *rowType = llvm::StructType::get(context, {i64, i64, ptr});
  size_t index = 0;
  llvm::IRBuilder<> b(context);
  for (llvm::GlobalVariable *g : shared) {
    uint64_t bytes = layout.getTypeAllocSize(g->getValueType());
    uint64_t offset = bytes ? offsets[index++] : end;
    std::string name = g->getName().str();
    rows.push_back(llvm::ConstantStruct::get(
        rowType, {b.getInt64(offset), b.getInt64(bytes),
                  b.CreateGlobalString(name, "cellc_emu_name", 0, &module)}));
    // Each function reads its CTA's arena once, at its entry.
    llvm::convertUsersOfConstantsToInstructions({g});
    std::map<llvm::Function *, llvm::Value *> addresses;
    for (llvm::Use &use : llvm::make_early_inc_range(g->uses())) {
      auto *user = llvm::dyn_cast<llvm::Instruction>(use.getUser());
      if (!user)
        return fail("cellc: the SIMT emulator cannot place the shared variable " + name +
                    ", used outside a function");
      llvm::Function *f = user->getFunction();
      llvm::Value *&address = addresses[f];
      if (!address) {
        llvm::IRBuilder<> entry(&*f->getEntryBlock().getFirstInsertionPt());
        llvm::Value *base = entry.CreateCall(hook(Hook::shared_base));
        llvm::Value *start = entry.CreateConstGEP1_64(entry.getInt8Ty(), base, offset);
        address = entry.CreateAddrSpaceCast(start, g->getType(), name);
      }
      use.set(address);
    }
    g->eraseFromParent();
  }
  auto *type = llvm::ArrayType::get(rowType, rows.size());
  new llvm::GlobalVariable(module, type, true, llvm::GlobalValue::ExternalLinkage,
                           llvm::ConstantArray::get(type, rows), "cellc_emu_shared");
  new llvm::GlobalVariable(module, i64, true, llvm::GlobalValue::ExternalLinkage,
                           b.getInt64(rows.size()), "cellc_emu_shared_count");
  new llvm::GlobalVariable(module, i64, true, llvm::GlobalValue::ExternalLinkage,
                           b.getInt64(end), "cellc_emu_static_shared_bytes");
  return llvm::Error::success();
}

/// A load or store: the race check in shared memory, the bounds check in
/// global memory; the stack is the thread's own.
void SimtToHost::checkAccess(llvm::Instruction *inst, llvm::Value *address,
                             llvm::Type *type, bool write) {
  unsigned space = address->getType()->getPointerAddressSpace();
  const llvm::Value *base = llvm::getUnderlyingObject(address, /*MaxLookup=*/0);
  if (space != 3 && llvm::isa<llvm::AllocaInst>(base))
    return;
  llvm::IRBuilder<> b(inst);
  uint64_t bytes = module.getDataLayout().getTypeStoreSize(type);
  llvm::Value *generic = b.CreateAddrSpaceCast(address, ptr);
  // A generic pointer into shared memory (clang's CUDA makes one of every
  // __shared__ array) derives from the CTA's arena.
  auto *call = llvm::dyn_cast<llvm::CallInst>(base);
  if (space == 3 || (call && call->getCalledOperand() == hook(Hook::shared_base))) {
    b.CreateCall(hook(Hook::shared_access), {generic, b.getInt64(bytes), b.getInt32(write)});
    return;
  }
  // The argument the address derives from: its own buffer bounds it.
  llvm::Value *argument = llvm::ConstantPointerNull::get(llvm::cast<llvm::PointerType>(ptr));
  if (auto *arg = llvm::dyn_cast<llvm::Argument>(base))
    argument = b.CreateAddrSpaceCast(const_cast<llvm::Argument *>(arg), ptr);
  b.CreateCall(hook(Hook::global_access),
               {generic, b.getInt64(bytes), b.getInt32(write), argument});
}

/// shfl.sync.{up,down,bfly,idx}.{i32,f32}[p](mask, value, b, c): the hook
/// takes the value's bits and returns them with the predicate above.
llvm::Value *SimtToHost::emitShuffle(llvm::CallInst *call, ShuffleMode mode,
                                     bool predicate) {
  llvm::IRBuilder<> b(call);
  llvm::Value *value = call->getArgOperand(1);
  llvm::Type *type = value->getType();
  llvm::Value *got = b.CreateCall(
      hook(Hook::shfl), {b.getInt32(mode), call->getArgOperand(0), b.CreateBitCast(value, i32),
                         call->getArgOperand(2), call->getArgOperand(3)});
  llvm::Value *result = b.CreateBitCast(b.CreateTrunc(got, i32), type);
  if (!predicate)
    return result;
  llvm::Value *valid = b.CreateTrunc(b.CreateLShr(got, 32), b.getInt1Ty());
  llvm::Value *pair = llvm::PoisonValue::get(call->getType());
  pair = b.CreateInsertValue(pair, result, 0);
  return b.CreateInsertValue(pair, valid, 1);
}

/// mma.sync: the lane's a, b and c registers go to the hook through the
/// stack, and d comes back as the struct of four floats.
llvm::Value *SimtToHost::emitMma(llvm::CallInst *call, MmaShape shape) {
  llvm::Function *f = call->getFunction();
  llvm::IRBuilder<> entry(&*f->getEntryBlock().getFirstInsertionPt());
  auto *words = llvm::ArrayType::get(i32, 4), *floats = llvm::ArrayType::get(f32, 4);
  llvm::Value *a = entry.CreateAlloca(words), *bRegs = entry.CreateAlloca(words),
              *c = entry.CreateAlloca(floats), *d = entry.CreateAlloca(floats);
  llvm::IRBuilder<> b(call);
  // Operands: 4 words of a, 2 of b, 4 floats of c.
  for (unsigned i = 0; i < 10; ++i) {
    llvm::Value *v = call->getArgOperand(i);
    llvm::Value *to = i < 4 ? a : i < 6 ? bRegs : c;
    unsigned k = i < 4 ? i : i < 6 ? i - 4 : i - 6;
    if (swapMmaA && i < 2)
      k = 1 - k;
    b.CreateStore(v, b.CreateConstGEP1_64(v->getType(), to, k));
  }
  b.CreateCall(hook(Hook::mma), {b.getInt32(shape), a, bRegs, c, d});
  llvm::Value *result = llvm::PoisonValue::get(call->getType());
  for (unsigned i = 0; i < 4; ++i)
    result = b.CreateInsertValue(
        result, b.CreateLoad(f32, b.CreateConstGEP1_64(f32, d, i)), i);
  return result;
}

/// The hook that reads a special register ("tid.x", ...): the hooks tid_x
/// to laneid, spelled with dots.
std::optional<Hook> specialRegister(llvm::StringRef reg) {
  for (size_t h = size_t(Hook::tid_x); h <= size_t(Hook::laneid); ++h) {
    std::string dotted = hookName(Hook(h)).str();
    std::replace(dotted.begin(), dotted.end(), '_', '.');
    if (reg == dotted)
      return Hook(h);
  }
  return std::nullopt;
}

llvm::Error SimtToHost::rewriteIntrinsic(llvm::CallInst *call, llvm::StringRef name) {
  llvm::IRBuilder<> b(call);
  llvm::Value *replacement = nullptr;
  llvm::StringRef rest = name;
  if (rest.consume_front("llvm.nvvm.read.ptx.sreg.")) {
    if (std::optional<Hook> reg = specialRegister(rest))
      replacement = b.CreateCall(hook(*reg));
  } else if (name == "llvm.nvvm.barrier0") {
    // The site, so that the emulator can hold the lanes of a warp to one
    // bar.sync: NVPTX writes barrier0 as `bar.sync 0`, which is
    // barrier.sync.aligned.
    int site = barriers++;
    if (site != dropBarrier)
      b.CreateCall(hook(Hook::barrier), {b.getInt32(site)});
    call->eraseFromParent();
    return llvm::Error::success();
  } else if (rest.consume_front("llvm.nvvm.shfl.sync.")) {
    auto [mode, type] = rest.split('.');
    std::optional<ShuffleMode> m = llvm::StringSwitch<std::optional<ShuffleMode>>(mode)
                                       .Case("up", Up)
                                       .Case("down", Down)
                                       .Case("bfly", Bfly)
                                       .Case("idx", Idx)
                                       .Default(std::nullopt);
    if (m && (type == "i32" || type == "f32" || type == "i32p" || type == "f32p"))
      replacement = emitShuffle(call, *m, type.ends_with("p"));
  } else if (name == "llvm.nvvm.mma.m16n8k8.row.col.tf32") {
    replacement = emitMma(call, Tf32M16N8K8);
  }
  if (!replacement)
    return fail("cellc: the SIMT emulator has no hook for the intrinsic " + name + " (" +
                where(call) + ")");
  call->replaceAllUsesWith(replacement);
  call->eraseFromParent();
  return llvm::Error::success();
}

llvm::Value *SimtToHost::emitBarrierPtx(llvm::CallInst *call, llvm::StringRef text) {
  enum Kind { LoadAcquire, AddAcqRel, StoreRelaxed, AddRelease, Sleep };
  std::optional<Kind> kind = llvm::StringSwitch<std::optional<Kind>>(text)
                                 .Case("ld.acquire.gpu.u32 $0, [$1];", LoadAcquire)
                                 .Case("atom.add.acq_rel.gpu.u32 $0, [$1], $2;", AddAcqRel)
                                 .Case("st.relaxed.gpu.u32 [$0], $1;", StoreRelaxed)
                                 .Case("red.release.gpu.add.u32 [$0], $1;", AddRelease)
                                 .Case("nanosleep.u32 32;", Sleep)
                                 .Default(std::nullopt);
  if (!kind)
    return nullptr;
  llvm::IRBuilder<> b(call);
  if (*kind == Sleep) {
    // Another thread runs, as after a fence.
    b.CreateCall(hook(Hook::fence));
    return call;
  }
  // The word's address: checked, and another thread may run, before the
  // access; the access is the host's atomic of the PTX's order.
  llvm::Value *address = b.CreateIntToPtr(call->getArgOperand(0), ptr);
  b.CreateCall(hook(Hook::atomic), {address, b.getInt64(4)});
  switch (*kind) {
  case LoadAcquire: {
    llvm::LoadInst *load = b.CreateAlignedLoad(i32, address, llvm::Align(4));
    load->setAtomic(llvm::AtomicOrdering::Acquire);
    return load;
  }
  case AddAcqRel:
    return b.CreateAtomicRMW(llvm::AtomicRMWInst::Add, address, call->getArgOperand(1),
                             llvm::Align(4), llvm::AtomicOrdering::AcquireRelease);
  case StoreRelaxed: {
    llvm::StoreInst *store = b.CreateAlignedStore(call->getArgOperand(1), address,
                                                  llvm::Align(4));
    store->setAtomic(llvm::AtomicOrdering::Monotonic);
    return call;
  }
  case AddRelease:
    b.CreateAtomicRMW(llvm::AtomicRMWInst::Add, address, call->getArgOperand(1),
                      llvm::Align(4), llvm::AtomicOrdering::Release);
    return call;
  case Sleep:
    break;
  }
  return call;
}

llvm::Error SimtToHost::rewriteInlineAsm(llvm::CallInst *call, llvm::StringRef text) {
  llvm::Value *replacement = nullptr;
  if (text.trim() == "fence.acq_rel.gpu;") {
    llvm::IRBuilder<>(call).CreateCall(hook(Hook::fence));
    call->eraseFromParent();
    return llvm::Error::success();
  }
  if (llvm::Value *atomic = emitBarrierPtx(call, text.trim())) {
    if (atomic != call) {
      call->replaceAllUsesWith(atomic);
    }
    call->eraseFromParent();
    return llvm::Error::success();
  }
  if (text.starts_with("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 ") &&
      call->arg_size() == 10)
    replacement = emitMma(call, Bf16M16N8K16);
  // The same tf32 product as the intrinsic, as CUDA C++ spells it
  // (runtime/cuda/ChunkKernels.cu): a, b, c in the intrinsic's order.
  if (text.starts_with("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 ") &&
      call->arg_size() == 10)
    replacement = emitMma(call, Tf32M16N8K8);
  if (!replacement)
    return fail("cellc: the SIMT emulator has no hook for the inline PTX '" + text +
                "' (" + where(call) + ")");
  call->replaceAllUsesWith(replacement);
  call->eraseFromParent();
  return llvm::Error::success();
}

llvm::Error SimtToHost::rewriteCall(llvm::CallInst *call) {
  if (auto *asmCall = llvm::dyn_cast<llvm::InlineAsm>(call->getCalledOperand()))
    return rewriteInlineAsm(call, asmCall->getAsmString());
  llvm::Function *callee = call->getCalledFunction();
  if (callee && callee->getName().starts_with("llvm.nvvm."))
    return rewriteIntrinsic(call, callee->getName());
  return llvm::Error::success();
}

/// bf16 conversions as the hardware rounds them (cvt.rn.bf16.f32: to
/// nearest even, NaN stays NaN), and exactly back to f32, in integer code.
void SimtToHost::expandBf16(llvm::Instruction *inst) {
  llvm::IRBuilder<> b(inst);
  llvm::Type *type = inst->getType();
  auto like = [&](llvm::Type *element) -> llvm::Type * {
    if (auto *v = llvm::dyn_cast<llvm::VectorType>(type))
      return llvm::VectorType::get(element, v->getElementCount());
    return element;
  };
  auto splat = [&](llvm::Type *t, uint64_t value) {
    return llvm::ConstantInt::get(t, value);
  };
  llvm::Value *in = inst->getOperand(0), *out;
  llvm::Type *words = like(i32), *halves = like(b.getInt16Ty());
  if (llvm::isa<llvm::FPTruncInst>(inst)) {
    llvm::Value *bits = b.CreateBitCast(in, words);
    llvm::Value *odd = b.CreateAnd(b.CreateLShr(bits, splat(words, 16)), splat(words, 1));
    llvm::Value *rounded = b.CreateAdd(bits, b.CreateAdd(splat(words, 0x7fff), odd));
    llvm::Value *nan = b.CreateFCmpUNO(in, in);
    llvm::Value *high = b.CreateSelect(nan, splat(words, 0x7fc00000u), rounded);
    out = b.CreateBitCast(b.CreateTrunc(b.CreateLShr(high, splat(words, 16)), halves), type);
  } else {
    llvm::Value *bits = b.CreateZExt(b.CreateBitCast(in, halves), words);
    out = b.CreateBitCast(b.CreateShl(bits, splat(words, 16)), type);
  }
  inst->replaceAllUsesWith(out);
  inst->eraseFromParent();
}

/// A bf16 load or store as one of i16: the host has no bf16 registers, and
/// its code generator would convert through f32 with a libgcc call.
void SimtToHost::bf16AsBits(llvm::Instruction *access) {
  auto *load = llvm::dyn_cast<llvm::LoadInst>(access);
  auto *store = llvm::dyn_cast<llvm::StoreInst>(access);
  llvm::Type *type = load ? load->getType() : store->getValueOperand()->getType();
  if (!type->getScalarType()->isBFloatTy())
    return;
  llvm::Type *bits = type->getWithNewType(llvm::Type::getInt16Ty(context));
  llvm::IRBuilder<> b(access);
  if (store) {
    store->setOperand(0, b.CreateBitCast(store->getValueOperand(), bits));
    return;
  }
  llvm::LoadInst *word = b.CreateAlignedLoad(bits, load->getPointerOperand(),
                                             load->getAlign(), load->isVolatile());
  load->replaceAllUsesWith(b.CreateBitCast(word, type));
  load->eraseFromParent();
}

llvm::Error SimtToHost::run() {
  declareHookTable();
  if (llvm::Error e = placeSharedMemory())
    return e;
  std::vector<llvm::Instruction *> work;
  for (llvm::Function &f : module)
    if (!f.isDeclaration() && !f.getName().starts_with("cellc_emu_"))
      for (llvm::Instruction &inst : llvm::instructions(f))
        work.push_back(&inst);
  for (llvm::Instruction *inst : work) {
    if (auto *call = llvm::dyn_cast<llvm::CallInst>(inst)) {
      if (llvm::Error e = rewriteCall(call))
        return e;
    } else if (auto *load = llvm::dyn_cast<llvm::LoadInst>(inst)) {
      checkAccess(load, load->getPointerOperand(), load->getType(), false);
      bf16AsBits(load);
    } else if (auto *store = llvm::dyn_cast<llvm::StoreInst>(inst)) {
      checkAccess(store, store->getPointerOperand(), store->getValueOperand()->getType(),
                  true);
      bf16AsBits(store);
    } else if (llvm::isa<llvm::AtomicRMWInst, llvm::AtomicCmpXchgInst>(inst)) {
      auto *rmw = llvm::dyn_cast<llvm::AtomicRMWInst>(inst);
      auto *xchg = llvm::dyn_cast<llvm::AtomicCmpXchgInst>(inst);
      llvm::Value *address = rmw ? rmw->getPointerOperand() : xchg->getPointerOperand();
      if (address->getType()->getPointerAddressSpace() == 3)
        return fail("cellc: the SIMT emulator has no atomics on shared memory (" +
                    where(inst) + ")");
      llvm::IRBuilder<> b(inst->getNextNode());
      uint64_t bytes = module.getDataLayout().getTypeStoreSize(
          rmw ? rmw->getType() : xchg->getNewValOperand()->getType());
      b.CreateCall(hook(Hook::atomic),
                   {b.CreateAddrSpaceCast(address, ptr), b.getInt64(bytes)});
    } else if ((llvm::isa<llvm::FPTruncInst>(inst) &&
                inst->getType()->getScalarType()->isBFloatTy()) ||
               (llvm::isa<llvm::FPExtInst>(inst) &&
                inst->getOperand(0)->getType()->getScalarType()->isBFloatTy())) {
      expandBf16(inst);
    }
  }
  // What was the NVPTX target's: its annotations and the unused intrinsics.
  if (llvm::NamedMDNode *annotations = module.getNamedMetadata("nvvm.annotations"))
    module.eraseNamedMetadata(annotations);
  for (llvm::Function &f : llvm::make_early_inc_range(module))
    if (f.isDeclaration() && f.getName().starts_with("llvm.nvvm.") && f.use_empty())
      f.eraseFromParent();
  std::string message;
  llvm::raw_string_ostream os(message);
  if (llvm::verifyModule(module, &os))
    return fail("internal error: the SIMT emulator's IR does not verify:\n" + message);
  return llvm::Error::success();
}

/// The gpu.module's LLVM IR, as PTX.cpp's serialization translates it, and
/// its kernels.
llvm::Expected<std::unique_ptr<llvm::Module>>
translateKernels(mlir::ModuleOp module, llvm::LLVMContext &context,
                 std::vector<std::string> &kernels) {
  mlir::MLIRContext *ctx = module.getContext();
  mlir::registerLLVMDialectTranslation(*ctx);
  mlir::registerNVVMDialectTranslation(*ctx);
  mlir::registerGPUDialectTranslation(*ctx);
  auto gpuModules = module.getOps<mlir::gpu::GPUModuleOp>();
  if (gpuModules.empty())
    return fail("cellc: no gpu.module to emulate; build the kernels with target=cuda");
  mlir::gpu::GPUModuleOp gpuModule = *gpuModules.begin();
  for (auto func : gpuModule.getOps<mlir::LLVM::LLVMFuncOp>())
    if (func->hasAttr("nvvm.kernel"))
      kernels.push_back(func.getName().str());
  std::unique_ptr<llvm::Module> ir = mlir::translateModuleToLLVMIR(gpuModule, context);
  if (!ir)
    return fail("cellc: translating the CUDA kernels to LLVM IR failed");
  return ir;
}

/// Parses a planted bug (writeSimtSharedObject) and rewrites `ir`.
llvm::Error retarget(llvm::Module &ir, llvm::StringRef mutation) {
  int dropBarrier = -1;
  bool swapMmaA = mutation == "swap-mma-a";
  llvm::StringRef n = mutation;
  if (n.consume_front("drop-barrier:")) {
    if (n.getAsInteger(10, dropBarrier) || dropBarrier < 0)
      return fail("cellc: bad SIMT mutation '" + mutation + "'");
  } else if (!mutation.empty() && !swapMmaA) {
    return fail("cellc: unknown SIMT mutation '" + mutation +
                "'; expected drop-barrier:N or swap-mma-a");
  }
  return SimtToHost(ir, dropBarrier, swapMmaA).run();
}

/// Runs `use` on the LLVM IR of `module`'s kernels and their names.
llvm::Error withKernels(
    mlir::ModuleOp module,
    llvm::function_ref<llvm::Error(llvm::Module &, llvm::ArrayRef<std::string>)> use) {
  llvm::LLVMContext context;
  std::vector<std::string> kernels;
  auto ir = translateKernels(module, context, kernels);
  if (!ir)
    return ir.takeError();
  return use(**ir, kernels);
}

} // namespace

llvm::Error cellc::printSimtIR(mlir::ModuleOp module, llvm::raw_ostream &os,
                               llvm::StringRef mutation) {
  return withKernels(module, [&](llvm::Module &ir, llvm::ArrayRef<std::string>) -> llvm::Error {
    if (llvm::Error e = retarget(ir, mutation))
      return e;
    ir.print(os, nullptr);
    return llvm::Error::success();
  });
}

llvm::Error cellc::writeSimtSharedObject(mlir::ModuleOp module, llvm::StringRef path,
                                         llvm::StringRef mutation) {
  return withKernels(module, [&](llvm::Module &ir, llvm::ArrayRef<std::string> kernels) {
    return compileSimtObject(ir, kernels, path, mutation);
  });
}

llvm::Error cellc::compileSimtObject(llvm::Module &ir, llvm::ArrayRef<std::string> kernels,
                                     llvm::StringRef path, llvm::StringRef mutation) {
  if (llvm::Error e = retarget(ir, mutation))
    return e;
  for (const std::string &name : kernels) {
    llvm::Function *kernel = ir.getFunction(name);
    if (!kernel)
      return fail("cellc: no kernel '" + name + "' to emulate");
    addPackedEntry(*kernel, name);
  }
  // O1: the emulator's time goes to its hooks, and O3 takes seconds more
  // over code with a call at every access.
  return compileHostSharedObject(ir, path, /*optLevel=*/1);
}
