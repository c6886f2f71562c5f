// Kubernetes-style validation of names, labels, annotations, finalizers and resource names, as in
// k8s.io/apimachinery/pkg/util/validation and .../api/validation.
//
// Every Validate* function returns absl::OkStatus() or an absl::InvalidArgumentError whose message
// begins with the field path it was given, in the words of k8s's field errors:
//
//   metadata.name: Invalid value: "Foo_": a lowercase RFC 1123 subdomain must consist of lower
//   case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric
//   character (e.g. 'example.com')
//
// An empty path gives the same message without the "path: " prefix. When one value breaks several
// rules, their explanations are joined with "; " (as k8s's label key validation does); when several
// fields are wrong, the first one is reported (map keys in sorted order, so the result is
// deterministic). Quoted values are escaped to printable ASCII and cut after 512 bytes, so that a
// message is always a valid, bounded gRPC status message.
//
// The Is* predicates answer the same questions without building a message.
//
// Thread-safety: every function here is pure (no state): safe to call from any thread.
#ifndef SHARDCACHE_COMMON_VALIDATION_H_
#define SHARDCACHE_COMMON_VALIDATION_H_

#include <cstddef>
#include <initializer_list>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/map.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "shardcache/v1/store.pb.h"

namespace shardcache {

// Limits, as in Kubernetes.
inline constexpr size_t kDNS1123LabelMaxLength = 63;
inline constexpr size_t kDNS1123SubdomainMaxLength = 253;
inline constexpr size_t kQualifiedNameMaxLength = 63;  // the name part of a qualified name
inline constexpr size_t kLabelValueMaxLength = 63;
inline constexpr size_t kClusterNameMaxLength = 253;
// The total size of all annotations' keys and values of one object.
inline constexpr size_t kTotalAnnotationSizeLimitB = 256 * 1024;

// ---- Predicates ----

// A lowercase RFC 1123 label: 1..63 of [a-z0-9-], starting and ending with [a-z0-9].
bool IsDNS1123Label(absl::string_view value);
// A lowercase RFC 1123 subdomain: 1..253 characters, dot-separated non-empty parts of
// [a-z0-9-], each starting and ending with [a-z0-9] (no per-part length limit, as in k8s).
bool IsDNS1123Subdomain(absl::string_view value);
// A label key, annotation key or finalizer: [prefix '/'] name, where the optional prefix is a
// DNS-1123 subdomain and the name is 1..63 characters matching
// ([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9].
bool IsQualifiedName(absl::string_view value);
// A label value: empty, or at most 63 characters like the name part of a qualified name.
bool IsValidLabelValue(absl::string_view value);
// A logical cluster name (as kcp's): one or more DNS-1123 labels joined by ':', at most 253
// characters in all, e.g. "root" or "root:org:team-a".
bool IsClusterName(absl::string_view value);

// ---- Validation of one value (the message names `path`) ----

// DNS-1123 subdomain (object names, API groups). Empty: "Required value".
absl::Status ValidateDNS1123Subdomain(absl::string_view path, absl::string_view value);
// DNS-1123 label (namespaces, versions, resources). Empty: "Required value".
absl::Status ValidateDNS1123Label(absl::string_view path, absl::string_view value);
// Logical cluster name. Empty: "Required value".
absl::Status ValidateClusterName(absl::string_view path, absl::string_view value);
// Qualified name. Empty is invalid ("name part must be non-empty"), as in k8s.
absl::Status ValidateQualifiedName(absl::string_view path, absl::string_view value);
// Label value; empty is valid.
absl::Status ValidateLabelValue(absl::string_view path, absl::string_view value);

// ---- Validation of object metadata parts ----

// Each key must be a qualified name (error at `path`, e.g. "metadata.labels: Invalid value:
// "Foo_": ..."), each value a label value (error at `path[key]`, e.g. "metadata.labels[app]").
absl::Status ValidateLabels(absl::string_view path,
                            const google::protobuf::Map<std::string, std::string>& labels);
// Each key must be a qualified name once lower-cased (as k8s: case does not matter in annotation
// keys), error at `path`; the keys' and values' sizes together must not exceed
// kTotalAnnotationSizeLimitB ("path: Too long: must have at most 262144 bytes").
absl::Status ValidateAnnotations(
    absl::string_view path, const google::protobuf::Map<std::string, std::string>& annotations);
// Each finalizer must be a qualified name and appear once; errors at `path[i]`
// ("metadata.finalizers[2]: Duplicate value: "a/b"").
absl::Status ValidateFinalizers(absl::string_view path,
                                const google::protobuf::RepeatedPtrField<std::string>& finalizers);
// group: empty (the core group) or a DNS-1123 subdomain; version and resource: required DNS-1123
// labels. Errors at `path.group`, `path.version`, `path.resource`.
absl::Status ValidateGroupVersionResource(absl::string_view path,
                                          const shardcache::v1::GroupVersionResource& gvr);

// ---- Field errors, formatted as k8s.io/apimachinery/pkg/util/validation/field ----
// Each returns an InvalidArgumentError "path: <body>" (or "<body>" when path is empty).

// "path: Invalid value: "value": detail" (the value quoted and escaped).
absl::Status FieldInvalid(absl::string_view path, absl::string_view value,
                          absl::string_view detail);
// As FieldInvalid, with a value that is already rendered (e.g. a JSON number): not quoted.
absl::Status FieldInvalidRendered(absl::string_view path, absl::string_view rendered_value,
                                  absl::string_view detail);
// "path: Required value" or "path: Required value: detail".
absl::Status FieldRequired(absl::string_view path, absl::string_view detail = "");
// "path: Forbidden: detail".
absl::Status FieldForbidden(absl::string_view path, absl::string_view detail);
// "path: Unsupported value: "value": supported values: "a", "b"".
absl::Status FieldNotSupported(absl::string_view path, absl::string_view value,
                               std::initializer_list<absl::string_view> supported);
// "path: Duplicate value: "value"".
absl::Status FieldDuplicate(absl::string_view path, absl::string_view value);
// "path: Too long: must have at most N bytes".
absl::Status FieldTooLong(absl::string_view path, size_t max_bytes);

// `value` in double quotes, escaped to printable ASCII (C-style escapes), and cut after 512 bytes
// with a note of how many more there were. For putting user input into error messages.
std::string QuoteForMessage(absl::string_view value);

// Path helpers: ChildPath("metadata", "name") is "metadata.name" (just "name" if the parent is
// empty); KeyPath("metadata.labels", "app") is "metadata.labels[app]" (the key escaped and cut as
// in QuoteForMessage, without the quotes); IndexPath("x", 2) is "x[2]".
std::string ChildPath(absl::string_view parent, absl::string_view child);
std::string KeyPath(absl::string_view parent, absl::string_view key);
std::string IndexPath(absl::string_view parent, size_t index);

}  // namespace shardcache

#endif  // SHARDCACHE_COMMON_VALIDATION_H_
