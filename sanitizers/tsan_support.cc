// What a -DSHARDCACHE_SANITIZE=thread build links into every program (through shardcache_common;
// see the top CMakeLists.txt and scripts/check.sh): ThreadSanitizer's default options, and the
// happens-before edges of abseil's synchronization.
//
// Default options: the suppressions in sanitizers/tsan.supp, no reports about accesses that
// uninstrumented libraries make through intercepted functions (memcpy, free, ...), and a stop at
// the first report. TSAN_OPTIONS adds to them or overrides them.
//
// Abseil: Debian's abseil (and the gRPC built on it) is not compiled with -fsanitize=thread, so
// TSan does not see absl::Mutex, absl::CondVar or absl::Notification synchronize anything, and it
// would report every access guarded by them as a race. This file defines those functions in the
// executable itself, where they interpose on the shared library's definitions (for our code and
// for gRPC's alike): each calls the library's own function, found with dlsym(RTLD_NEXT), and tells
// TSan the happens-before edge it makes (a lock acquires the mutex, an unlock releases it, a
// condition is evaluated inside the mutex, Notify releases what a waiter acquires).
//
// What it guarantees: no race is hidden that a TSan-built abseil would report, except that
// readers of a reader-writer lock are ordered among themselves here. TSan's lock-order and
// double-lock checks do not apply to these mutexes (abseil's own deadlock detection does).
// Thread-safe: every function may be called from any thread, as the functions it wraps.

#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/base/options.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace {

#define SHARDCACHE_STR2(x) #x
#define SHARDCACHE_STR(x) SHARDCACHE_STR2(x)

// The Itanium-mangled name of a member function in absl's inline namespace:
// "_ZN4absl" (or "_ZNK4absl" for a const one) + <ns> + rest.
std::string Mangled(const char* rest, bool is_const) {
  const std::string ns = SHARDCACHE_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  return std::string(is_const ? "_ZNK4absl" : "_ZN4absl") + std::to_string(ns.size()) + ns + rest;
}

// The shared library's definition of the function whose mangled name ends with `rest`.
template <typename F>
F Real(const char* rest, bool is_const = false) {
  const std::string name = Mangled(rest, is_const);
  void* f = dlsym(RTLD_NEXT, name.c_str());
  if (f == nullptr) {
    std::fprintf(stderr, "tsan_support: %s not found\n", name.c_str());
    std::abort();
  }
  return reinterpret_cast<F>(f);
}

void Acquire(const void* p) { __tsan_acquire(const_cast<void*>(p)); }
void Release(const void* p) { __tsan_release(const_cast<void*>(p)); }

// A condition that is evaluated inside the mutex: abseil evaluates a waiter's condition while
// holding the mutex, in the waiter's thread or in the one that unlocks, and may release the mutex
// again (inside the library) when the condition is false. The waiter builds the wrapper on its
// stack and hands it over inside the library: Wrap releases the wrapper's own fields, which Eval
// acquires before reading them on whichever thread evaluates it.
struct AcquiringCondition {
  const absl::Mutex* mu;
  const absl::Condition* cond;
  static bool Eval(void* arg) {
    auto* self = static_cast<AcquiringCondition*>(arg);
    Acquire(self);
    Acquire(self->mu);
    const bool r = self->cond->Eval();
    Release(self->mu);
    return r;
  }
  absl::Condition Wrap() {
    Release(this);
    return absl::Condition(&AcquiringCondition::Eval, this);
  }
};

}  // namespace

extern "C" const char* __tsan_default_options() {
  return "halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1:"
         "suppressions=" SHARDCACHE_TSAN_SUPPRESSIONS;
}

namespace absl {
ABSL_NAMESPACE_BEGIN

using MutexFn = void (*)(Mutex*);
using MutexBoolFn = bool (*)(Mutex*);
using MutexCondFn = void (*)(Mutex*, const Condition&);
using MutexCondBoolFn = bool (*)(Mutex*, const Condition&);
using MutexCondDurationFn = bool (*)(Mutex*, const Condition&, Duration);
using MutexCondTimeFn = bool (*)(Mutex*, const Condition&, Time);

void Mutex::Lock() {
  static const auto real = Real<MutexFn>("5Mutex4LockEv");
  real(this);
  Acquire(this);
}

void Mutex::ReaderLock() {
  static const auto real = Real<MutexFn>("5Mutex10ReaderLockEv");
  real(this);
  Acquire(this);
}

bool Mutex::TryLock() {
  static const auto real = Real<MutexBoolFn>("5Mutex7TryLockEv");
  const bool locked = real(this);
  if (locked) Acquire(this);
  return locked;
}

bool Mutex::ReaderTryLock() {
  static const auto real = Real<MutexBoolFn>("5Mutex13ReaderTryLockEv");
  const bool locked = real(this);
  if (locked) Acquire(this);
  return locked;
}

void Mutex::Unlock() {
  static const auto real = Real<MutexFn>("5Mutex6UnlockEv");
  Release(this);
  real(this);
}

void Mutex::ReaderUnlock() {
  static const auto real = Real<MutexFn>("5Mutex12ReaderUnlockEv");
  Release(this);
  real(this);
}

void Mutex::LockWhen(const Condition& cond) {
  static const auto real = Real<MutexCondFn>("5Mutex8LockWhenERKNS0_9ConditionE");
  AcquiringCondition c{this, &cond};
  real(this, c.Wrap());
  Acquire(this);
}

void Mutex::ReaderLockWhen(const Condition& cond) {
  static const auto real = Real<MutexCondFn>("5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  AcquiringCondition c{this, &cond};
  real(this, c.Wrap());
  Acquire(this);
}

bool Mutex::LockWhenWithTimeout(const Condition& cond, Duration timeout) {
  static const auto real =
      Real<MutexCondDurationFn>("5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  AcquiringCondition c{this, &cond};
  const bool r = real(this, c.Wrap(), timeout);
  Acquire(this);
  return r;
}

bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, Duration timeout) {
  static const auto real = Real<MutexCondDurationFn>(
      "5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  AcquiringCondition c{this, &cond};
  const bool r = real(this, c.Wrap(), timeout);
  Acquire(this);
  return r;
}

bool Mutex::LockWhenWithDeadline(const Condition& cond, Time deadline) {
  static const auto real =
      Real<MutexCondTimeFn>("5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  AcquiringCondition c{this, &cond};
  const bool r = real(this, c.Wrap(), deadline);
  Acquire(this);
  return r;
}

bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, Time deadline) {
  static const auto real =
      Real<MutexCondTimeFn>("5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  AcquiringCondition c{this, &cond};
  const bool r = real(this, c.Wrap(), deadline);
  Acquire(this);
  return r;
}

void Mutex::Await(const Condition& cond) {
  static const auto real = Real<MutexCondFn>("5Mutex5AwaitERKNS0_9ConditionE");
  AcquiringCondition c{this, &cond};
  Release(this);
  real(this, c.Wrap());
  Acquire(this);
}

bool Mutex::AwaitWithTimeout(const Condition& cond, Duration timeout) {
  static const auto real =
      Real<MutexCondDurationFn>("5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  AcquiringCondition c{this, &cond};
  Release(this);
  const bool r = real(this, c.Wrap(), timeout);
  Acquire(this);
  return r;
}

bool Mutex::AwaitWithDeadline(const Condition& cond, Time deadline) {
  static const auto real =
      Real<MutexCondTimeFn>("5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  AcquiringCondition c{this, &cond};
  Release(this);
  const bool r = real(this, c.Wrap(), deadline);
  Acquire(this);
  return r;
}

void CondVar::Wait(Mutex* mu) {
  static const auto real = Real<void (*)(CondVar*, Mutex*)>("7CondVar4WaitEPNS0_5MutexE");
  Release(mu);
  real(this, mu);
  Acquire(mu);
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  static const auto real = Real<bool (*)(CondVar*, Mutex*, Duration)>(
      "7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  Release(mu);
  const bool r = real(this, mu, timeout);
  Acquire(mu);
  return r;
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  static const auto real =
      Real<bool (*)(CondVar*, Mutex*, Time)>("7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  Release(mu);
  const bool r = real(this, mu, deadline);
  Acquire(mu);
  return r;
}

// HasBeenNotified() is inline: an instrumented atomic load of the flag, which follows
// Notification's mutex. Releasing on both the object and the flag orders it after Notify().
void Notification::Notify() {
  static const auto real = Real<void (*)(Notification*)>("12Notification6NotifyEv");
  Release(this);
  Release(&notified_yet_);
  real(this);
}

void Notification::WaitForNotification() const {
  static const auto real =
      Real<void (*)(const Notification*)>("12Notification19WaitForNotificationEv", true);
  real(this);
  Acquire(this);
}

bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  static const auto real = Real<bool (*)(const Notification*, Duration)>(
      "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE", true);
  const bool r = real(this, timeout);
  if (r) Acquire(this);
  return r;
}

bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  static const auto real = Real<bool (*)(const Notification*, Time)>(
      "12Notification31WaitForNotificationWithDeadlineENS0_4TimeE", true);
  const bool r = real(this, deadline);
  if (r) Acquire(this);
  return r;
}

ABSL_NAMESPACE_END
}  // namespace absl
