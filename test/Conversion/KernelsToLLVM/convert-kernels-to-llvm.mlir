// RUN: cellc-opt %s --convert-kernels-to-llvm | FileCheck %s --implicit-check-not=math. --implicit-check-not=scf. --implicit-check-not=memref. --implicit-check-not=vector. --implicit-check-not=func.func
//
// convert-kernels-to-llvm: everything goes to the LLVM dialect; f32 tanh
// and exp (scalar and vector) become polynomial approximations with no
// call, f64 tanh calls libm; a streaming vector store is aligned to its
// size; each kernel gets a C interface that takes memref descriptors by
// pointer.

// libm's tanh, for f64 only.
// CHECK: llvm.func @tanh(f64) -> f64
// CHECK-NOT: llvm.func @tanhf
// CHECK-NOT: llvm.func @expf
// The kernel takes expanded descriptors: pointers, offset, sizes, strides.
// CHECK: llvm.func @kernel(%{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr, %{{.*}}: i64, %{{.*}}: i64, %{{.*}}: i64,
// CHECK-SAME: attributes {llvm.emit_c_interface}
// The loop is branches.
// CHECK: llvm.cond_br
// The f32 tanh: arithmetic, then the store, with no call between.
// CHECK: llvm.fmul
// CHECK-NOT: llvm.call
// CHECK: llvm.store %{{.*}}, %{{.*}} : f32, !llvm.ptr
// CHECK: llvm.call @tanh(%{{.*}}) : (f64) -> f64
// CHECK: llvm.store %{{.*}}, %{{.*}} : f64, !llvm.ptr
// The vector exp: a range reduction (floor), no call.
// CHECK: llvm.intr.floor(%{{.*}}) : (vector<8xf32>) -> vector<8xf32>
// CHECK-NOT: llvm.call
// CHECK: llvm.store %{{.*}}, %{{.*}} {alignment = 4 : i64} : vector<8xf32>, !llvm.ptr
// A streaming store is of a whole vector at a multiple of its size (the
// batched kernels check the address), and LLVM is told so: one vmovntps,
// not 8-byte pieces.
// CHECK: llvm.store %{{.*}}, %{{.*}} {alignment = 32 : i64, nontemporal} : vector<8xf32>, !llvm.ptr
// CHECK: llvm.return
// CHECK: llvm.func @_mlir_ciface_kernel(%{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr, %{{.*}}: i64)
// CHECK: llvm.call @kernel(
func.func @kernel(%a: memref<?xf32>, %b: memref<?xf64>, %v: memref<8xf32>, %n: index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  scf.for %i = %c0 to %n step %c1 {
    %x = memref.load %a[%i] : memref<?xf32>
    %t = math.tanh %x : f32
    memref.store %t, %a[%i] : memref<?xf32>
    %y = memref.load %b[%i] : memref<?xf64>
    %u = math.tanh %y : f64
    memref.store %u, %b[%i] : memref<?xf64>
  }
  %w = vector.load %v[%c0] : memref<8xf32>, vector<8xf32>
  %e = math.exp %w : vector<8xf32>
  vector.store %e, %v[%c0] : memref<8xf32>, vector<8xf32>
  vector.store %e, %v[%c0] {nontemporal = true} : memref<8xf32>, vector<8xf32>
  return
}
