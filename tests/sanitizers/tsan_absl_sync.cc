// TSan annotations for Debian's absl synchronization library, linked only
// into TSan builds (TXL_SANITIZE=thread; tests/CMakeLists.txt).
//
// Why: libabsl_synchronization.so is not built with -fsanitize=thread, so
// absl::Mutex (a futex and atomics inside that library) is invisible to TSan,
// and every access guarded by one would be reported as a race. absl annotates
// its own Mutex for TSan only when absl itself is compiled with TSan.
//
// How: this file defines the public lock, unlock, await, condition-variable
// and notification members itself (only the outermost of nested calls is
// annotated). The dynamic linker resolves every call to
// them, from our code and from inside libabsl alike, to these definitions,
// which call the library's own (found with dlsym(RTLD_NEXT)) between TSan's
// mutex annotations (sanitizer/tsan_interface.h), as absl does when built
// with TSan. Nothing here changes what the lock does; it only tells TSan.
//
// Waits (Await, LockWhen, CondVar::Wait, ...) release the mutex inside the
// library: around them the mutex is annotated as unlocked, and TSan ignores
// the accesses the library makes meanwhile (conditions it evaluates).
//
// absl::Status has the same blind spot: copies share one heap record whose
// count the copies raise inline (seen) and the library lowers (unseen), so a
// status copied on one thread and freed by its last copy on another (a job's
// error handed to the caller) read as a race. The count is lowered here.
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

#if !defined(__SANITIZE_THREAD__) && defined(__has_feature)
#if !__has_feature(thread_sanitizer)
#error "tsan_absl_sync.cc belongs in TSan builds only"
#endif
#endif

namespace {

#define TXL_STR2(x) #x
#define TXL_STR(x) TXL_STR2(x)

// The library's symbol: "_ZN4absl" + <inline namespace> + rest of the mangled name.
void* Real(const char* rest, bool is_const = false) {
  const std::string ns = TXL_STR(ABSL_OPTION_INLINE_NAMESPACE_NAME);
  const std::string name = std::string(is_const ? "_ZNK4absl" : "_ZN4absl") + std::to_string(ns.size()) + ns + rest;
  void* fn = dlsym(RTLD_NEXT, name.c_str());
  if (fn == nullptr) {
    std::fprintf(stderr, "tsan_absl_sync: %s not found in libabsl (%s)\n", name.c_str(), dlerror());
    std::abort();
  }
  return fn;
}

template <typename Fn>
Fn RealFn(const char* rest, bool is_const = false) {
  return reinterpret_cast<Fn>(Real(rest, is_const));
}

constexpr unsigned kRead = __tsan_mutex_read_lock;
constexpr unsigned kTry = __tsan_mutex_try_lock;
constexpr unsigned kTryFailed = __tsan_mutex_try_lock_failed;

// Some members call others through the library's exported symbols (e.g.
// AwaitWithTimeout calls AwaitWithDeadline), which land here again: only the
// outermost call of a thread is annotated.
thread_local int t_depth = 0;

struct Nested {
  Nested() { ++t_depth; }
  ~Nested() { --t_depth; }
  Nested(const Nested&) = delete;
  Nested& operator=(const Nested&) = delete;
};

// The mutex, held on entry, is released inside the call and held again on return.
template <typename F>
auto Released(absl::Mutex* mu, unsigned flags, F&& f) {
  if (t_depth > 0) return f();
  Nested nested;
  __tsan_mutex_pre_unlock(mu, flags);
  auto r = f();
  __tsan_mutex_post_unlock(mu, flags);
  __tsan_mutex_pre_lock(mu, flags);
  __tsan_mutex_post_lock(mu, flags, 0);
  return r;
}

// The mutex, free on entry, is held on return.
template <typename F>
auto Acquired(absl::Mutex* mu, unsigned flags, F&& f) {
  if (t_depth > 0) return f();
  Nested nested;
  __tsan_mutex_pre_lock(mu, flags);
  auto r = f();
  __tsan_mutex_post_lock(mu, flags, 0);
  return r;
}

// The mutex, held on entry, is free on return.
template <typename F>
void Unlocked(absl::Mutex* mu, unsigned flags, F&& f) {
  if (t_depth > 0) return f();
  Nested nested;
  __tsan_mutex_pre_unlock(mu, flags);
  f();
  __tsan_mutex_post_unlock(mu, flags);
}

// A try-lock: held on return when it says so.
template <typename F>
bool Tried(absl::Mutex* mu, unsigned flags, F&& f) {
  if (t_depth > 0) return f();
  Nested nested;
  __tsan_mutex_pre_lock(mu, flags | kTry);
  const bool ok = f();
  __tsan_mutex_post_lock(mu, flags | kTry | (ok ? 0 : kTryFailed), 0);
  return ok;
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

using Cond = const Condition&;

// A mutex's address may be reused by another one (stack, or memory TSan does
// not see freed): forget its state.
Mutex::~Mutex() {
  static auto real = RealFn<void (*)(Mutex*)>("5MutexD2Ev");
  __tsan_mutex_destroy(this, 0);
  real(this);
}

void Mutex::Lock() {
  static auto real = RealFn<void (*)(Mutex*)>("5Mutex4LockEv");
  Acquired(this, 0, [&] {
    real(this);
    return 0;
  });
}

void Mutex::ReaderLock() {
  static auto real = RealFn<void (*)(Mutex*)>("5Mutex10ReaderLockEv");
  Acquired(this, kRead, [&] {
    real(this);
    return 0;
  });
}

bool Mutex::TryLock() {
  static auto real = RealFn<bool (*)(Mutex*)>("5Mutex7TryLockEv");
  return Tried(this, 0, [&] { return real(this); });
}

bool Mutex::ReaderTryLock() {
  static auto real = RealFn<bool (*)(Mutex*)>("5Mutex13ReaderTryLockEv");
  return Tried(this, kRead, [&] { return real(this); });
}

void Mutex::Unlock() {
  static auto real = RealFn<void (*)(Mutex*)>("5Mutex6UnlockEv");
  Unlocked(this, 0, [&] { real(this); });
}

void Mutex::ReaderUnlock() {
  static auto real = RealFn<void (*)(Mutex*)>("5Mutex12ReaderUnlockEv");
  Unlocked(this, kRead, [&] { real(this); });
}

void Mutex::Await(Cond cond) {
  static auto real = RealFn<void (*)(Mutex*, Cond)>("5Mutex5AwaitERKNS0_9ConditionE");
  Released(this, 0, [&] {
    real(this, cond);
    return 0;
  });
}

bool Mutex::AwaitWithTimeout(Cond cond, Duration timeout) {
  static auto real =
      RealFn<bool (*)(Mutex*, Cond, Duration)>("5Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Released(this, 0, [&] { return real(this, cond, timeout); });
}

bool Mutex::AwaitWithDeadline(Cond cond, Time deadline) {
  static auto real = RealFn<bool (*)(Mutex*, Cond, Time)>("5Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Released(this, 0, [&] { return real(this, cond, deadline); });
}

void Mutex::LockWhen(Cond cond) {
  static auto real = RealFn<void (*)(Mutex*, Cond)>("5Mutex8LockWhenERKNS0_9ConditionE");
  Acquired(this, 0, [&] {
    real(this, cond);
    return 0;
  });
}

void Mutex::ReaderLockWhen(Cond cond) {
  static auto real = RealFn<void (*)(Mutex*, Cond)>("5Mutex14ReaderLockWhenERKNS0_9ConditionE");
  Acquired(this, kRead, [&] {
    real(this, cond);
    return 0;
  });
}

bool Mutex::LockWhenWithTimeout(Cond cond, Duration timeout) {
  static auto real =
      RealFn<bool (*)(Mutex*, Cond, Duration)>("5Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Acquired(this, 0, [&] { return real(this, cond, timeout); });
}

bool Mutex::LockWhenWithDeadline(Cond cond, Time deadline) {
  static auto real = RealFn<bool (*)(Mutex*, Cond, Time)>("5Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Acquired(this, 0, [&] { return real(this, cond, deadline); });
}

bool Mutex::ReaderLockWhenWithTimeout(Cond cond, Duration timeout) {
  static auto real =
      RealFn<bool (*)(Mutex*, Cond, Duration)>("5Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  return Acquired(this, kRead, [&] { return real(this, cond, timeout); });
}

bool Mutex::ReaderLockWhenWithDeadline(Cond cond, Time deadline) {
  static auto real =
      RealFn<bool (*)(Mutex*, Cond, Time)>("5Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  return Acquired(this, kRead, [&] { return real(this, cond, deadline); });
}

// A CondVar wait releases the mutex (held in write mode) and takes it again.
void CondVar::Wait(Mutex* mu) {
  static auto real = RealFn<void (*)(CondVar*, Mutex*)>("7CondVar4WaitEPNS0_5MutexE");
  Released(mu, 0, [&] {
    real(this, mu);
    return 0;
  });
}

bool CondVar::WaitWithTimeout(Mutex* mu, Duration timeout) {
  static auto real =
      RealFn<bool (*)(CondVar*, Mutex*, Duration)>("7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  return Released(mu, 0, [&] { return real(this, mu, timeout); });
}

bool CondVar::WaitWithDeadline(Mutex* mu, Time deadline) {
  static auto real = RealFn<bool (*)(CondVar*, Mutex*, Time)>("7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  return Released(mu, 0, [&] { return real(this, mu, deadline); });
}

// Notification: Notify happens before every wait that sees it. (Its mutex is
// annotated too when the library calls the members above; this also covers a
// wait that returns on the flag alone.)
void Notification::Notify() {
  static auto real = RealFn<void (*)(Notification*)>("12Notification6NotifyEv");
  __tsan_release(this);
  real(this);
}

void Notification::WaitForNotification() const {
  static auto real = RealFn<void (*)(const Notification*)>("12Notification19WaitForNotificationEv", true);
  real(this);
  __tsan_acquire(const_cast<Notification*>(this));
}

bool Notification::WaitForNotificationWithTimeout(Duration timeout) const {
  static auto real = RealFn<bool (*)(const Notification*, Duration)>(
      "12Notification30WaitForNotificationWithTimeoutENS0_8DurationE", true);
  const bool notified = real(this, timeout);
  if (notified) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(Time deadline) const {
  static auto real =
      RealFn<bool (*)(const Notification*, Time)>("12Notification31WaitForNotificationWithDeadlineENS0_4TimeE", true);
  const bool notified = real(this, deadline);
  if (notified) __tsan_acquire(const_cast<Notification*>(this));
  return notified;
}

// The count is lowered here, with the library's own orders, where TSan sees
// it; the library frees the record when this drop was the last.
void Status::UnrefNonInlined(uintptr_t rep) {
  static auto real = RealFn<void (*)(uintptr_t)>("6Status15UnrefNonInlinedEm");
  auto& count = reinterpret_cast<status_internal::StatusRep*>(rep - 1)->ref;
  if (count.load(std::memory_order_acquire) != 1) {
    if (count.fetch_sub(1, std::memory_order_acq_rel) != 1) return;  // other copies remain
    count.store(1, std::memory_order_relaxed);                       // the last: the library frees a record counted 1
  }
  real(rep);
}

ABSL_NAMESPACE_END
}  // namespace absl
