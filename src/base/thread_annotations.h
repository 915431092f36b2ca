// DSI_GUARDED_BY and friends: Clang's thread-safety attributes under project names
// (STYLE 7: "Locks carry GUARDED_BY; build with clang's -Wthread-safety in CI").
// Other compilers see nothing. The analysis understands dsi::Mutex / dsi::MutexLock
// (base/mutex.h), not std::mutex, so annotated classes use those.
//
//   DSI_GUARDED_BY(mu)       a member read or written only with mu held
//   DSI_PT_GUARDED_BY(mu)    the pointee of a pointer member, likewise
//   DSI_REQUIRES(mu)         the caller holds mu
//   DSI_EXCLUDES(mu)         the caller does not hold mu (the function takes it)
//   DSI_ACQUIRE / RELEASE    the function takes / gives back the capability
//   DSI_NO_THREAD_SAFETY_ANALYSIS   opt one function out (say why beside it)
//
// Thread model: macros only.
#pragma once

#if defined(__clang__)
#define DSI_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define DSI_THREAD_ANNOTATION(x)
#endif

#define DSI_CAPABILITY(x) DSI_THREAD_ANNOTATION(capability(x))
#define DSI_SCOPED_CAPABILITY DSI_THREAD_ANNOTATION(scoped_lockable)
#define DSI_GUARDED_BY(x) DSI_THREAD_ANNOTATION(guarded_by(x))
#define DSI_PT_GUARDED_BY(x) DSI_THREAD_ANNOTATION(pt_guarded_by(x))
#define DSI_ACQUIRED_BEFORE(...) DSI_THREAD_ANNOTATION(acquired_before(__VA_ARGS__))
#define DSI_ACQUIRED_AFTER(...) DSI_THREAD_ANNOTATION(acquired_after(__VA_ARGS__))
#define DSI_REQUIRES(...) DSI_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define DSI_REQUIRES_SHARED(...) DSI_THREAD_ANNOTATION(requires_shared_capability(__VA_ARGS__))
#define DSI_ACQUIRE(...) DSI_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define DSI_ACQUIRE_SHARED(...) DSI_THREAD_ANNOTATION(acquire_shared_capability(__VA_ARGS__))
#define DSI_RELEASE(...) DSI_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define DSI_RELEASE_SHARED(...) DSI_THREAD_ANNOTATION(release_shared_capability(__VA_ARGS__))
#define DSI_TRY_ACQUIRE(...) DSI_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define DSI_EXCLUDES(...) DSI_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define DSI_ASSERT_CAPABILITY(x) DSI_THREAD_ANNOTATION(assert_capability(x))
#define DSI_RETURN_CAPABILITY(x) DSI_THREAD_ANNOTATION(lock_returned(x))
#define DSI_NO_THREAD_SAFETY_ANALYSIS DSI_THREAD_ANNOTATION(no_thread_safety_analysis)
