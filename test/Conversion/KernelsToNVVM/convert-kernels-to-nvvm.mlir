// RUN: cellc-opt %s --convert-kernels-to-nvvm | FileCheck %s --implicit-check-not=math. --implicit-check-not=memref. --implicit-check-not=gpu.func --implicit-check-not=llvm.call
//
// convert-kernels-to-nvvm: a gpu.func becomes an llvm.func kernel with NVVM
// intrinsics; workgroup buffers are address space 3; f32 tanh is a
// polynomial (no libdevice call), sqrt an LLVM intrinsic; memrefs are
// expanded descriptors, indices i64.

// CHECK: gpu.module @cellc_kernels
// CHECK: llvm.mlir.global internal @__wg_kernel_0() {addr_space = 3 : i32} : !llvm.array<64 x f32>
// CHECK: llvm.func @kernel(%{{.*}}: !llvm.ptr, %{{.*}}: !llvm.ptr, %{{.*}}: i64, %{{.*}}: i64, %{{.*}}: i64, %{{.*}}: i64)
// CHECK-SAME: nvvm.kernel
// CHECK-SAME: nvvm.maxntid = array<i32: 64, 1, 1>
// CHECK: llvm.mlir.addressof @__wg_kernel_0 : !llvm.ptr<3>
// CHECK: nvvm.read.ptx.sreg.tid.x : i32
// CHECK: nvvm.read.ptx.sreg.ctaid.x : i32
// CHECK: llvm.load %{{.*}} : !llvm.ptr -> f32
// CHECK: llvm.fmul
// CHECK: llvm.intr.sqrt(%{{.*}}) : (f32) -> f32
// CHECK: llvm.store %{{.*}}, %{{.*}} : f32, !llvm.ptr<3>
// CHECK: nvvm.barrier0
// CHECK: llvm.load %{{.*}} : !llvm.ptr<3> -> f32
// CHECK: llvm.return
module attributes {gpu.container_module} {
  gpu.module @cellc_kernels {
    gpu.func @kernel(%a: memref<?xf32>, %n: index) workgroup(%buf : memref<64xf32, #gpu.address_space<workgroup>>) kernel attributes {known_block_size = array<i32: 64, 1, 1>} {
      %tid = gpu.thread_id x
      %bid = gpu.block_id x
      %x = memref.load %a[%tid] : memref<?xf32>
      %t = math.tanh %x : f32
      %s = math.sqrt %t : f32
      memref.store %s, %buf[%tid] : memref<64xf32, #gpu.address_space<workgroup>>
      gpu.barrier
      %y = memref.load %buf[%bid] : memref<64xf32, #gpu.address_space<workgroup>>
      memref.store %y, %a[%tid] : memref<?xf32>
      gpu.return
    }
  }
}
