// Crash safety of cache_server: an acknowledged write survives SIGKILL.
//
// Each round, writer threads (unary Create/Update/Delete, and pipelined Write streams with
// create/upsert/delete) write to keys of their own while the server is killed with SIGKILL at a
// random moment. The server is restarted on the same data directory, and the test checks that
// every acknowledged write is there (or superseded only by a later write of the same writer that
// was in flight when the server died), that the revision did not go back, and that a new write
// gets a revision above every acknowledged one. The next round writes on top of that state.
//
// The rounds' kill moments and the writers' choices come from one seed, printed at the start;
// SHARDCACHE_CRASH_SEED=<seed> runs a round sequence again (the interleaving of threads differs).

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/testing/server_process.h"
#include "integration_tests/store_fixture.h"

namespace shardcache::testing {
namespace {

// At least kMinRounds rounds; more, up to kMaxRounds, while the time budget lasts.
constexpr int kMinRounds = 10;
constexpr int kMaxRounds = 30;
constexpr absl::Duration kBudget = absl::Seconds(40);
constexpr int kUnaryWriters = 4;
constexpr int kStreamWriters = 2;
constexpr int kKeysPerWriter = 8;
// The longest a Write stream batch pipelines.
constexpr int kMaxPipelined = 16;
constexpr absl::Duration kRpcTimeout = absl::Seconds(10);
constexpr absl::Duration kMinKillDelay = absl::Milliseconds(50);
constexpr absl::Duration kMaxKillDelay = absl::Milliseconds(600);
constexpr char kCluster[] = "crash";
constexpr char kNamespace[] = "ns";

v1::GroupVersionResource Items() { return Gvr("crash.example.com", "v1", "items"); }
// Where the test's own probe writes go, apart from the writers' keys.
v1::GroupVersionResource Probes() { return Gvr("crash.example.com", "v1", "probes"); }

int64_t ParseRv(const std::string& text) {
  int64_t rv = 0;
  return absl::SimpleAtoi(text, &rv) ? rv : -1;
}

// An object of Items() named `name` whose spec is {"v": value}.
v1::Object Item(const std::string& name, const std::string& value) {
  v1::Object o;
  o.mutable_metadata()->set_cluster(kCluster);
  o.mutable_metadata()->set_namespace_(kNamespace);
  o.mutable_metadata()->set_name(name);
  (*o.mutable_spec()->mutable_fields())["v"].set_string_value(value);
  return o;
}

std::string ValueOf(const v1::Object& o) {
  auto it = o.spec().fields().find("v");
  return it == o.spec().fields().end() ? "<no spec.v>" : it->second.string_value();
}

// The state of one key as the store holds it.
struct KeyState {
  bool present = false;
  std::string value;  // spec.v, when present
  int64_t rv = 0;     // its resourceVersion, when present
};

std::string Describe(const KeyState& s) {
  return s.present ? absl::StrCat("present v=", s.value, " rv=", s.rv) : "absent";
}

// One write a writer sent (or tried to send). Writes of one writer to one key are applied in the
// order they were sent; each `value` is unique, so a stored value names the write that stored it.
struct Op {
  enum Kind { kCreate, kUpdate, kUpsert, kDelete };
  Kind kind = kCreate;
  std::string value;   // spec.v written (puts only)
  bool acked = false;  // the server answered OK
  int64_t rv = 0;      // the resourceVersion it answered with
};

const char* KindName(Op::Kind k) {
  switch (k) {
    case Op::kCreate:
      return "create";
    case Op::kUpdate:
      return "update";
    case Op::kUpsert:
      return "upsert";
    case Op::kDelete:
      return "delete";
  }
  return "?";
}

// What happened to one key in one round.
struct KeyLog {
  KeyState base;        // as verified when the round started
  std::vector<Op> ops;  // in the order they were sent
  // The key's state after all ops, as the writer predicts it to choose valid writes.
  bool PredictedPresent() const {
    return ops.empty() ? base.present : ops.back().kind != Op::kDelete;
  }
};

// One writer thread of one round. Its keys are its own, so the expected state of each key is
// well defined. Everything here is touched only by the writer's thread until it is joined.
class Writer {
 public:
  Writer(std::string id, bool stream, int round, uint64_t seed,
         const std::map<std::string, KeyState>& states)
      : id_(std::move(id)), stream_(stream), round_(round), rng_(seed) {
    for (int k = 0; k < kKeysPerWriter; ++k) {
      std::string key = absl::StrCat(id_, "-k", k);
      auto it = states.find(key);
      logs_[key].base = it == states.end() ? KeyState() : it->second;
      keys_.push_back(key);
    }
  }

  // Writes until a call fails (the server was killed). `killed` is set just before the kill:
  // a failure before it is unexpected.
  void Run(v1::Store::Stub* stub, const std::atomic<bool>* killed) {
    if (stream_) {
      RunStream(stub, killed);
    } else {
      RunUnary(stub, killed);
    }
  }

  const std::map<std::string, KeyLog>& logs() const { return logs_; }
  const std::vector<std::string>& unexpected() const { return unexpected_; }
  int acked() const { return acked_; }
  int sent() const { return sent_; }

 private:
  std::string NextValue() { return absl::StrCat(id_, "-r", round_, "-", seq_++); }
  const std::string& PickKey() { return keys_[rng_() % keys_.size()]; }

  void Unexpected(const std::atomic<bool>* killed, const std::string& what) {
    if (!killed->load()) unexpected_.push_back(absl::StrCat(id_, ": ", what));
  }

  void RunUnary(v1::Store::Stub* stub, const std::atomic<bool>* killed) {
    while (true) {
      const std::string& key = PickKey();
      KeyLog& log = logs_[key];
      Op op;
      if (!log.PredictedPresent()) {
        op.kind = Op::kCreate;
      } else {
        op.kind = rng_() % 10 < 6 ? Op::kUpdate : Op::kDelete;
      }
      if (op.kind != Op::kDelete) op.value = NextValue();
      log.ops.push_back(op);
      ++sent_;
      grpc::Status s;
      int64_t rv = -1;
      switch (op.kind) {
        case Op::kCreate: {
          v1::CreateRequest req;
          *req.mutable_resource() = Items();
          *req.mutable_object() = Item(key, op.value);
          v1::Object out;
          s = stub->Create(FailFastContext(kRpcTimeout).get(), req, &out);
          rv = ParseRv(out.metadata().resource_version());
          break;
        }
        case Op::kUpdate: {
          v1::UpdateRequest req;
          *req.mutable_resource() = Items();
          *req.mutable_object() = Item(key, op.value);
          v1::Object out;
          s = stub->Update(FailFastContext(kRpcTimeout).get(), req, &out);
          rv = ParseRv(out.metadata().resource_version());
          break;
        }
        case Op::kDelete: {
          v1::DeleteRequest req;
          *req.mutable_resource() = Items();
          req.set_cluster(kCluster);
          req.set_namespace_(kNamespace);
          req.set_name(key);
          v1::DeleteResponse out;
          s = stub->Delete(FailFastContext(kRpcTimeout).get(), req, &out);
          rv = ParseRv(out.object().metadata().resource_version());
          if (s.ok() && !out.deleted()) s = grpc::Status(grpc::StatusCode::INTERNAL, "not deleted");
          break;
        }
        case Op::kUpsert:
          break;
      }
      if (!s.ok()) {
        // In flight when the server died: it may or may not have been applied.
        Unexpected(killed, absl::StrCat(KindName(op.kind), " ", key, ": ", s.error_code(), " ",
                                        s.error_message()));
        return;
      }
      log.ops.back().acked = true;
      log.ops.back().rv = rv;
      ++acked_;
    }
  }

  void RunStream(v1::Store::Stub* stub, const std::atomic<bool>* killed) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    auto rw = stub->Write(&ctx);
    int64_t next_id = 1;
    bool broken = false;
    bool stream_failed = false;
    while (!broken) {
      // A batch of pipelined writes, then their answers, in order.
      struct Sent {
        std::string key;
        size_t op;
        int64_t id;
      };
      std::vector<Sent> sent;
      int n = 1 + static_cast<int>(rng_() % kMaxPipelined);
      for (int i = 0; i < n; ++i) {
        const std::string& key = PickKey();
        KeyLog& log = logs_[key];
        Op op;
        if (!log.PredictedPresent()) {
          op.kind = rng_() % 2 == 0 ? Op::kCreate : Op::kUpsert;
        } else {
          op.kind = rng_() % 10 < 6 ? Op::kUpsert : Op::kDelete;
        }
        v1::WriteRequest req;
        req.set_id(next_id++);
        if (op.kind == Op::kDelete) {
          v1::DeleteRequest& d = *req.mutable_delete_();
          *d.mutable_resource() = Items();
          d.set_cluster(kCluster);
          d.set_namespace_(kNamespace);
          d.set_name(key);
        } else {
          op.value = NextValue();
          if (op.kind == Op::kCreate) {
            *req.mutable_create()->mutable_resource() = Items();
            *req.mutable_create()->mutable_object() = Item(key, op.value);
          } else {
            *req.mutable_upsert()->mutable_resource() = Items();
            *req.mutable_upsert()->mutable_object() = Item(key, op.value);
          }
        }
        log.ops.push_back(op);
        ++sent_;
        if (!rw->Write(req)) {
          broken = stream_failed = true;
          break;
        }
        sent.push_back(Sent{key, log.ops.size() - 1, req.id()});
      }
      for (const Sent& s : sent) {
        v1::WriteResponse answer;
        if (!rw->Read(&answer)) {
          broken = stream_failed = true;
          break;
        }
        Op& op = logs_[s.key].ops[s.op];
        if (answer.id() != s.id) {
          unexpected_.push_back(
              absl::StrCat(id_, ": answer for id ", answer.id(), " where id ", s.id, " was due"));
          broken = true;
          break;
        }
        if (answer.code() != 0) {
          // The model of the key no longer holds: stop writing.
          Unexpected(killed, absl::StrCat(KindName(op.kind), " ", s.key, ": code ", answer.code(),
                                          " ", answer.message()));
          broken = true;
          break;
        }
        if (op.kind == Op::kDelete && !answer.deleted()) {
          unexpected_.push_back(absl::StrCat(id_, ": delete ", s.key, " answered not deleted"));
        }
        op.acked = true;
        op.rv = ParseRv(answer.object().metadata().resource_version());
        ++acked_;
      }
    }
    ctx.TryCancel();
    grpc::Status s = rw->Finish();
    if (stream_failed) {  // rather than stopped by this writer after an unexpected answer
      Unexpected(killed, absl::StrCat("stream ended: ", s.error_code(), " ", s.error_message()));
    }
  }

  const std::string id_;
  const bool stream_;
  const int round_;
  std::mt19937_64 rng_;
  std::vector<std::string> keys_;
  std::map<std::string, KeyLog> logs_;
  std::vector<std::string> unexpected_;
  int64_t seq_ = 0;
  int acked_ = 0;
  int sent_ = 0;
};

// The key's state after op `i` (-1: the state the round started from).
KeyState StateAfter(const KeyLog& log, int i) {
  if (i < 0) return log.base;
  const Op& op = log.ops[i];
  KeyState s;
  if (op.kind != Op::kDelete) {
    s.present = true;
    s.value = op.value;
  }
  s.rv = op.rv;
  return s;
}

// The key's writes from a few before `last_acked` on (all of them could be thousands).
std::string History(const KeyLog& log, int last_acked) {
  std::string out = absl::StrCat("round start: ", Describe(log.base));
  size_t from = static_cast<size_t>(std::max(0, last_acked - 3));
  if (from > 0) absl::StrAppend(&out, "; ... ", from, " earlier writes");
  for (size_t i = from; i < log.ops.size(); ++i) {
    const Op& op = log.ops[i];
    absl::StrAppend(&out, "; ", KindName(op.kind), op.value.empty() ? "" : " v=", op.value,
                    op.acked ? absl::StrCat(" acked rv=", op.rv) : " (not acknowledged)");
  }
  return out;
}

// Checks one key against what its writer did: the last acknowledged write (or the round's start
// state, when none) or a later, unacknowledged one must be what the store holds. Returns true
// when it holds a later, unacknowledged one.
bool VerifyKey(const std::string& key, const KeyLog& log, const v1::Object* stored,
               int64_t list_rv) {
  int last_acked = -1;
  for (size_t i = 0; i < log.ops.size(); ++i) {
    if (log.ops[i].acked) last_acked = static_cast<int>(i);
  }
  const KeyState acked = StateAfter(log, last_acked);
  const std::string context = absl::StrCat("key ", key, ": ", History(log, last_acked));
  if (stored == nullptr) {
    for (int j = last_acked; j < static_cast<int>(log.ops.size()); ++j) {
      if (!StateAfter(log, j).present) return j > last_acked;
    }
    ADD_FAILURE() << "LOST WRITE: key " << key << " is absent after the restart, but its last "
                  << "acknowledged state is " << Describe(acked)
                  << " and no later write deleted it.\n  " << context;
    return false;
  }
  const std::string value = ValueOf(*stored);
  const int64_t rv = ParseRv(stored->metadata().resource_version());
  EXPECT_LE(rv, list_rv) << "key " << key << " is newer than the store's revision";
  for (int j = last_acked; j < static_cast<int>(log.ops.size()); ++j) {
    KeyState s = StateAfter(log, j);
    if (!s.present || s.value != value) continue;
    if (j == last_acked) {
      EXPECT_EQ(rv, acked.rv) << "key " << key << " holds its last acknowledged value with another "
                              << "resourceVersion.\n  " << context;
    } else {
      EXPECT_GT(rv, acked.rv) << "key " << key << " holds a later write's value with a "
                              << "resourceVersion not above the acknowledged one.\n  " << context;
    }
    return j > last_acked;
  }
  ADD_FAILURE() << "LOST WRITE: key " << key << " holds v=" << value << " rv=" << rv
                << " after the restart, which is neither its last acknowledged state ("
                << Describe(acked) << ") nor a later write in flight.\n  " << context;
  return false;
}

uint64_t Seed() {
  const char* env = std::getenv("SHARDCACHE_CRASH_SEED");
  uint64_t seed = 0;
  if (env != nullptr && absl::SimpleAtoi(env, &seed)) return seed;
  return static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
}

std::unique_ptr<v1::Store::Stub> Connect(const ServerProcess& server) {
  return v1::Store::NewStub(
      grpc::CreateChannel(server.grpc_address(), grpc::InsecureChannelCredentials()));
}

TEST(CrashTest, SigkillAtRandomMoments_LosesNoAcknowledgedWriteAndRevisionNeverGoesBack) {
  const uint64_t seed = Seed();
  std::cout << "[ CRASH    ] seed " << seed << " (rerun with SHARDCACHE_CRASH_SEED=" << seed << ")"
            << std::endl;
  RecordProperty("seed", std::to_string(seed));
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  std::mt19937_64 rng(seed);
  const absl::Time start = absl::Now();

  ServerProcess server(BinaryPath("cache_server/cache_server"), {"--role=cache"});
  absl::Status started = server.Start();
  ASSERT_TRUE(started.ok()) << started;
  std::unique_ptr<v1::Store::Stub> stub = Connect(server);

  std::map<std::string, KeyState> states;  // every key, as last verified
  int64_t highest = 1;                     // the highest revision acknowledged or listed so far
  int total_acked = 0;
  int rounds = 0;
  int in_flight_applied = 0;  // keys found holding a write that was never acknowledged
  for (int round = 0; round < kMaxRounds && (round < kMinRounds || absl::Now() - start < kBudget);
       ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    const absl::Duration delay =
        kMinKillDelay +
        absl::Milliseconds(rng() % (absl::ToInt64Milliseconds(kMaxKillDelay - kMinKillDelay) + 1));
    std::vector<std::unique_ptr<Writer>> writers;
    for (int w = 0; w < kUnaryWriters + kStreamWriters; ++w) {
      bool stream = w >= kUnaryWriters;
      writers.push_back(std::make_unique<Writer>(absl::StrCat(stream ? "s" : "u", w), stream, round,
                                                 rng(), states));
    }

    // Write, and kill the server in the middle of it.
    std::atomic<bool> killed{false};
    std::vector<std::thread> threads;
    for (auto& w : writers) {
      threads.emplace_back([&w, &stub, &killed] { w->Run(stub.get(), &killed); });
    }
    absl::SleepFor(delay);  // the random moment of the crash
    killed = true;
    server.Signal(SIGKILL);
    int status = server.Wait(absl::Seconds(10));
    for (auto& t : threads) t.join();
    ASSERT_TRUE(status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        << "the server did not die of the SIGKILL (wait status " << status << ")";

    int acked = 0, sent = 0;
    int64_t highest_acked = 0;
    for (const auto& w : writers) {
      acked += w->acked();
      sent += w->sent();
      for (const std::string& u : w->unexpected()) ADD_FAILURE() << "before the kill: " << u;
      for (const auto& [key, log] : w->logs()) {
        for (const Op& op : log.ops) {
          if (op.acked) highest_acked = std::max(highest_acked, op.rv);
        }
      }
    }
    total_acked += acked;
    std::cout << "[ CRASH    ] round " << round << ": killed after " << delay << ": " << sent
              << " writes sent, " << acked << " acknowledged, highest acknowledged revision "
              << highest_acked << std::endl;

    // Restart on the same data and check every key.
    started = server.Start();
    ASSERT_TRUE(started.ok()) << "restart after SIGKILL: " << started;
    stub = Connect(server);
    v1::ListRequest list;
    *list.mutable_resource() = Items();
    v1::ListResponse listed;
    grpc::Status s = stub->List(Context(kRpcTimeout).get(), list, &listed);
    ASSERT_TRUE(s.ok()) << s.error_message();
    const int64_t list_rv = ParseRv(listed.resource_version());
    EXPECT_GE(list_rv, highest_acked) << "the store's revision went back below an acknowledged "
                                      << "write's";
    EXPECT_GE(list_rv, highest) << "the store's revision went back";
    std::map<std::string, const v1::Object*> stored;
    for (const v1::Object& o : listed.items()) stored[o.metadata().name()] = &o;
    std::map<std::string, KeyState> next_states;
    for (const auto& w : writers) {
      for (const auto& [key, log] : w->logs()) {
        auto it = stored.find(key);
        const v1::Object* obj = it == stored.end() ? nullptr : it->second;
        if (VerifyKey(key, log, obj, list_rv)) ++in_flight_applied;
        if (obj != nullptr) {
          next_states[key] =
              KeyState{true, ValueOf(*obj), ParseRv(obj->metadata().resource_version())};
          stored.erase(it);
        }
      }
    }
    for (const auto& [name, obj] : stored) {
      ADD_FAILURE() << "an object no writer wrote: " << name;
    }
    if (HasFailure()) {
      std::cout << "[ CRASH    ] FAILED in round " << round << " of seed " << seed << std::endl;
      return;
    }
    states = std::move(next_states);

    // The counter never goes back: a new write goes above everything seen so far.
    v1::CreateRequest probe;
    *probe.mutable_resource() = Probes();
    *probe.mutable_object() = Item(absl::StrCat("probe-", round), "probe");
    v1::Object out;
    s = stub->Create(Context(kRpcTimeout).get(), probe, &out);
    ASSERT_TRUE(s.ok()) << s.error_message();
    const int64_t probe_rv = ParseRv(out.metadata().resource_version());
    EXPECT_GT(probe_rv, highest_acked) << "a new write's revision is not above an acknowledged one";
    EXPECT_GT(probe_rv, list_rv) << "a new write's revision is not above the store's";
    EXPECT_GT(probe_rv, highest) << "the revision counter went back";
    highest = std::max({highest, list_rv, probe_rv});
    ++rounds;
  }
  std::cout << "[ CRASH    ] " << rounds << " rounds, " << total_acked
            << " acknowledged writes checked (" << in_flight_applied
            << " keys held a write that was in flight), in " << (absl::Now() - start) << std::endl;
  EXPECT_GE(rounds, kMinRounds);
  EXPECT_GT(total_acked, rounds * 10) << "too few writes were acknowledged to test anything";
  stub.reset();  // an open connection would hold up the server's drain
  int status = server.Stop();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "wait status " << status;
  // Kept for a look when the test failed; else removed (RocksDB preallocates tens of megabytes).
  if (!HasFailure()) std::filesystem::remove_all(server.data_dir());
}

}  // namespace
}  // namespace shardcache::testing
