// Small helpers for absl::Status control flow (abseil 20220623 ships none).
//
//   RETURN_IF_ERROR(expr);            returns expr's status from the enclosing function if not OK.
//   ASSIGN_OR_RETURN(lhs, expr);      evaluates an absl::StatusOr; returns its status if not OK,
//                                     else assigns (moves) its value to lhs (which may declare).
#ifndef SHARDCACHE_COMMON_STATUS_MACROS_H_
#define SHARDCACHE_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define SHARDCACHE_CONCAT_INNER(a, b) a##b
#define SHARDCACHE_CONCAT(a, b) SHARDCACHE_CONCAT_INNER(a, b)

#define RETURN_IF_ERROR(expr)                               \
  do {                                                      \
    if (::absl::Status _st = (expr); !_st.ok()) return _st; \
  } while (0)

#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL(SHARDCACHE_CONCAT(_status_or_, __LINE__), lhs, expr)

#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.ok()) return tmp.status();         \
  lhs = std::move(tmp).value()

#endif  // SHARDCACHE_COMMON_STATUS_MACROS_H_
