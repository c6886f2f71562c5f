// LabelSelector: a parsed Kubernetes label selector (k8s.io/apimachinery/pkg/labels), used by List
// and Watch to filter objects and by a ClusterCachedResource to choose what it replicates.
//
// A selector is an AND of requirements on an object's labels:
//
//   a=b, a==b        label a is present and equals b
//   a!=b             label a is absent, or does not equal b
//   a in (x,y)       label a is present and is one of x, y
//   a notin (x,y)    label a is absent, or is none of x, y
//   a                label a is present
//   !a               label a is absent
//   a>5, a<5         label a is present and is an integer greater (less) than 5
//
// The string syntax is k8s's, token for token: whitespace (' ', '\t', '\r', '\n') may separate
// tokens; "in" and "notin" are keywords only where an operator is expected; an empty value is
// allowed ("a=", "a in ()", "a in (,x)", "a in (x,,y)"; but, as in k8s, not ",," right before
// ')'); a trailing ',' is an error; the empty string selects everything. Keys must be qualified
// names and values label values (see validation.h); Gt/Lt values must also be 64-bit integers.
//
// Parse errors are absl::InvalidArgumentError with k8s's wording plus the byte offset (0-based) of
// the offending token, and no field path, so that the caller can prefix its own
// ("labelSelector: ..."):
//   unable to parse requirement: found 'y' at position 2, expected: in, notin, =, ==, !=, >, <
//   found end of string at position 4, expected: identifier after ','
//   unable to parse requirement: key at position 0: Invalid value: "Foo_": name part must ...
//   unable to parse requirement: values[0] at position 2: Invalid value: "b_": a valid label ...
//
// A LabelSelector is an immutable value: after construction nothing changes it, so const methods
// are safe to call from any number of threads at once. Copying is cheap enough for per-request use.
#ifndef SHARDCACHE_COMMON_LABEL_SELECTOR_H_
#define SHARDCACHE_COMMON_LABEL_SELECTOR_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/map.h"
#include "google/protobuf/struct.pb.h"
#include "shardcache/types/v1/types.pb.h"

namespace shardcache {

class LabelSelector {
 public:
  // Selects everything.
  LabelSelector() = default;

  // Parses the string form, e.g. "a=b,c==d,e!=f,g in (x,y),h notin (z),i,!j,k>3".
  static absl::StatusOr<LabelSelector> Parse(absl::string_view text);

  // Builds from a metav1.LabelSelector given as a JSON object:
  //   {"matchLabels": {"k": "v", ...},
  //    "matchExpressions": [{"key": "k", "operator": "In|NotIn|Exists|DoesNotExist",
  //                          "values": ["v", ...]}, ...]}
  // All given requirements must hold. An empty object selects everything; null members count as
  // absent. In and NotIn need at least one value, Exists and DoesNotExist none. Unknown fields are
  // rejected (a misspelt "matchLabel" must not silently select everything). Errors name the
  // sub-field, relative to the object: "matchExpressions[1].operator: Unsupported value: ...".
  // The JSON is read into a types::v1::LabelSelectorSpec by common/struct_codec.h (strict).
  static absl::StatusOr<LabelSelector> FromStruct(const google::protobuf::Struct& s);
  // The same from the typed form; error paths start with `path` ("spec.labelSelector").
  static absl::StatusOr<LabelSelector> FromSpec(const types::v1::LabelSelectorSpec& spec,
                                                absl::string_view path);

  // True if every requirement holds for `labels`.
  bool Matches(const google::protobuf::Map<std::string, std::string>& labels) const;
  bool Matches(const std::map<std::string, std::string>& labels) const;

  // True if the selector has no requirement: it selects everything.
  bool Empty() const { return requirements_.empty(); }

  // The canonical string form, as k8s prints it: requirements sorted by key (stable, so those of
  // one key keep their order), set values sorted and without duplicates, "a in (x,y)",
  // "a notin (x)", "!a". Parse(ToString()) gives an equal selector. Empty() gives "".
  std::string ToString() const;

 private:
  friend class LabelSelectorParser;

  enum class Operator {
    kEquals,
    kDoubleEquals,
    kNotEquals,
    kIn,
    kNotIn,
    kExists,
    kDoesNotExist,
    kGreaterThan,
    kLessThan,
  };

  struct Requirement {
    std::string key;
    Operator op = Operator::kExists;
    // Sorted, without duplicates. One value for the exact-match and Gt/Lt operators, at least one
    // for In/NotIn, none for Exists/DoesNotExist.
    std::vector<std::string> values;
    // For kGreaterThan / kLessThan: values[0] as an integer.
    int64_t bound = 0;

    bool Matches(const std::string* value) const;  // value: the label's, or null if absent
    std::string ToString() const;
  };

  explicit LabelSelector(std::vector<Requirement> requirements);

  template <typename LabelMap>
  bool MatchesImpl(const LabelMap& labels) const;

  // Sorted by key (stable).
  std::vector<Requirement> requirements_;
};

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_LABEL_SELECTOR_H_
