// SPDX-License-Identifier: Apache-2.0
#pragma once
// Inline PTX, written once for the GPU and for the emulated device:
//
//   MHC_SP_ASM("ld.acquire.sys.global.u64 %0, [%1];", (MHC_SP_ASM_ARG("=l", v)),
//              (MHC_SP_ASM_ARG("l", p)), ("memory"));
//
// is `asm volatile(text : outputs : inputs : clobbers)`, operand for operand, so the GPU build
// compiles exactly the statement it would compile without the macro. The emulated device's shim
// (csrc/emulation/shim/cuda_runtime.h) defines these macros first, to execute the same text with
// the same operands in its PTX interpreter: an operand order, an order or a scope written here is
// what both run.

#ifndef MHC_SP_ASM
#define MHC_SP_ASM(text, outputs, inputs, clobbers) \
  asm volatile(text : MHC_SP_ASM_LIST outputs : MHC_SP_ASM_LIST inputs : MHC_SP_ASM_LIST clobbers)
#define MHC_SP_ASM_LIST(...) __VA_ARGS__
#define MHC_SP_ASM_ARG(constraint, value) constraint(value)
#endif
