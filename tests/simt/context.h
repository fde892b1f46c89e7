// Switching between the emulation's fibers (tests/simt/runtime.cpp, the only file that includes this):
// a few instructions of assembly on x86-64 (callee-saved registers, the stack pointer, MXCSR and the x87
// control word), ucontext elsewhere; and ThreadSanitizer's happens-before edges, made explicitly.
#pragma once

#include <stdint.h>

#if defined(__SANITIZE_THREAD__)
#define SIMT_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SIMT_TSAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define SIMT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SIMT_ASAN 1
#endif
#endif
#ifdef SIMT_TSAN
#include <sanitizer/tsan_interface.h>
#endif
#ifdef SIMT_ASAN
#include <sanitizer/common_interface_defs.h>
#endif
#if !defined(__x86_64__) || defined(SIMT_UCONTEXT)
#include <ucontext.h>
#endif

namespace simt {
namespace {

#if defined(__x86_64__) && !defined(SIMT_UCONTEXT)  // (-DSIMT_UCONTEXT: the portable switch, for a check)
struct Context {
  void* sp = nullptr;
};
extern "C" void simt_switch_context(void** save, void* load);
asm(R"(
.text
.globl simt_switch_context
.type simt_switch_context,@function
simt_switch_context:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size simt_switch_context, .-simt_switch_context
)");
void prepare(Context& context, char* bottom, size_t size, void (*entry)()) {
  auto* sp = reinterpret_cast<uint64_t*>(reinterpret_cast<uintptr_t>(bottom + size) & ~uintptr_t(15));
  *--sp = 0;                                   // entry's return address: entry never returns
  *--sp = reinterpret_cast<uint64_t>(entry);   // where the first switch's ret goes
  for (int r = 0; r < 6; ++r) *--sp = 0;       // rbp, rbx, r12-r15
  *--sp = 0x1F80ull | (0x037Full << 32);       // MXCSR and x87 control word: the defaults
  context.sp = sp;
}
// `to` is read before ThreadSanitizer is told of the switch, and `from` written by the assembly: neither is
// an access of one fiber to another's memory.
void* target(Context& to) { return to.sp; }
void switch_context(Context& from, void* to) { simt_switch_context(&from.sp, to); }
#else
struct Context {
  ucontext_t state;
};
void prepare(Context& context, char* bottom, size_t size, void (*entry)()) {
  getcontext(&context.state);
  context.state.uc_stack.ss_sp = bottom;
  context.state.uc_stack.ss_size = size;
  context.state.uc_link = nullptr;
  makecontext(&context.state, entry, 0);
}
void* target(Context& to) { return &to.state; }
void switch_context(Context& from, void* to) { swapcontext(&from.state, static_cast<ucontext_t*>(to)); }
#endif

void release(const void* address) {
#ifdef SIMT_TSAN
  __tsan_release(const_cast<void*>(address));
#endif
  (void)address;
}
void acquire(const void* address) {
#ifdef SIMT_TSAN
  __tsan_acquire(const_cast<void*>(address));
#endif
  (void)address;
}

}  // namespace
}  // namespace simt
