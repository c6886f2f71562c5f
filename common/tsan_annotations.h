// TsanRelease / TsanAcquire: tell ThreadSanitizer about a hand-over between threads that it
// cannot see, because the library that orders it is not built with ThreadSanitizer (Debian's
// gRPC: an operation started on one thread completes on another, ordered by gRPC's core).
//
//   TsanRelease(op);    // on the thread that starts the operation, after its last write to op
//   StartOperation(op);
//   ...
//   TsanAcquire(op);    // first thing on the thread where the operation completes
//
// Without ThreadSanitizer both are empty inline functions. Thread-safe.
#ifndef SHARDCACHE_COMMON_TSAN_ANNOTATIONS_H_
#define SHARDCACHE_COMMON_TSAN_ANNOTATIONS_H_

#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SHARDCACHE_TSAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define SHARDCACHE_TSAN 1
#endif
#ifdef SHARDCACHE_TSAN
#include <sanitizer/tsan_interface.h>
#endif

namespace shardcache {

// Everything this thread wrote before is visible to a thread that then calls TsanAcquire(addr).
inline void TsanRelease(void* addr) {
#ifdef SHARDCACHE_TSAN
  __tsan_release(addr);
#else
  (void)addr;
#endif
}

// Everything written before a TsanRelease(addr) on another thread is visible to this thread.
inline void TsanAcquire(void* addr) {
#ifdef SHARDCACHE_TSAN
  __tsan_acquire(addr);
#else
  (void)addr;
#endif
}

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_TSAN_ANNOTATIONS_H_
