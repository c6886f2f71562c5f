// Waiting for SIGTERM / SIGINT without async-signal-unsafe handlers.
//
// BlockTerminationSignals() must be called in main before any thread is created, so that every
// thread inherits the blocked mask; WaitForTerminationSignal() then returns the signal number
// once one arrives (it uses sigwait). Call it from one thread only.
#ifndef SHARDCACHE_COMMON_SIGNALS_H_
#define SHARDCACHE_COMMON_SIGNALS_H_

namespace shardcache {

void BlockTerminationSignals();
int WaitForTerminationSignal();

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_SIGNALS_H_
