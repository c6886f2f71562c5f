#!/usr/bin/python3
"""grpcurl_lite: a small grpcurl-compatible gRPC client driven by server reflection.

grpcurl is not packaged in Debian. This client implements the part of grpcurl that shardcache's
users and tests need, with only Debian's python3-grpcio and python3-protobuf:

  grpcurl_lite.py -plaintext ADDR list [SERVICE]
  grpcurl_lite.py -plaintext ADDR describe [SYMBOL]
  grpcurl_lite.py -plaintext [-d JSON | -d @] [-max-time SECONDS] ADDR SERVICE/METHOD
  grpcurl_lite.py -cacert CA [-cert CERT -key KEY] ... ADDR ...     (TLS, mutual with -cert)

It knows no application protos. It compiles gRPC's reflection proto (v1alpha, from Debian's
grpc-proto package) with protoc at run time, asks the server for the files that define each
symbol and, recursively, their dependencies, builds a descriptor pool from them, and converts
JSON to requests with protobuf's json_format (both spellings of field names, as grpcurl) and
prints responses exactly as grpcurl 1.9.1 does (message_to_json). Unary, server-streaming,
client-streaming and bidirectional methods are supported; `-d` may hold several JSON objects
(one request each, for client streams). Output and exit codes follow grpcurl's: each response as
JSON indented by two spaces with proto field names ("resource_version"), one after the other
for a stream; on an RPC error "ERROR:\\n  Code: NotFound\\n  Message: ..." (and, when the status
carries details, "  Details:" and each one as JSON, as grpcurl) on stderr and exit code 64 + the
gRPC status code; other failures exit 1, usage errors 2.

Also importable: Client is the machinery (used by reflection_test.py).

Only /usr/bin/python3 with python3-grpcio and python3-protobuf is required, plus /usr/bin/protoc
and /usr/bin/grpc_python_plugin (packages protobuf-compiler and protobuf-compiler-grpc).
"""

import base64
import decimal
import importlib
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time

import grpc
from google.protobuf import descriptor
from google.protobuf import descriptor_pb2
from google.protobuf import descriptor_pool
from google.protobuf import json_format
from google.protobuf import message_factory

DEFAULT_GRPC_PROTO_DIR = "/usr/share/grpc-proto"
PROTOC = "/usr/bin/protoc"
GRPC_PYTHON_PLUGIN = "/usr/bin/grpc_python_plugin"
REFLECTION_PROTO = "grpc/reflection/v1alpha/reflection.proto"
REFLECTION_SERVICE = "grpc.reflection.v1alpha.ServerReflection"
# grpcurl exits with this plus the status code when an RPC fails.
STATUS_CODE_OFFSET = 64
# How long reflection calls and the connection may take when no -max-time bounds them.
DEFAULT_CONNECT_TIMEOUT = 10.0

# Status code names as grpcurl (Go's codes.Code.String()) prints them.
_GO_CODE_NAMES = {
    grpc.StatusCode.OK: "OK",
    grpc.StatusCode.CANCELLED: "Canceled",
    grpc.StatusCode.UNKNOWN: "Unknown",
    grpc.StatusCode.INVALID_ARGUMENT: "InvalidArgument",
    grpc.StatusCode.DEADLINE_EXCEEDED: "DeadlineExceeded",
    grpc.StatusCode.NOT_FOUND: "NotFound",
    grpc.StatusCode.ALREADY_EXISTS: "AlreadyExists",
    grpc.StatusCode.PERMISSION_DENIED: "PermissionDenied",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "ResourceExhausted",
    grpc.StatusCode.FAILED_PRECONDITION: "FailedPrecondition",
    grpc.StatusCode.ABORTED: "Aborted",
    grpc.StatusCode.OUT_OF_RANGE: "OutOfRange",
    grpc.StatusCode.UNIMPLEMENTED: "Unimplemented",
    grpc.StatusCode.INTERNAL: "Internal",
    grpc.StatusCode.UNAVAILABLE: "Unavailable",
    grpc.StatusCode.DATA_LOSS: "DataLoss",
    grpc.StatusCode.UNAUTHENTICATED: "Unauthenticated",
}


def code_name(code):
    """The grpcurl (Go) spelling of a grpc.StatusCode, e.g. "NotFound"."""
    return _GO_CODE_NAMES.get(code, str(code))


def code_from_name(name):
    """The grpc.StatusCode for a Go-style or Python-style name ("NotFound", "NOT_FOUND")."""
    for code, go_name in _GO_CODE_NAMES.items():
        if name in (go_name, code.name):
            return code
    raise ValueError("unknown status code name %r" % name)


class Error(Exception):
    """A failure that is not an RPC status: bad input, an unresolvable symbol, no connection."""


# ----------------------------------------------------------------------------------------------
# The reflection proto, compiled at run time.


def compile_reflection_proto(work_dir, grpc_proto_dir=DEFAULT_GRPC_PROTO_DIR):
    """Compiles the reflection proto into work_dir and returns its (pb2, pb2_grpc) modules.

    The proto is copied to a private path first: generated under its own path its modules would
    be grpc.reflection.v1alpha.*, which the installed grpc package would shadow.
    """
    source = os.path.join(grpc_proto_dir, REFLECTION_PROTO)
    if not os.path.isfile(source):
        raise Error("cannot find %s (install Debian's grpc-proto package)" % source)
    package = "grpcurl_lite_gen"
    out_dir = os.path.join(work_dir, "grpcurl_lite_protos")
    os.makedirs(os.path.join(out_dir, package), exist_ok=True)
    shutil.copyfile(source, os.path.join(out_dir, package, "reflection_v1alpha.proto"))
    command = [
        PROTOC,
        "--plugin=protoc-gen-grpc=" + GRPC_PYTHON_PLUGIN,
        "-I" + out_dir,
        "--python_out=" + out_dir,
        "--grpc_out=" + out_dir,
        os.path.join(out_dir, package, "reflection_v1alpha.proto"),
    ]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise Error("cannot run %s: %s" % (PROTOC, e))
    if result.returncode != 0:
        raise Error("%s failed: %s" % (" ".join(command), result.stderr.strip()))
    if out_dir not in sys.path:
        sys.path.insert(0, out_dir)
    importlib.invalidate_caches()
    pb2 = importlib.import_module(package + ".reflection_v1alpha_pb2")
    pb2_grpc = importlib.import_module(package + ".reflection_v1alpha_pb2_grpc")
    return pb2, pb2_grpc


_reflection_modules = None
_reflection_lock = threading.Lock()


def reflection_modules(work_dir=None, grpc_proto_dir=DEFAULT_GRPC_PROTO_DIR):
    """The compiled reflection modules, compiled once per process."""
    global _reflection_modules
    with _reflection_lock:
        if _reflection_modules is None:
            if work_dir is None:
                work_dir = tempfile.mkdtemp(prefix="grpcurl_lite.")
            _reflection_modules = compile_reflection_proto(work_dir, grpc_proto_dir)
        return _reflection_modules


# ----------------------------------------------------------------------------------------------
# JSON text to messages and back.


def iter_json_values(read_chunk):
    """Yields the JSON values of a stream of concatenated JSON texts (whitespace between them).

    read_chunk() returns the next piece of text, or "" at the end. Values are yielded as soon as
    they are complete, so that a client stream can be fed interactively.
    """
    decoder = json.JSONDecoder()
    buffer = ""
    eof = False
    while True:
        buffer = buffer.lstrip()
        if buffer:
            try:
                value, end = decoder.raw_decode(buffer)
            except json.JSONDecodeError as e:
                if eof:
                    raise Error("invalid JSON: %s" % e)
            else:
                # A number at the end of the text may be cut short: wait for more text.
                if end < len(buffer) or eof or isinstance(value, (dict, list, str)):
                    yield value
                    buffer = buffer[end:]
                    continue
        elif eof:
            return
        chunk = read_chunk()
        if not chunk:
            eof = True
        buffer += chunk


def json_values_from_text(text):
    """The JSON values in text (several concatenated values are allowed)."""
    chunks = [text]
    return list(iter_json_values(lambda: chunks.pop() if chunks else ""))


def message_to_json(message, emit_defaults=False, resolve=None):
    """A message as grpcurl 1.9.1 prints it, byte for byte (without the trailing newline).

    grpcurl marshals with golang/protobuf's jsonpb (OrigName: proto field names such as
    "resource_version") and indents the result with Go's json.Indent, two spaces. As jsonpb
    does: fields in the order the message declares them, unset fields left out (with
    emit_defaults, as grpcurl's -emit-defaults: their zero values, null for messages), int64
    and uint64 as strings, enums by name, map keys (and so Struct keys) sorted, bytes in base64,
    floats as Go's encoding/json writes them (3, not 3.0), strings escaped as Go escapes them
    (<, >, & and U+2028/U+2029 as \\u escapes, other non-ASCII text as is). A
    google.protobuf.Any is printed as grpcurl's resolver does: {"@type": URL and the fields of
    the message, with these keys sorted (as Go's encoding/json writes a map)}, where
    resolve(full_name) gives the message's descriptor (Client.find_message), else {"@type",
    "@error", "@value": the bytes in base64}.
    """
    return _go_json(_message_value(message, emit_defaults, resolve))


_INT64_TYPES = (descriptor.FieldDescriptor.TYPE_INT64, descriptor.FieldDescriptor.TYPE_UINT64,
                descriptor.FieldDescriptor.TYPE_SINT64, descriptor.FieldDescriptor.TYPE_FIXED64,
                descriptor.FieldDescriptor.TYPE_SFIXED64)
_WRAPPER_TYPES = frozenset("google.protobuf.%s" % n for n in (
    "BoolValue", "BytesValue", "StringValue", "Int32Value", "UInt32Value", "FloatValue",
    "Int64Value", "UInt64Value", "DoubleValue"))


class _GoFloat(float):
    """A float that _go_json writes as Go's encoding/json does (bits: 32 or 64)."""

    def __new__(cls, value, bits):
        self = float.__new__(cls, value)
        self.bits = bits
        return self


def _message_value(message, emit_defaults, resolve=None):
    """A message as a JSON-like value, in jsonpb's field order, for _go_json."""
    desc = message.DESCRIPTOR
    name = desc.full_name
    if name in _WRAPPER_TYPES:
        return _field_value(desc.fields_by_name["value"], message.value, emit_defaults)
    if name in ("google.protobuf.Timestamp", "google.protobuf.Duration"):
        return message.ToJsonString()  # 0, 3, 6 or 9 fractional digits, as jsonpb.
    if name == "google.protobuf.Struct":
        return {k: _message_value(message.fields[k], emit_defaults, resolve)
                for k in sorted(message.fields)}
    if name == "google.protobuf.ListValue":
        return [_message_value(v, emit_defaults, resolve) for v in message.values]
    if name == "google.protobuf.Value":
        kind = message.WhichOneof("kind")
        if kind is None or kind == "null_value":
            return None
        if kind == "number_value":
            return _GoFloat(message.number_value, 64)
        if kind in ("struct_value", "list_value"):
            return _message_value(getattr(message, kind), emit_defaults, resolve)
        return getattr(message, kind)
    if name == "google.protobuf.Any":
        return _any_value(message, emit_defaults, resolve)
    present = {field.name for field, _ in message.ListFields()}
    value = {}
    for field in desc.fields:  # Declaration order, as jsonpb.
        if field.name in present:
            value[field.name] = _field_value(field, getattr(message, field.name), emit_defaults,
                                             resolve)
        elif emit_defaults and field.containing_oneof is None:
            if field.label == field.LABEL_REPEATED:
                value[field.name] = {} if _is_map(field) else []
            elif field.message_type is not None:
                value[field.name] = None
            else:
                value[field.name] = _field_value(field, field.default_value, emit_defaults)
    return value


def _any_value(message, emit_defaults, resolve):
    """An Any as grpcurl prints it (its anyResolverWithFallback, then jsonpb)."""
    type_name = message.type_url.rsplit("/", 1)[-1]
    desc = resolve(type_name) if resolve is not None else None
    if desc is None:
        return {"@type": message.type_url,
                "@error": "%s is not recognized; see @value for raw binary message data" %
                          type_name,
                "@value": base64.b64encode(message.value).decode("ascii")}
    inner = message_factory_class(desc)()
    inner.ParseFromString(message.value)
    value = _message_value(inner, emit_defaults, resolve)
    value["@type"] = message.type_url
    # jsonpb adds "@type" by decoding the message's JSON into a Go map and encoding it again,
    # and Go's encoding/json writes a map's keys sorted: "@type", then the fields by name (only
    # at this level: the fields' values are kept as they were written).
    return {k: value[k] for k in sorted(value)}


def message_factory_class(desc):
    """The Python class of a message descriptor, from whichever pool holds it."""
    get = getattr(message_factory, "GetMessageClass", None)
    if get is not None:
        return get(desc)
    return message_factory.MessageFactory(desc.file.pool).GetPrototype(desc)


def _is_map(field):
    return (field.message_type is not None and field.label == field.LABEL_REPEATED and
            field.message_type.GetOptions().map_entry)


def _field_value(field, value, emit_defaults, resolve=None):
    if _is_map(field):
        key_field = field.message_type.fields_by_name["key"]
        value_field = field.message_type.fields_by_name["value"]
        keys = sorted(value)
        return {_map_key(key_field, k):
                _singular_value(value_field, value[k], emit_defaults, resolve) for k in keys}
    if field.label == field.LABEL_REPEATED:
        return [_singular_value(field, v, emit_defaults, resolve) for v in value]
    return _singular_value(field, value, emit_defaults, resolve)


def _map_key(field, key):
    if field.type == field.TYPE_BOOL:
        return "true" if key else "false"
    return str(key)


def _singular_value(field, value, emit_defaults, resolve=None):
    if field.message_type is not None:
        return _message_value(value, emit_defaults, resolve)
    if field.enum_type is not None:
        if field.enum_type.full_name == "google.protobuf.NullValue":
            return None
        enum_value = field.enum_type.values_by_number.get(value)
        return enum_value.name if enum_value is not None else value
    if field.type in _INT64_TYPES:
        return str(value)
    if field.type == field.TYPE_DOUBLE:
        return _GoFloat(value, 64)
    if field.type == field.TYPE_FLOAT:
        return _GoFloat(value, 32)
    if field.type == field.TYPE_BYTES:
        return base64.b64encode(value).decode("ascii")
    return value


def _go_float(value, bits):
    """A float as Go's encoding/json writes it (strconv 'f' format, 'e' outside [1e-6, 1e21))."""
    if math.isnan(value):
        return '"NaN"'
    if math.isinf(value):
        return '"Infinity"' if value > 0 else '"-Infinity"'
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    if bits == 32:
        # The shortest text that reads back as the same float32.
        for precision in range(1, 10):
            text = "%.*g" % (precision, value)
            if struct.unpack("f", struct.pack("f", float(text)))[0] == value:
                break
        shortest = text
    else:
        shortest = repr(value)
    number = decimal.Decimal(shortest)
    if 1e-6 <= abs(value) < 1e21:
        text = format(number, "f")
        if "." in text:
            text = text.rstrip("0").rstrip(".")
        return text
    # 'e' format: Go writes at least two exponent digits, then encoding/json turns e-07 into e-7.
    mantissa, exponent = format(number.normalize(), "e").split("e")
    sign, digits = exponent[0], exponent[1:].lstrip("0") or "0"
    return "%se%s%s" % (mantissa, sign, digits.zfill(2) if sign == "+" else digits)


def _go_string(text):
    """A JSON string as Go's encoding/json writes it (HTML-safe escaping)."""
    out = ['"']
    for c in text:
        if c == '"':
            out.append('\\"')
        elif c == "\\":
            out.append("\\\\")
        elif c == "\n":
            out.append("\\n")
        elif c == "\r":
            out.append("\\r")
        elif c == "\t":
            out.append("\\t")
        elif c < " " or c in "<>&\u2028\u2029":
            out.append("\\u%04x" % ord(c))
        else:
            out.append(c)
    out.append('"')
    return "".join(out)


def _go_json(value, indent=""):
    """A JSON value as Go's json.Indent(prefix "", indent "  ") lays out compact JSON."""
    inner = indent + "  "
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{\n" + ",\n".join(
            "%s%s: %s" % (inner, _go_string(k), _go_json(v, inner))
            for k, v in value.items()) + "\n" + indent + "}"
    if isinstance(value, list):
        if not value:
            return "[]"
        return "[\n" + ",\n".join(inner + _go_json(v, inner) for v in value) + "\n" + indent + "]"
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, _GoFloat):
        return _go_float(value, value.bits)
    if isinstance(value, float):
        return _go_float(value, 64)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return _go_string(value)
    raise Error("cannot print %r as JSON" % (value,))


# ----------------------------------------------------------------------------------------------
# describe: descriptors printed as proto source, as grpcurl prints them.

_SCALAR_NAMES = {
    descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE: "double",
    descriptor_pb2.FieldDescriptorProto.TYPE_FLOAT: "float",
    descriptor_pb2.FieldDescriptorProto.TYPE_INT64: "int64",
    descriptor_pb2.FieldDescriptorProto.TYPE_UINT64: "uint64",
    descriptor_pb2.FieldDescriptorProto.TYPE_INT32: "int32",
    descriptor_pb2.FieldDescriptorProto.TYPE_FIXED64: "fixed64",
    descriptor_pb2.FieldDescriptorProto.TYPE_FIXED32: "fixed32",
    descriptor_pb2.FieldDescriptorProto.TYPE_BOOL: "bool",
    descriptor_pb2.FieldDescriptorProto.TYPE_STRING: "string",
    descriptor_pb2.FieldDescriptorProto.TYPE_BYTES: "bytes",
    descriptor_pb2.FieldDescriptorProto.TYPE_UINT32: "uint32",
    descriptor_pb2.FieldDescriptorProto.TYPE_SFIXED32: "sfixed32",
    descriptor_pb2.FieldDescriptorProto.TYPE_SFIXED64: "sfixed64",
    descriptor_pb2.FieldDescriptorProto.TYPE_SINT32: "sint32",
    descriptor_pb2.FieldDescriptorProto.TYPE_SINT64: "sint64",
}


def _field_type(field):
    if field.type_name:
        return field.type_name
    return _SCALAR_NAMES[field.type]


def _describe_field(field, message, syntax, indent):
    label = ""
    if field.label == descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED:
        entry_name = field.type_name.rsplit(".", 1)[-1]
        for nested in message.nested_type:
            if nested.name == entry_name and nested.options.map_entry:
                key, value = nested.field[0], nested.field[1]
                return "%smap<%s, %s> %s = %d;" % (
                    indent, _field_type(key), _field_type(value), field.name, field.number)
        label = "repeated "
    elif field.label == descriptor_pb2.FieldDescriptorProto.LABEL_REQUIRED:
        label = "required "
    elif syntax == "proto2" or field.proto3_optional:
        label = "optional "
    return "%s%s%s %s = %d;" % (indent, label, _field_type(field), field.name, field.number)


def _describe_enum(enum, indent):
    lines = ["%senum %s {" % (indent, enum.name)]
    for value in enum.value:
        lines.append("%s  %s = %d;" % (indent, value.name, value.number))
    lines.append("%s}" % indent)
    return lines


def _describe_message(message, syntax, indent=""):
    lines = ["%smessage %s {" % (indent, message.name)]
    inner = indent + "  "
    oneofs_done = set()
    for field in message.field:
        real_oneof = field.HasField("oneof_index") and not field.proto3_optional
        if not real_oneof:
            lines.append(_describe_field(field, message, syntax, inner))
            continue
        if field.oneof_index in oneofs_done:
            continue
        oneofs_done.add(field.oneof_index)
        lines.append("%soneof %s {" % (inner, message.oneof_decl[field.oneof_index].name))
        for member in message.field:
            if member.HasField("oneof_index") and member.oneof_index == field.oneof_index:
                lines.append(_describe_field(member, message, syntax, inner + "  "))
        lines.append("%s}" % inner)
    for nested in message.nested_type:
        if not nested.options.map_entry:
            lines.extend(_describe_message(nested, syntax, inner))
    for enum in message.enum_type:
        lines.extend(_describe_enum(enum, inner))
    lines.append("%s}" % indent)
    return lines


def _describe_method(method, indent=""):
    return "%srpc %s ( %s%s ) returns ( %s%s );" % (
        indent, method.name, "stream " if method.client_streaming else "", method.input_type,
        "stream " if method.server_streaming else "", method.output_type)


def describe_descriptor(desc):
    """grpcurl's `describe` text for a service, method, message, enum or field descriptor."""
    if isinstance(desc, descriptor.ServiceDescriptor):
        proto = descriptor_pb2.ServiceDescriptorProto()
        desc.CopyToProto(proto)
        lines = ["%s is a service:" % desc.full_name, "service %s {" % proto.name]
        lines += [_describe_method(m, "  ") for m in proto.method]
        lines.append("}")
    elif isinstance(desc, descriptor.MethodDescriptor):
        proto = descriptor_pb2.ServiceDescriptorProto()
        desc.containing_service.CopyToProto(proto)
        method = next(m for m in proto.method if m.name == desc.name)
        lines = ["%s is a method:" % desc.full_name, _describe_method(method)]
    elif isinstance(desc, descriptor.Descriptor):
        proto = descriptor_pb2.DescriptorProto()
        desc.CopyToProto(proto)
        lines = ["%s is a message:" % desc.full_name] + _describe_message(proto, desc.file.syntax)
    elif isinstance(desc, descriptor.EnumDescriptor):
        proto = descriptor_pb2.EnumDescriptorProto()
        desc.CopyToProto(proto)
        lines = ["%s is an enum:" % desc.full_name] + _describe_enum(proto, "")
    elif isinstance(desc, descriptor.FieldDescriptor):
        parent = descriptor_pb2.DescriptorProto()
        desc.containing_type.CopyToProto(parent)
        field = next(f for f in parent.field if f.name == desc.name)
        lines = ["%s is a field:" % desc.full_name,
                 _describe_field(field, parent, desc.containing_type.file.syntax, "")]
    else:
        raise Error("cannot describe %s" % desc.full_name)
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# The client.


def _tls_credentials(files):
    """grpc.ssl_channel_credentials from (cacert, cert, key) file paths (None: not given)."""
    def read(path):
        if path is None:
            return None
        with open(path, "rb") as f:
            return f.read()
    cacert, cert, key = files
    return grpc.ssl_channel_credentials(root_certificates=read(cacert), private_key=read(key),
                                        certificate_chain=read(cert))


class Client:
    """A reflection-driven client of one server. Not thread-safe; close() it when done.

    Every call is bounded: by the timeout given to it, else by the client's default_timeout
    (None: unbounded, as grpcurl without -max-time).
    """

    def __init__(self, address, plaintext=True, work_dir=None,
                 grpc_proto_dir=DEFAULT_GRPC_PROTO_DIR, metadata=(), deadline=None,
                 connect_timeout=DEFAULT_CONNECT_TIMEOUT, default_timeout=None, tls=None):
        """deadline: an absolute time.monotonic() bound for everything this client does.
        tls: with plaintext False, (cacert, cert, key) file paths, each possibly None (as
        grpcurl's -cacert, -cert, -key)."""
        self.address = address
        self.metadata = tuple(metadata)
        self.deadline = deadline
        self.default_timeout = default_timeout
        self._pb2, self._pb2_grpc = reflection_modules(work_dir, grpc_proto_dir)
        if plaintext:
            self.channel = grpc.insecure_channel(address)
        else:
            self.channel = grpc.secure_channel(address, _tls_credentials(tls or (None,) * 3))
        self._reflection = self._pb2_grpc.ServerReflectionStub(self.channel)
        self.pool = descriptor_pool.DescriptorPool()
        self._files = {}  # file name -> FileDescriptorProto, every file the server sent.
        self._added = set()  # names of the files added to the pool.
        self._classes = {}
        try:
            grpc.channel_ready_future(self.channel).result(
                timeout=self._timeout(connect_timeout))
        except grpc.FutureTimeoutError:
            self.channel.close()
            raise Error('Failed to dial target host "%s": context deadline exceeded' % address)

    def close(self):
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *unused):
        self.close()

    def _timeout(self, timeout=None):
        """The time a call may take: timeout, else the default, bounded by the deadline."""
        if timeout is None:
            timeout = self.default_timeout
        if self.deadline is not None:
            left = max(0.0, self.deadline - time.monotonic())
            timeout = left if timeout is None else min(timeout, left)
        return timeout

    # -- reflection ---------------------------------------------------------------------------

    def _reflect(self, **request):
        """One reflection request on its own stream; returns the response or raises Error."""
        req = self._pb2.ServerReflectionRequest(**request)
        timeout = self._timeout(DEFAULT_CONNECT_TIMEOUT)
        try:
            responses = list(self._reflection.ServerReflectionInfo(
                iter([req]), timeout=timeout, metadata=self.metadata))
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise Error("server does not support the reflection API")
            raise
        if len(responses) != 1:
            raise Error("reflection: expected one answer, got %d" % len(responses))
        response = responses[0]
        if response.HasField("error_response"):
            raise Error(response.error_response.error_message or
                        "reflection error %d" % response.error_response.error_code)
        return response

    def _take_files(self, response):
        for serialized in response.file_descriptor_response.file_descriptor_proto:
            proto = descriptor_pb2.FileDescriptorProto.FromString(serialized)
            self._files.setdefault(proto.name, proto)

    def _load_file(self, name):
        """Adds file `name`, after its dependencies, to the pool, asking the server as needed."""
        if name in self._added:
            return
        if name not in self._files:
            try:
                self._take_files(self._reflect(file_by_filename=name))
            except Error as e:
                raise Error('file "%s": %s' % (name, e))
            if name not in self._files:
                raise Error('file "%s": the server did not send it' % name)
        proto = self._files[name]
        for dependency in proto.dependency:
            self._load_file(dependency)
        self.pool.AddSerializedFile(proto.SerializeToString())
        self._added.add(name)

    def files_containing_symbol(self, symbol):
        """The FileDescriptorProtos the server sends for file_containing_symbol (the defining
        file first, then its dependencies, as the server chooses). Raises Error when unknown."""
        response = self._reflect(file_containing_symbol=symbol)
        self._take_files(response)
        return [descriptor_pb2.FileDescriptorProto.FromString(s)
                for s in response.file_descriptor_response.file_descriptor_proto]

    def list_services(self):
        """The names of the services the server offers, sorted."""
        response = self._reflect(list_services="")
        return sorted(s.name for s in response.list_services_response.service)

    def resolve(self, symbol):
        """The descriptor of a service, method, message, enum or field, via reflection.

        Raises Error('Symbol not found: ...') when the server does not know it.
        """
        symbol = symbol.lstrip(".")
        found = self._find(symbol)
        if found is not None:
            return found
        try:
            response = self._reflect(file_containing_symbol=symbol)
        except Error as e:
            # A method or field: ask for its parent, as grpcurl does.
            if "." in symbol:
                parent = symbol.rsplit(".", 1)[0]
                try:
                    response = self._reflect(file_containing_symbol=parent)
                except Error:
                    raise Error("Symbol not found: %s" % symbol)
            else:
                raise Error("Symbol not found: %s (%s)" % (symbol, e))
        self._take_files(response)
        names = [descriptor_pb2.FileDescriptorProto.FromString(s).name
                 for s in response.file_descriptor_response.file_descriptor_proto]
        for name in names:
            self._load_file(name)
        found = self._find(symbol)
        if found is None:
            raise Error("Symbol not found: %s" % symbol)
        return found

    def _find(self, symbol):
        finders = (self.pool.FindServiceByName, self.pool.FindMessageTypeByName,
                   self.pool.FindEnumTypeByName, self.pool.FindMethodByName,
                   self.pool.FindFieldByName)
        for find in finders:
            try:
                return find(symbol)
            except KeyError:
                continue
        return None

    def list_methods(self, service):
        """The full names of a service's methods, sorted, as `grpcurl list SERVICE` prints."""
        desc = self.resolve(service)
        if not isinstance(desc, descriptor.ServiceDescriptor):
            raise Error('"%s" is not a service' % service)
        return sorted(m.full_name for m in desc.methods)

    def describe(self, symbol):
        return describe_descriptor(self.resolve(symbol))

    def method(self, name):
        """The MethodDescriptor for "pkg.Service/Method" or "pkg.Service.Method"."""
        if "/" in name:
            service, method = name.rsplit("/", 1)
        elif "." in name:
            service, method = name.rsplit(".", 1)
        else:
            raise Error('"%s" is not a method name (want SERVICE/METHOD)' % name)
        try:
            desc = self.resolve(service)
        except Error as e:
            raise Error('failed to query for service descriptor "%s": %s' % (service, e))
        if not isinstance(desc, descriptor.ServiceDescriptor):
            raise Error('target "%s" is not a service' % service)
        for m in desc.methods:
            if m.name == method:
                return m
        raise Error('service "%s" does not include a method named "%s"' % (service, method))

    def message_class(self, desc):
        """The Python class of a message descriptor from this client's pool."""
        cls = self._classes.get(desc.full_name)
        if cls is None:
            cls = message_factory_class(desc)
            self._classes[desc.full_name] = cls
        return cls

    def find_message(self, name):
        """The descriptor of message `name` via reflection, or None (for message_to_json)."""
        try:
            desc = self.resolve(name)
        except (Error, grpc.RpcError):
            return None
        return desc if isinstance(desc, descriptor.Descriptor) else None

    def parse(self, desc, value):
        """A message of type desc from a JSON value (dict) or JSON text."""
        message = self.message_class(desc)()
        try:
            if isinstance(value, str):
                json_format.Parse(value, message)
            else:
                json_format.ParseDict(value, message)
        except json_format.ParseError as e:
            raise Error("error getting request data: %s" % e)
        return message

    def invoke(self, method_name, requests, timeout=None, emit_defaults=False):
        """Calls a method; yields each response message.

        requests: an iterable of JSON values (dicts) or texts, one per request message; a unary or
        server-streaming method takes at most one (none: an empty request). It may be a generator
        that produces requests while the call runs (a client stream). Raises grpc.RpcError when
        the call fails and Error on bad input.
        """
        method = self.method(method_name)
        path = "/%s/%s" % (method.containing_service.full_name, method.name)
        request_class = self.message_class(method.input_type)
        response_class = self.message_class(method.output_type)
        serialize = request_class.SerializeToString
        deserialize = response_class.FromString
        timeout = self._timeout(timeout)
        if not method.client_streaming:
            values = list(requests)
            if len(values) > 1:
                raise Error("method %s is a %s RPC, but request data contained %d messages" % (
                    method.full_name,
                    "server-streaming" if method.server_streaming else "unary", len(values)))
            request = self.parse(method.input_type, values[0]) if values else request_class()
            if method.server_streaming:
                call = self.channel.unary_stream(path, serialize, deserialize)(
                    request, timeout=timeout, metadata=self.metadata)
                yield from _cancel_on_exit(call)
            else:
                yield self.channel.unary_unary(path, serialize, deserialize)(
                    request, timeout=timeout, metadata=self.metadata)
            return
        stream = _RequestStream(self, method.input_type, requests)
        if method.server_streaming:
            call = self.channel.stream_stream(path, serialize, deserialize)(
                iter(stream), timeout=timeout, metadata=self.metadata)
            stream.call = call
            try:
                for response in _cancel_on_exit(call):
                    yield response
            except grpc.RpcError:
                stream.raise_error()
                raise
        else:
            future = self.channel.stream_unary(path, serialize, deserialize).future(
                iter(stream), timeout=timeout, metadata=self.metadata)
            stream.call = future
            try:
                response = future.result()
            except grpc.RpcError:
                stream.raise_error()
                raise
            yield response
        stream.raise_error()


def _cancel_on_exit(call):
    """Yields a streaming call's responses; cancels the call if the consumer stops early."""
    try:
        for response in call:
            yield response
    finally:
        call.cancel()


class _RequestStream:
    """Turns JSON values into request messages for a client stream, recording the first error.

    gRPC consumes the iterator on its own thread: an error there ends the stream and cancels the
    call, and raise_error() reports it to the caller's thread.
    """

    def __init__(self, client, desc, values):
        self._client = client
        self._desc = desc
        self._values = values
        self.call = None
        self.error = None

    def __iter__(self):
        try:
            for value in self._values:
                yield self._client.parse(self._desc, value)
        except Exception as e:  # pylint: disable=broad-except
            self.error = e if isinstance(e, Error) else Error("error getting request data: %s" % e)
            if self.call is not None:
                self.call.cancel()

    def raise_error(self):
        if self.error is not None:
            raise self.error


# ----------------------------------------------------------------------------------------------
# The command line, as grpcurl's.

_USAGE = """Usage:
\tgrpcurl_lite.py [flags] [address] [list|describe] [symbol]

Flags (one or two leading dashes, "-flag value" or "-flag=value"):
  -plaintext            use plain-text HTTP/2 (no TLS)
  -cacert FILE          TLS: the CA bundle the server's certificate must chain to
  -cert FILE            TLS: the client certificate to present (with -key)
  -key FILE             TLS: the private key of -cert
  -d DATA               request data as JSON; several objects for a client stream; "@" reads stdin
  -max-time SECONDS     the longest the whole operation may take
  -connect-timeout SECONDS   the longest connecting may take (default 10)
  -H "NAME: VALUE"      a request header (repeatable)
  -emit-defaults        print fields that have default values
  -grpc-proto-dir DIR   where gRPC's protos are (default /usr/share/grpc-proto)
  -work-dir DIR         where to compile the reflection proto (default: a temporary directory)
"""

_BOOL_FLAGS = {"plaintext", "emit-defaults", "insecure", "help", "h"}
_VALUE_FLAGS = {"d", "max-time", "connect-timeout", "H", "grpc-proto-dir", "work-dir", "cacert",
                "cert", "key"}


class UsageError(Exception):
    pass


def parse_args(argv):
    """Parses grpcurl-style flags (Go's flag package: flags come before the arguments)."""
    flags = {"H": []}
    args = list(argv)
    while args and args[0].startswith("-") and args[0] not in ("-", "--"):
        arg = args.pop(0)
        name = arg.lstrip("-")
        value = None
        if "=" in name:
            name, value = name.split("=", 1)
        if name in _BOOL_FLAGS:
            flags[name] = value is None or value.lower() in ("1", "t", "true")
        elif name in _VALUE_FLAGS:
            if value is None:
                if not args:
                    raise UsageError("flag needs an argument: -%s" % name)
                value = args.pop(0)
            if name == "H":
                flags["H"].append(value)
            else:
                flags[name] = value
        else:
            raise UsageError("flag provided but not defined: -%s" % name)
    if args and args[0] == "--":
        args.pop(0)
    return flags, args


def _seconds(flags, name):
    if name not in flags:
        return None
    try:
        value = float(flags[name])
    except ValueError:
        raise UsageError("invalid value %r for flag -%s" % (flags[name], name))
    if value <= 0:
        raise UsageError("the -%s flag must be positive" % name)
    return value


def _metadata(headers):
    metadata = []
    for header in headers:
        if ":" not in header:
            raise UsageError('invalid header %r: want "NAME: VALUE"' % header)
        name, value = header.split(":", 1)
        metadata.append((name.strip().lower(), value.strip()))
    return metadata


def _status_details(error):
    """The details (google.protobuf.Any messages) of the google.rpc.Status that the server sent
    in the grpc-status-details-bin trailer; [] when there is none."""
    trailers = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
    for key, value in trailers or ():
        if key == "grpc-status-details-bin":
            return list(_rpc_status_class().FromString(value).details)
    return []


_RPC_STATUS_CLASS = []


def _rpc_status_class():
    """google.rpc.Status (code 1, message 2, details 3), as grpcurl has it compiled in."""
    if not _RPC_STATUS_CLASS:
        from google.protobuf import any_pb2  # pylint: disable=import-outside-toplevel
        pool = descriptor_pool.DescriptorPool()
        pool.AddSerializedFile(any_pb2.DESCRIPTOR.serialized_pb)
        proto = descriptor_pb2.FileDescriptorProto(
            name="grpcurl_lite/google/rpc/status.proto", package="google.rpc",
            syntax="proto3", dependency=["google/protobuf/any.proto"])
        message = proto.message_type.add(name="Status")
        message.field.add(name="code", number=1,
                          type=descriptor_pb2.FieldDescriptorProto.TYPE_INT32,
                          label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
        message.field.add(name="message", number=2,
                          type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING,
                          label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
        message.field.add(name="details", number=3,
                          type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
                          type_name=".google.protobuf.Any",
                          label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED)
        pool.AddSerializedFile(proto.SerializeToString())
        _RPC_STATUS_CLASS.append(message_factory_class(pool.FindMessageTypeByName(
            "google.rpc.Status")))
    return _RPC_STATUS_CLASS[0]


def print_status(error, out=sys.stderr, client=None):
    """The error as grpcurl's PrintStatus: code, message and each detail (as JSON, its types
    resolved through the client's reflection)."""
    out.write("ERROR:\n  Code: %s\n  Message: %s\n" % (code_name(error.code()), error.details()))
    details = _status_details(error)
    if details:
        out.write("  Details:\n")
        resolve = client.find_message if client is not None else None
        for i, detail in enumerate(details):
            prefix = "  %d)" % (i + 1)
            lines = message_to_json(detail, resolve=resolve).split("\n")
            out.write("%s\t%s\n" % (prefix, lines[0]))
            for line in lines[1:]:
                out.write("%s\t%s\n" % (" " * len(prefix), line))
    out.flush()


def _stdin_chunks():
    fd = sys.stdin.fileno()
    data = b""
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            return data.decode("utf-8") if data else ""
        data += chunk
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue  # a multi-byte character cut in two: read on.
        data = b""
        return text


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        flags, args = parse_args(argv)
        if flags.get("help") or flags.get("h"):
            sys.stdout.write(_USAGE)
            return 0
        max_time = _seconds(flags, "max-time")
        connect_timeout = _seconds(flags, "connect-timeout") or DEFAULT_CONNECT_TIMEOUT
        metadata = _metadata(flags["H"])
        if not args:
            raise UsageError("too few arguments")
        address, verb, rest = args[0], args[1] if len(args) > 1 else None, args[2:]
        if verb is None:
            raise UsageError("too few arguments")
        if verb in ("list", "describe"):
            if len(rest) > 1:
                raise UsageError("too many arguments")
            if "d" in flags:
                raise UsageError("the -d flag is only for invoking methods")
        elif rest:
            raise UsageError("too many arguments")
    except UsageError as e:
        sys.stderr.write("%s\nTry 'grpcurl_lite.py -help' for more details.\n" % e)
        return 2

    work_dir = flags.get("work-dir")
    temp_dir = None
    if work_dir is None:
        temp_dir = work_dir = tempfile.mkdtemp(prefix="grpcurl_lite.")
    client = None
    try:
        reflection_modules(work_dir, flags.get("grpc-proto-dir", DEFAULT_GRPC_PROTO_DIR))
        # -max-time bounds what grpcurl does (connect, reflection, the call); grpcurl has the
        # reflection client built in, so compiling it here is not part of that time.
        deadline = time.monotonic() + max_time if max_time is not None else None
        client = Client(address, plaintext=bool(flags.get("plaintext")), work_dir=work_dir,
                        metadata=metadata, deadline=deadline, connect_timeout=connect_timeout,
                        tls=(flags.get("cacert"), flags.get("cert"), flags.get("key")))
        if verb == "list":
            if rest:
                names = client.list_methods(rest[0])
            else:
                names = client.list_services()
            for name in names:
                print(name)
            return 0
        if verb == "describe":
            if rest:
                symbols = rest
            else:
                symbols = client.list_services()
            texts = []
            for symbol in symbols:
                try:
                    texts.append(client.describe(symbol))
                except Error as e:
                    raise Error('Failed to resolve symbol "%s": %s' % (symbol, e))
            print("\n\n".join(texts))
            return 0
        return _invoke(client, verb, flags)
    except grpc.RpcError as e:
        print_status(e, client=client)
        return STATUS_CODE_OFFSET + e.code().value[0]
    except Error as e:
        sys.stdout.flush()
        sys.stderr.write("%s\n" % e)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        if client is not None:
            client.close()
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)


def _invoke(client, method_name, flags):
    data = flags.get("d")
    if data is None:
        requests = iter(())
    elif data == "@":
        requests = iter_json_values(_stdin_chunks)
    else:
        try:
            requests = json_values_from_text(data)
        except Error as e:
            raise Error('Error invoking method "%s": error getting request data: %s' % (
                method_name, e))
    emit_defaults = bool(flags.get("emit-defaults"))
    try:
        for response in client.invoke(method_name, requests):
            sys.stdout.write(message_to_json(response, emit_defaults, client.find_message) + "\n")
            sys.stdout.flush()
    except Error as e:
        raise Error('Error invoking method "%s": %s' % (method_name, e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
