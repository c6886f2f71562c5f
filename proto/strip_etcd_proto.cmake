# Copies etcd's v3 API protos (from Debian's golang-etcd-server-dev) without what only Go needs,
# so that protoc can compile them for C++:
#   cmake -DETCD_PROTO_DIR=/usr/share/gocode/src/go.etcd.io/etcd -DOUT_DIR=DIR -P strip_etcd_proto.cmake
#
# Each of etcdserver/etcdserverpb/rpc.proto, mvcc/mvccpb/kv.proto and auth/authpb/auth.proto is
# written to OUT_DIR/etcd/<same path> (rpc.proto imports the other two as "etcd/..."), without:
# - the imports of gogoproto/gogo.proto and google/api/annotations.proto (not available for C++);
# - every gogoproto option: file options `option (gogoproto.x) = y;` and field options
#   `[(gogoproto.x) = y, ...]` (the other options of a field are kept);
# - the grpc-gateway annotations `option (google.api.http) = { ... };` of the rpcs (one level of
#   nested braces: `additional_bindings { ... }`).
# Messages, fields, services and packages are untouched, so the calls are etcd's on the wire. A
# file that still names gogoproto or google.api afterwards (a new form in a later etcd) fails the
# build here, with the line, rather than in protoc.
cmake_minimum_required(VERSION 3.22)

foreach(var ETCD_PROTO_DIR OUT_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "strip_etcd_proto.cmake: -D${var}=... is required")
  endif()
endforeach()

set(ws "[ \t\r\n]*")
foreach(file etcdserver/etcdserverpb/rpc.proto mvcc/mvccpb/kv.proto auth/authpb/auth.proto)
  set(in ${ETCD_PROTO_DIR}/${file})
  if(NOT EXISTS ${in})
    message(FATAL_ERROR "strip_etcd_proto.cmake: ${in} is missing "
                        "(on Debian: apt-get install golang-etcd-server-dev)")
  endif()
  file(READ ${in} text)

  string(REGEX REPLACE "import${ws}\"(gogoproto/gogo|google/api/annotations)\\.proto\"${ws};" ""
                       text "${text}")
  string(REGEX REPLACE "option${ws}\\(gogoproto\\.[A-Za-z0-9_]+\\)${ws}=[^;]*;" "" text "${text}")
  # Field options: each gogoproto one with the comma before it (not the first), after it (the
  # first of several) or alone; then the brackets that are left empty after a field's number.
  set(gogo "\\(gogoproto\\.[A-Za-z0-9_]+\\)${ws}=${ws}(\"[^\"]*\"|[^],;\"]*[^],;\" \t])")
  string(REGEX REPLACE ",${ws}${gogo}" "" text "${text}")
  string(REGEX REPLACE "${gogo}${ws},${ws}" "" text "${text}")
  string(REGEX REPLACE "${gogo}" "" text "${text}")
  string(REGEX REPLACE "(=[ \t]*[0-9]+)[ \t]*\\[${ws}\\]" "\\1" text "${text}")
  string(REGEX REPLACE
         "option${ws}\\(google\\.api\\.http\\)${ws}=${ws}{([^{}]|{[^{}]*})*}${ws};" "" text
         "${text}")

  string(REGEX MATCH "[^\n]*(gogoproto|google\\.api)[^\n]*" left "${text}")
  if(left)
    message(FATAL_ERROR "strip_etcd_proto.cmake: ${in}: cannot strip \"${left}\"")
  endif()

  file(WRITE ${OUT_DIR}/etcd/${file} "${text}")
endforeach()
