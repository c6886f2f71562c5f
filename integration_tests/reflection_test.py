#!/usr/bin/python3
"""The reflection test: cache_server as seen by a client that knows only gRPC reflection.

  /usr/bin/python3 reflection_test.py --server build/cache_server/cache_server \\
      --grpc-proto-dir /usr/share/grpc-proto --work-dir /tmp/reflection_test \\
      [--replicator build/shard_replicator/shard_replicator]

Test cases, each against servers of its own that it starts on loopback ports it lets the server
pick (--listen=127.0.0.1:0, --http-listen=127.0.0.1:0, --port-file):

- ReflectionTest: with grpcurl_lite's machinery (no shardcache proto is compiled in), lists the
  services, resolves every method of every service and every type they reach, describes
  grpc.health.v1.Health, calls Health/Check, then creates a ResourceDefinition and an object
  from JSON text, reads it back, lists with a label selector and watches with -max-time.
- ReadmeExamplesTest: runs every grpcurl command of docs/api-by-example.md, in order, with
  grpcurl_lite.py in grpcurl's place and the documented addresses (127.0.0.1:7071 for the shard
  store, 127.0.0.1:7070 for the cache) pointing at a fresh shard server and a fresh cache server.
  Each command must exit 0, unless its line ends with a comment "# fails: CODE" (a gRPC code as
  grpcurl prints it, e.g. NotFound): then it must fail with it.
- ReplicationExamplesTest (only with --replicator): the deployment of scripts/run.sh, a shard
  store, a cache and a shard_replicator for shard "a" (127.0.0.1:8072 in the documents stands
  for the replicator's HTTP address). Runs the commands of docs/api-by-example.md (with the
  replicator renewing its lease in the shard store all along), then every command of
  docs/replication-by-example.md, in one shell, and checks what each of the latter prints
  (REPLICATION_CHECKS). Replication is asynchronous: a command whose check is marked
  "eventually" is run again until the check passes, for at most EVENTUALLY_TIMEOUT.
- QuickStartTest (only with --replicator): the same deployment, fresh; runs every command of the
  ```sh blocks of README.md's "## Quick start" and checks what each prints (QUICK_START_CHECKS).

Prints "N passed, M failed" last and exits non-zero on any failure. The servers are always
stopped at the end (SIGTERM, then SIGKILL after 10 s).
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # No __pycache__ in the source tree.
import grpcurl_lite  # noqa: E402  pylint: disable=wrong-import-position

import grpc  # noqa: E402  pylint: disable=wrong-import-position

GRPCURL_LITE = os.path.join(HERE, "grpcurl_lite.py")
SOURCE_DIR = os.path.dirname(HERE)
# The documents whose examples the tests below run, relative to --source-dir, and their sections
# (a heading and what follows it up to the next heading of its level or above).
README = "README.md"
QUICK_START_SECTION = "## Quick start"
API_DOC = os.path.join("docs", "api-by-example.md")
API_SECTION = "# The API by example"
REPLICATION_DOC = os.path.join("docs", "replication-by-example.md")
REPLICATION_SECTION = "# Replication by example"
DOCUMENTED_REPLICATOR_HTTP_ADDRESS = "127.0.0.1:8072"
DOCUMENTED_SHARD_ADDRESS = "127.0.0.1:7071"
DOCUMENTED_CACHE_ADDRESS = "127.0.0.1:7070"

# Deadlines: every call and every wait below has one.
SERVER_START_TIMEOUT = 30.0
SERVER_STOP_GRACE = 10.0
CALL_TIMEOUT = 10.0
COMMAND_TIMEOUT = 60.0  # one grpcurl_lite.py process
DOC_COMMAND_MAX_TIME = 20  # -max-time given to documented commands that set none themselves
# The least -max-time a documented command runs with. A watch that a document ends with -max-time 2
# prints the same events whether it is open 2 s or 6 (it asks for no periodic bookmarks), but a
# busy machine can take most of 2 s to start the client and resolve the method by reflection.
DOC_COMMAND_MIN_MAX_TIME = 6
DOC_SCRIPT_TIMEOUT = 150.0
EVENTUALLY_TIMEOUT = 30.0  # a documented command re-run until its check passes
EVENTUALLY_INTERVAL = 0.5

# Set by main() from the command line.
ARGS = None
# Every server started, so that main() can stop them whatever happens.
SERVERS = []

WIDGETS_DEFINITION = """{
  "resource": {"group": "core.shardcache.io", "version": "v1", "resource": "resourcedefinitions"},
  "object": {
    "metadata": {"name": "widgets.example.com"},
    "spec": {
      "group": "example.com",
      "names": {"plural": "widgets"},
      "scope": "Namespaced",
      "versions": [{"name": "v1", "served": true}],
      "subresources": {"status": {}}
    }
  }
}"""
WIDGETS = {"group": "example.com", "version": "v1", "resource": "widgets"}


class Server:
    """One cache_server process in a directory of its own."""

    def __init__(self, role):
        self.role = role
        self.dir = tempfile.mkdtemp(prefix="%s." % role, dir=ARGS.work_dir)
        self.port_file = os.path.join(self.dir, "ports")
        self.log_path = os.path.join(self.dir, "server.log")
        self.grpc_port = None
        self.http_port = None
        self.process = None

    @property
    def address(self):
        return "127.0.0.1:%d" % self.grpc_port

    def command(self):
        return [ARGS.server, "--role=" + self.role, "--listen=127.0.0.1:0",
                "--http-listen=127.0.0.1:0", "--port-file=" + self.port_file]

    def start(self):
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(self.command(), cwd=self.dir, stdout=log,
                                            stderr=subprocess.STDOUT)
        SERVERS.append(self)
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError("%s server exited with %d before serving:\n%s" % (
                    self.role, self.process.returncode, self.log()))
            ports = self._read_ports()
            if ports is not None:
                self.grpc_port, self.http_port = ports
                return self
            time.sleep(0.05)
        raise AssertionError("%s server wrote no port file within %.0f s:\n%s" % (
            self.role, SERVER_START_TIMEOUT, self.log()))

    def _read_ports(self):
        try:
            with open(self.port_file) as f:
                values = dict(line.strip().split("=", 1) for line in f if "=" in line)
            return int(values["grpc_port"]), int(values["http_port"])
        except (OSError, KeyError, ValueError):
            return None

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def stop(self):
        """SIGTERM, then SIGKILL if it has not exited within SERVER_STOP_GRACE."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=SERVER_STOP_GRACE)
        except subprocess.TimeoutExpired:
            sys.stderr.write("%s server (pid %d) ignored SIGTERM for %.0f s: killing it\n" % (
                self.role, self.process.pid, SERVER_STOP_GRACE))
            self.process.kill()
            self.process.wait(timeout=SERVER_STOP_GRACE)


def stop_all_servers():
    """Stops every process started (Server.start), replicators before the stores they use; one
    that does not stop is killed."""
    for server in reversed(SERVERS):
        try:
            server.stop()
        except Exception as e:  # pylint: disable=broad-except
            sys.stderr.write("stopping the %s server: %s\n" % (server.role, e))
            if server.process is not None and server.process.poll() is None:
                server.process.kill()


class Replicator(Server):
    """One shard_replicator process; it serves HTTP only (no gRPC port)."""

    def __init__(self, shard, shard_store, cache):
        super().__init__("replicator")
        self.shard, self.shard_store, self.cache = shard, shard_store, cache

    @property
    def http_address(self):
        return "127.0.0.1:%d" % self.http_port

    def command(self):
        return [ARGS.replicator, "--shard=" + self.shard,
                "--shard-store=" + self.shard_store.address, "--cache=" + self.cache.address,
                "--http-listen=127.0.0.1:0", "--port-file=" + self.port_file]

    def _read_ports(self):
        try:
            with open(self.port_file) as f:
                values = dict(line.strip().split("=", 1) for line in f if "=" in line)
            return None, int(values["http_port"])
        except (OSError, KeyError, ValueError):
            return None

    def wait_ready(self):
        """Waits for /readyz to answer 200 (its informers have synced)."""
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        url = "http://%s/readyz" % self.http_address
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError("replicator exited with %d:\n%s" % (
                    self.process.returncode, self.log()))
            try:
                with urllib.request.urlopen(url, timeout=CALL_TIMEOUT) as response:
                    if response.status == 200:
                        return self
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.1)
        raise AssertionError("replicator not ready within %.0f s:\n%s" % (
            SERVER_START_TIMEOUT, self.log()))


def run_grpcurl_lite(args, stdin_text=None):
    """Runs grpcurl_lite.py; returns the CompletedProcess (text)."""
    command = [sys.executable, GRPCURL_LITE, "-work-dir", ARGS.work_dir,
               "-grpc-proto-dir", ARGS.grpc_proto_dir] + list(args)
    return subprocess.run(command, input=stdin_text, capture_output=True, text=True,
                          timeout=COMMAND_TIMEOUT)


def message_dict(message):
    return json.loads(grpcurl_lite.message_to_json(message))


class ReflectionTest(unittest.TestCase):
    """A shard store, seen through reflection only."""

    @classmethod
    def setUpClass(cls):
        cls.server = Server("shard").start()
        cls.client = grpcurl_lite.Client(
            cls.server.address, work_dir=ARGS.work_dir, grpc_proto_dir=ARGS.grpc_proto_dir,
            default_timeout=CALL_TIMEOUT, connect_timeout=CALL_TIMEOUT)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.server.stop()

    def call(self, method, *requests, timeout=CALL_TIMEOUT):
        """The responses of a call, as dicts."""
        return [message_dict(m) for m in self.client.invoke(method, requests, timeout=timeout)]

    def test_ListServices_IncludesStoreHealthAndReflection(self):
        services = self.client.list_services()
        for want in ("shardcache.v1.Store", "grpc.health.v1.Health",
                     "grpc.reflection.v1alpha.ServerReflection"):
            self.assertIn(want, services)
        cli = run_grpcurl_lite(["-plaintext", self.server.address, "list"])
        self.assertEqual(cli.returncode, 0, cli.stderr)
        self.assertEqual(cli.stdout.split(), services)
        cli = run_grpcurl_lite(["-plaintext", self.server.address, "list", "shardcache.v1.Store"])
        self.assertEqual(cli.returncode, 0, cli.stderr)
        self.assertEqual(cli.stdout.split(), sorted(
            "shardcache.v1.Store." + m for m in
            ("Get", "List", "Watch", "Create", "Update", "UpdateStatus", "Delete", "Write",
             "ClaimEpoch")))

    def test_EveryMethodOfEveryService_ResolvesWithAllItsTypes(self):
        # A client of its own, so that nothing resolved by another test helps.
        with grpcurl_lite.Client(self.server.address, work_dir=ARGS.work_dir,
                                 grpc_proto_dir=ARGS.grpc_proto_dir,
                                 default_timeout=CALL_TIMEOUT) as client:
            services = client.list_services()
            self.assertTrue(services)
            types = {}
            for service in services:
                desc = client.resolve(service)
                self.assertEqual(desc.full_name, service)
                self.assertTrue(desc.methods, "service %s has no methods" % service)
                for method in desc.methods:
                    self.assertEqual(
                        client.method("%s/%s" % (service, method.name)).full_name,
                        method.full_name)
                    for message in (method.input_type, method.output_type):
                        self._collect_types(message, types)
            self.assertIn("shardcache.v1.WatchEvent.Type", types)
            self.assertIn("google.protobuf.Struct", types)
            self.assertIn("google.protobuf.Timestamp", types)
            unresolved = []
            for name, desc in sorted(types.items()):
                # Each type must be found by the server on its own, as grpcurl asks for it.
                try:
                    files = client.files_containing_symbol(name)
                except (grpcurl_lite.Error, grpc.RpcError) as e:
                    unresolved.append("%s: %s" % (name, e))
                    continue
                if not files or files[0].name != desc.file.name:
                    unresolved.append("%s: the server answered with %s, not %s" % (
                        name, [f.name for f in files], desc.file.name))
                if hasattr(desc, "fields"):
                    client.message_class(desc)  # A usable message class.
            self.assertEqual(unresolved, [], "types that reflection cannot resolve")

    def _collect_types(self, desc, types):
        """Adds desc and every message and enum type its fields reach to types."""
        if desc.full_name in types:
            return
        types[desc.full_name] = desc
        for field in getattr(desc, "fields", ()):
            if field.type in (field.TYPE_MESSAGE, field.TYPE_GROUP):
                self.assertIsNotNone(field.message_type, field.full_name)
                self._collect_types(field.message_type, types)
            elif field.type == field.TYPE_ENUM:
                self.assertIsNotNone(field.enum_type, field.full_name)
                types.setdefault(field.enum_type.full_name, field.enum_type)

    def test_DescribeHealth_ShowsCheckAndWatch(self):
        want = ("grpc.health.v1.Health is a service:\n"
                "service Health {\n"
                "  rpc Check ( .grpc.health.v1.HealthCheckRequest ) returns "
                "( .grpc.health.v1.HealthCheckResponse );\n"
                "  rpc Watch ( .grpc.health.v1.HealthCheckRequest ) returns "
                "( stream .grpc.health.v1.HealthCheckResponse );\n"
                "}")
        self.assertEqual(self.client.describe("grpc.health.v1.Health"), want)
        cli = run_grpcurl_lite(["-plaintext", self.server.address, "describe",
                                "grpc.health.v1.Health"])
        self.assertEqual(cli.returncode, 0, cli.stderr)
        self.assertEqual(cli.stdout, want + "\n")
        cli = run_grpcurl_lite(["-plaintext", self.server.address, "describe",
                                "grpc.health.v1.HealthCheckResponse"])
        self.assertEqual(cli.returncode, 0, cli.stderr)
        self.assertIn("message HealthCheckResponse {", cli.stdout)
        self.assertIn("SERVING = 1;", cli.stdout)

    def test_HealthCheck_IsServing(self):
        self.assertEqual(self.call("grpc.health.v1.Health/Check", "{}"),
                         [{"status": "SERVING"}])
        cli = run_grpcurl_lite(["-plaintext", "-max-time", "10", self.server.address,
                                "grpc.health.v1.Health/Check"])
        self.assertEqual(cli.returncode, 0, cli.stderr)
        self.assertEqual(json.loads(cli.stdout), {"status": "SERVING"})

    def test_ObjectFromJsonText_CreateGetListWatch(self):
        created = self.call("shardcache.v1.Store/Create", WIDGETS_DEFINITION)
        self.assertEqual(created[0]["metadata"]["name"], "widgets.example.com")
        for name, tier in (("alpha", "front"), ("beta", "db")):
            self.call("shardcache.v1.Store/Create", """{
              "resource": {"group": "example.com", "version": "v1", "resource": "widgets"},
              "object": {
                "metadata": {"cluster": "root:org", "namespace": "default", "name": "%s",
                             "labels": {"app": "web", "tier": "%s"}},
                "spec": {"color": "blue", "size": 3, "parts": ["a", "b"], "on": true}
              }
            }""" % (name, tier))

        got = self.call("shardcache.v1.Store/Get", json.dumps({
            "resource": WIDGETS, "cluster": "root:org", "namespace": "default",
            "name": "alpha"}))[0]
        meta = got["metadata"]
        self.assertEqual((meta["cluster"], meta["namespace"], meta["name"]),
                         ("root:org", "default", "alpha"))
        self.assertEqual(meta["labels"], {"app": "web", "tier": "front"})
        self.assertEqual(got["spec"], {"color": "blue", "size": 3, "parts": ["a", "b"],
                                       "on": True})
        self.assertTrue(meta["uid"])
        self.assertGreater(int(meta["resource_version"]), 1)
        self.assertEqual(meta["generation"], "1")  # int64: a string in proto3 JSON.
        self.assertRegex(meta["creation_timestamp"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")
        self.assertNotIn("shard", meta)

        listed = self.call("shardcache.v1.Store/List", json.dumps({
            "resource": WIDGETS, "cluster": "root:org",
            "labelSelector": "app=web,tier in (front,back)"}))[0]
        self.assertEqual([i["metadata"]["name"] for i in listed["items"]], ["alpha"])
        self.assertGreaterEqual(int(listed["resource_version"]), int(meta["resource_version"]))
        listed = self.call("shardcache.v1.Store/List", json.dumps({
            "resource": WIDGETS, "labelSelector": "app=web"}))[0]
        self.assertEqual([i["metadata"]["name"] for i in listed["items"]], ["alpha", "beta"])

        # A watch from now, ended by -max-time as grpcurl ends it: DeadlineExceeded (64 + 4).
        cli = run_grpcurl_lite([
            "-plaintext", "-max-time", "%d" % DOC_COMMAND_MIN_MAX_TIME, "-d",
            json.dumps({"resource": WIDGETS, "labelSelector": "tier=front"}),
            self.server.address, "shardcache.v1.Store/Watch"])
        self.assertEqual(cli.returncode, 64 + 4, cli.stderr)
        self.assertIn("ERROR:\n  Code: DeadlineExceeded\n  Message: ", cli.stderr)
        events = grpcurl_lite.json_values_from_text(cli.stdout)
        self.assertGreaterEqual(len(events), 2, cli.stdout)
        self.assertEqual(events[0]["type"], "ADDED")
        self.assertEqual(events[0]["object"]["metadata"]["name"], "alpha")
        self.assertEqual(events[0]["object"]["spec"]["color"], "blue")
        self.assertEqual(events[1]["type"], "BOOKMARK")
        self.assertEqual(
            events[1]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"], "true")
        self.assertEqual(events[1]["object"]["metadata"]["resource_version"],
                         listed["resource_version"])

    def test_Output_IsGrpcurlsByteForByte(self):
        # What grpcurl 1.9.1 prints (golang/protobuf's jsonpb with proto names, then Go's
        # json.Indent): declared field order, sorted map and Struct keys, int64 as strings,
        # Go's number and string forms, empty objects and lists on one line.
        try:
            self.call("shardcache.v1.Store/Create", WIDGETS_DEFINITION)
        except grpc.RpcError as e:
            self.assertEqual(e.code(), grpc.StatusCode.ALREADY_EXISTS)
        request = json.dumps({
            "resource": WIDGETS,
            "object": {"metadata": {"cluster": "root:org", "namespace": "default",
                                    "name": "gamma", "labels": {"b": "two", "a": "one"}},
                       "spec": {"z": "<a&b>", "a": 1.5, "n": 3, "big": 1e21, "small": 0.000001,
                                "list": [], "obj": {}, "\u00e9": "\u00fc"}}},
            ensure_ascii=False)
        cli = run_grpcurl_lite(["-plaintext", "-max-time", "10", "-d", request,
                                self.server.address, "shardcache.v1.Store/Create"])
        self.assertEqual(cli.returncode, 0, cli.stderr)
        self.assertEqual(normalize_output(cli.stdout, numbers=False), """{
  "metadata": {
    "cluster": "root:org",
    "namespace": "default",
    "name": "gamma",
    "uid": "<uid>",
    "resource_version": "<n>",
    "generation": "<n>",
    "creation_timestamp": "<time>",
    "labels": {
      "a": "one",
      "b": "two"
    }
  },
  "spec": {
    "a": 1.5,
    "big": 1e+21,
    "list": [],
    "n": 3,
    "obj": {},
    "small": 0.000001,
    "z": "\\u003ca\\u0026b\\u003e",
    "\u00e9": "\u00fc"
  }
}
""")
        # Requests take both spellings: proto names (label_selector) and JSON names.
        for selector_field in ("label_selector", "labelSelector"):
            cli = run_grpcurl_lite([
                "-plaintext", "-max-time", "10", "-d",
                json.dumps({"resource": WIDGETS, selector_field: "b=two"}),
                self.server.address, "shardcache.v1.Store/List"])
            self.assertEqual(cli.returncode, 0, cli.stderr)
            self.assertEqual([i["metadata"]["name"] for i in json.loads(cli.stdout)["items"]],
                             ["gamma"], selector_field)

    def test_Errors_HaveGrpcurlsTextAndExitCode(self):
        with self.assertRaises(grpc.RpcError) as caught:
            self.call("shardcache.v1.Store/Get", json.dumps({
                "resource": {"group": "nope.example.com", "version": "v1", "resource": "nopes"},
                "name": "x"}))
        self.assertEqual(caught.exception.code(), grpc.StatusCode.NOT_FOUND)
        cli = run_grpcurl_lite([
            "-plaintext", "-max-time", "10", "-d",
            '{"resource": {"group": "nope.example.com", "version": "v1", "resource": "nopes"},'
            ' "name": "x"}', self.server.address, "shardcache.v1.Store/Get"])
        self.assertEqual(cli.returncode, 64 + 5, cli.stderr)
        self.assertTrue(cli.stderr.startswith("ERROR:\n  Code: NotFound\n  Message: "),
                        cli.stderr)
        cli = run_grpcurl_lite(["-plaintext", "-max-time", "10", self.server.address,
                                "describe", "shardcache.v1.NoSuchThing"])
        self.assertEqual(cli.returncode, 1)
        self.assertIn("shardcache.v1.NoSuchThing", cli.stderr)
        cli = run_grpcurl_lite(["-plaintext", "-max-time", "10", "-d", '{"nope": 1}',
                                self.server.address, "grpc.health.v1.Health/Check"])
        self.assertEqual(cli.returncode, 1)
        self.assertIn("error getting request data", cli.stderr)

    def test_FencedError_PrintsItsDetailsAsGrpcurl(self):
        # grpcurl 1.9.1's PrintStatus: after the message, "  Details:" and each detail of the
        # grpc-status-details-bin trailer as JSON, its type resolved through reflection, the
        # first line after "  1)\t" and the others after "    \t".
        claim = ["-plaintext", "-max-time", "10", "-d",
                 '{"fence": {"shard": "fence-test", "epoch": "3"}}', self.server.address,
                 "shardcache.v1.Store/ClaimEpoch"]
        cli = run_grpcurl_lite(claim)
        self.assertEqual(cli.returncode, 0, cli.stderr)
        claim[4] = '{"fence": {"shard": "fence-test", "epoch": "2"}}'
        cli = run_grpcurl_lite(claim)
        self.assertEqual(cli.returncode, 64 + 9, cli.stderr)
        self.assertEqual(cli.stderr, """ERROR:
  Code: FailedPrecondition
  Message: fenced: shard "fence-test" is at epoch 3 and this claim carries epoch 2 (a newer \
leader holds the shard)
  Details:
  1)\t{
    \t  "@type": "type.googleapis.com/google.rpc.ErrorInfo",
    \t  "domain": "shardcache.io",
    \t  "metadata": {
    \t    "epoch": "3",
    \t    "requestEpoch": "2",
    \t    "shard": "fence-test"
    \t  },
    \t  "reason": "FENCED"
    \t}
""")
        # A Write stream answers a fenced write with the same details in the answer.
        # (A built-in resource: the other cases expect to create the widgets definition.)
        write = json.dumps({"id": "1", "create": {
            "resource": {"group": "coordination.shardcache.io", "version": "v1",
                         "resource": "leases"},
            "object": {"metadata": {"cluster": "root:org", "namespace": "default",
                                    "name": "fenced-out"}},
            "fence": {"shard": "fence-test", "epoch": "1"}}})
        cli = run_grpcurl_lite(["-plaintext", "-max-time", "10", "-d", write,
                                self.server.address, "shardcache.v1.Store/Write"])
        self.assertEqual(cli.returncode, 0, cli.stderr)
        self.assertEqual(cli.stdout, """{
  "id": "1",
  "code": 9,
  "message": "fenced: shard \\"fence-test\\" is at epoch 3 and this write carries epoch 1 \
(a newer leader holds the shard)",
  "details": [
    {
      "@type": "type.googleapis.com/google.rpc.ErrorInfo",
      "domain": "shardcache.io",
      "metadata": {
        "epoch": "3",
        "requestEpoch": "1",
        "shard": "fence-test"
      },
      "reason": "FENCED"
    }
  ]
}
""")


# ----------------------------------------------------------------------------------------------
# The documents' examples.

_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][A-Za-z_0-9]*)\1")
_FAILS = re.compile(r"#\s*fails:\s*([A-Za-z_]+)")


def command_result(out_dir, n):
    """(exit code, stdout, stderr) of command n of a script that wrote them to out_dir/n.*."""
    base = os.path.join(out_dir, str(n))
    with open(base + ".rc") as f:
        rc = int(f.read())
    with open(base + ".out", errors="replace") as f:
        out = f.read()
    with open(base + ".err", errors="replace") as f:
        err = f.read()
    return rc, out, err


def read_doc(path):
    """The text of a document, path relative to --source-dir."""
    with open(os.path.join(ARGS.source_dir, path)) as f:
        return f.read()


_HEADING = re.compile(r"^(#{1,6}) ")
_FENCE = re.compile(r"^```")


def doc_section(text, section_title):
    """The text that follows the heading line section_title (e.g. "## Quick start") up to the
    next heading of its level or above, or the end. Lines inside ``` blocks are not headings
    (a shell comment such as "# grpcurl ..." is not)."""
    level = len(_HEADING.match(section_title).group(1))
    lines = text.split("\n")
    start = None
    in_block = False
    for i, line in enumerate(lines):
        if _FENCE.match(line):
            in_block = not in_block
            continue
        heading = None if in_block else _HEADING.match(line)
        if heading is None:
            continue
        if start is None:
            if line.rstrip() == section_title:
                start = i + 1
        elif len(heading.group(1)) <= level:
            return "\n".join(lines[start:i]) + "\n"
    if start is None:
        raise AssertionError("no section %r" % section_title)
    return "\n".join(lines[start:])


def doc_commands(text, section_title):
    """The commands of the ```sh blocks of a section, in order, as (command, fails) pairs.

    A command is a line with its continuation lines (trailing backslash) and its heredoc bodies;
    fails is the code named by a trailing "# fails: CODE" comment, or None. Comment lines and
    blank lines are skipped.
    """
    return [(command, fails) for command, fails, _ in doc_examples(text, section_title)]


def doc_examples(text, section_title):
    """As doc_commands, with what the document shows each command print: (command, fails, shown).

    shown is the text of the ```json block that directly follows a ```sh block (no other block
    between them), attached to the last command of that ```sh block: what grpcurl prints on
    stdout for it, byte for byte but for the values that differ from run to run (see
    normalize_output). None for a command whose output the document does not show.
    """
    section = doc_section(text, section_title)
    examples = []
    previous = None  # the language of the block before, when it was an ```sh block
    for language, block in re.findall(r"^```(\w*)\n(.*?)^```", section, re.M | re.S):
        if language == "json" and previous == "sh" and examples:
            command, fails, _ = examples[-1]
            examples[-1] = (command, fails, block)
        elif language == "sh":
            examples.extend((c, f, None) for c, f in _block_commands(block))
        previous = language
    return examples


def _block_commands(block):
    commands = []
    lines = block.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        command = [line]
        while _continues("\n".join(command)) and i < len(lines):
            command.append(lines[i])
            i += 1
        head = "\n".join(command)
        fails = _FAILS.search(command[-1])
        for match in _HEREDOC.finditer(head):
            terminator = match.group(2)
            while i < len(lines):
                command.append(lines[i])
                i += 1
                if command[-1].strip() == terminator:
                    break
            else:
                raise AssertionError("heredoc %s never ends in: %s" % (terminator, head))
        commands.append(("\n".join(command), fails.group(1) if fails else None))
    return commands


_UID = re.compile(r'"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"')
_TIME = re.compile(r'"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z"')
_QUOTED_NUMBER = re.compile(r'"\d+"')
_IDENTITY = re.compile(r'("holderIdentity": )"[^"]*"')
_CAPTURE = re.compile(r"^([A-Za-z_][A-Za-z_0-9]*)=\$\(")


def normalize_output(text, numbers=True):
    """grpcurl's output with the values that differ from run to run replaced: uids, times, and
    (numbers=False) the quoted numbers that depend on how many writes came before (a
    resourceVersion, a generation)."""
    text = _UID.sub('"<uid>"', text)
    text = _TIME.sub('"<time>"', text)
    text = _IDENTITY.sub(r'\1"<identity>"', text)  # a replica's host name and random suffix
    if not numbers:
        text = _QUOTED_NUMBER.sub('"<n>"', text)
    return text


_MAX_TIME = re.compile(r"(\s-max-time\s+)(\d+(?:\.\d*)?)(?=\s)")


def with_min_max_time(command):
    """command, with a -max-time below DOC_COMMAND_MIN_MAX_TIME raised to it."""
    return _MAX_TIME.sub(
        lambda m: m.group(1) + "%g" % max(float(m.group(2)), DOC_COMMAND_MIN_MAX_TIME),
        command)


def check_capture(command):
    """command, followed by a check that the shell variable it captures (VAR=$(...)) is not
    empty: a pattern that matches nothing in grpcurl's output makes the command fail."""
    match = _CAPTURE.match(command)
    if match is None:
        return command
    return '%s\n[ -n "$%s" ] || { echo "%s is empty" >&2; false; }' % (
        command, match.group(1), match.group(1))


def assert_shown_output(test, shown, out, what, numbers=True):
    """A document's shown output of a command is what it printed (see normalize_output). The
    documents' watches ask for no periodic bookmarks (allow_bookmarks), so a watch prints no
    BOOKMARK but the one that ends its initial events, however long it runs."""
    test.assertEqual(normalize_output(shown, numbers), normalize_output(out, numbers),
                     "the document shows another output than grpcurl prints for\n" + what)


def _continues(text):
    """Whether shell text is cut short: inside a quoted string or after a trailing backslash."""
    quote = None
    i = 0
    while i < len(text):
        c = text[i]
        if quote == "'":
            if c == "'":
                quote = None
        elif c == "\\":
            if i + 1 == len(text):
                return True  # A line continuation.
            i += 1
        elif quote == '"':
            if c == '"':
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or text[i - 1] in " \t\n"):
            newline = text.find("\n", i)
            if newline < 0:
                break
            i = newline
        i += 1
    return quote is not None


class ReadmeExamplesTest(unittest.TestCase):
    """docs/api-by-example.md, run against a fresh shard store and a fresh cache."""

    @classmethod
    def setUpClass(cls):
        cls.shard = Server("shard").start()
        cls.cache = Server("cache").start()

    @classmethod
    def tearDownClass(cls):
        cls.shard.stop()
        cls.cache.stop()

    def test_ApiExamples_RunAsDocumented(self):
        examples = doc_examples(read_doc(API_DOC), API_SECTION)
        commands = [(c, f) for c, f, _ in examples]
        self.assertGreaterEqual(len(commands), 10, "too few grpcurl examples in " + API_DOC)
        self.assertGreaterEqual(len([s for _, _, s in examples if s is not None]), 5,
                                "too few outputs shown in " + API_DOC)
        for command, _ in commands:
            self.assertIn("grpcurl ", command)

        out_dir = tempfile.mkdtemp(prefix="api.", dir=ARGS.work_dir)
        # One shell for all, so that a variable set by one command serves the next ones.
        script = [
            "set -o pipefail",
            # grpcurl's flags may be given again: a documented command's own -max-time wins.
            'grpcurl() { %s %s -work-dir %s -grpc-proto-dir %s -max-time %d "$@"; }' % (
                shell_quote(sys.executable), shell_quote(GRPCURL_LITE),
                shell_quote(ARGS.work_dir), shell_quote(ARGS.grpc_proto_dir),
                DOC_COMMAND_MAX_TIME),
        ]
        for n, (command, _) in enumerate(commands):
            command = command.replace(DOCUMENTED_SHARD_ADDRESS, self.shard.address)
            command = command.replace(DOCUMENTED_CACHE_ADDRESS, self.cache.address)
            base = os.path.join(out_dir, str(n))
            script += ["{", check_capture(with_min_max_time(command)),
                       "} >%s.out 2>%s.err" % (base, base),
                       "echo $? >%s.rc" % base]
        script_path = os.path.join(out_dir, "examples.sh")
        with open(script_path, "w") as f:
            f.write("\n".join(script) + "\n")
        run = subprocess.run(["/bin/bash", script_path], capture_output=True, text=True,
                             timeout=DOC_SCRIPT_TIMEOUT)
        self.assertEqual(run.returncode, 0, "%s\n%s" % (run.stdout, run.stderr))

        for n, (command, fails, shown) in enumerate(examples):
            rc, out, err = command_result(out_dir, n)
            what = "%s command %d:\n%s\nexit code %d\nstdout:\n%s\nstderr:\n%s" % (
                API_DOC, n + 1, command, rc, out[-3000:], err[-3000:])
            with self.subTest(command=n + 1):
                if fails is None:
                    self.assertEqual(rc, 0, what)
                else:
                    code = grpcurl_lite.code_from_name(fails)
                    self.assertEqual(rc, grpcurl_lite.STATUS_CODE_OFFSET + code.value[0], what)
                    self.assertIn("Code: %s\n" % grpcurl_lite.code_name(code), err, what)
                if shown is not None:
                    # Fresh stores and no replicator: the resourceVersions shown are exact.
                    assert_shown_output(self, shown, out, what)


class _Shell:
    """One bash process that runs commands one at a time, so that shell variables set by one
    command serve the next ones while Python checks each command's output in between."""

    def __init__(self, out_dir, preamble):
        self.out_dir = out_dir
        self.count = 0
        self.stderr = open(os.path.join(out_dir, "shell.err"), "w")
        self.process = subprocess.Popen(["/bin/bash"], stdin=subprocess.PIPE,
                                        stdout=self.stderr, stderr=self.stderr, text=True,
                                        cwd=out_dir)
        self.process.stdin.write("\n".join(preamble) + "\n")
        self.process.stdin.flush()

    def run(self, command):
        """Runs command; returns (exit code, stdout, stderr, path prefix of its files)."""
        self.count += 1
        base = os.path.join(self.out_dir, str(self.count))
        self.process.stdin.write("{\n%s\n} >%s.out 2>%s.err </dev/null\n"
                                 "echo $? >%s.rc.tmp && mv %s.rc.tmp %s.rc\n" % (
                                     command, base, base, base, base, base))
        self.process.stdin.flush()
        deadline = time.monotonic() + COMMAND_TIMEOUT
        while not os.path.exists(base + ".rc"):
            if self.process.poll() is not None:
                raise AssertionError("the shell exited (%d) running:\n%s" % (
                    self.process.returncode, command))
            if time.monotonic() > deadline:
                raise AssertionError("no end within %.0f s of:\n%s" % (COMMAND_TIMEOUT, command))
            time.sleep(0.02)
        rc, out, err = command_result(self.out_dir, self.count)
        return rc, out, err, base

    def close(self):
        try:
            self.process.stdin.close()
            self.process.wait(timeout=SERVER_STOP_GRACE)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()
        self.stderr.close()


def _json(out):
    return grpcurl_lite.json_values_from_text(out)


def _names(items):
    return sorted(i["metadata"]["name"] for i in items)


def _condition(status, type_):
    for c in status.get("conditions", []):
        if c.get("type") == type_:
            return c
    raise AssertionError("no condition %s in %s" % (type_, status))


def _ok(t, rc, out, err):
    t.assertEqual(rc, 0)


def _leading(t, rc, out, err):
    t.assertEqual(rc, 0)
    t.assertRegex(out.strip(), r'^shardcache_leader_election_leading\{lease="[^" ]+"\} 1$')


def _created_named(name):
    def check(t, rc, out, err):
        t.assertEqual(rc, 0)
        t.assertEqual(_json(out)[0]["metadata"]["name"], name)
    return check


def _written_three(t, rc, out, err):
    t.assertEqual(rc, 0)
    answers = _json(out)
    t.assertEqual([a.get("id") for a in answers], ["1", "2", "3"])
    t.assertEqual([a.get("code", 0) for a in answers], [0, 0, 0])


def _ccr_ready(t, rc, out, err):
    t.assertEqual(rc, 0)
    ccr = _json(out)[0]
    t.assertIn("cache.shardcache.io/replicator", ccr["metadata"].get("finalizers", []))
    status = ccr.get("status", {})
    t.assertEqual(status.get("phase"), "Ready")
    t.assertEqual(status.get("observedGeneration"), 1)
    valid = _condition(status, "ResourceValid")
    t.assertEqual((valid["status"], valid["reason"]), ("True", "Valid"))
    started = _condition(status, "ReplicationStarted")
    t.assertEqual((started["status"], started["reason"]), ("True", "Started"))
    t.assertEqual(status.get("resourceCounts"), {"local": 2, "cache": 2})


def _copies_of(*names):
    def check(t, rc, out, err):
        t.assertEqual(rc, 0)
        items = _json(out)[0].get("items", [])
        t.assertEqual(_names(items), list(names))
        for item in items:
            meta = item["metadata"]
            t.assertEqual(meta.get("shard"), "a")
            t.assertEqual(meta.get("cluster"), "root")
            annotations = meta.get("annotations", {})
            t.assertEqual(annotations.get("cache.shardcache.io/original-uid"), meta["uid"])
            t.assertRegex(annotations.get("cache.shardcache.io/original-resource-version", ""),
                          r"^[0-9]+$")
            t.assertEqual(meta.get("labels"), {"cache": "yes"})
            t.assertNotIn("finalizers", meta)
    return check


def _ccr_copy(t, rc, out, err):
    t.assertEqual(rc, 0)
    items = _json(out)[0].get("items", [])
    t.assertEqual(_names(items), ["gadgets"])
    t.assertEqual(items[0]["metadata"].get("shard"), "a")
    t.assertEqual(items[0]["spec"]["resource"], "gadgets")


def _deleted(t, rc, out, err):
    t.assertEqual(rc, 0)
    t.assertIs(_json(out)[0].get("deleted"), True)


def _watch_shows(*names):
    def check(t, rc, out, err):
        t.assertEqual(rc, grpcurl_lite.STATUS_CODE_OFFSET + grpc.StatusCode.DEADLINE_EXCEEDED.value[0])
        events = _json(out)
        types = [e["type"] for e in events]
        # The initial events and their bookmark; no periodic bookmark, none was asked for.
        t.assertEqual(types[-1:], ["BOOKMARK"], out)
        t.assertEqual([(e["type"], e["object"]["metadata"].get("name")) for e in events[:-1]],
                      [("ADDED", n) for n in names])
    return check


def _copy_restored(t, rc, out, err):
    t.assertEqual(rc, 0)
    copy = _json(out)[0]
    t.assertEqual((copy["metadata"]["shard"], copy["metadata"]["name"]), ("a", "gadget-1"))


def _lease(t, rc, out, err):
    t.assertEqual(rc, 0)
    spec = _json(out)[0]["spec"]
    t.assertTrue(spec.get("holderIdentity"))
    t.assertGreaterEqual(spec.get("leaseTransitions", 0), 1)


def _ccr_held(t, rc, out, err):
    t.assertEqual(rc, 0)
    answer = _json(out)[0]
    t.assertNotIn("deleted", answer)  # false: proto3 JSON leaves it out
    t.assertIn("deletion_timestamp", answer["object"]["metadata"])


def _ccr_deletion_watched(t, rc, out, err):
    t.assertEqual(rc, grpcurl_lite.STATUS_CODE_OFFSET + grpc.StatusCode.DEADLINE_EXCEEDED.value[0])
    events = _json(out)
    t.assertTrue(events)
    phases = [e["object"].get("status", {}).get("phase") for e in events
              if e["type"] == "MODIFIED"]
    t.assertIn("Deleting", phases)
    t.assertIn("Deleted", phases)
    t.assertLess(phases.index("Deleting"), phases.index("Deleted"))
    t.assertEqual(events[-1]["type"], "DELETED")


def _empty_list(t, rc, out, err):
    t.assertEqual(rc, 0)
    t.assertEqual(_json(out)[0].get("items", []), [])


# What each command of docs/replication-by-example.md must print, in order:
# (a piece of the command's text, the check, whether to run it again until the check passes).
REPLICATION_CHECKS = [
    ("/readyz", _ok, False),
    ("shardcache_leader_election_leading", _leading, True),
    ("gadgets.example.com", _created_named("gadgets.example.com"), False),
    ("Store/Write", _written_three, False),
    ("Store/Create", _created_named("gadgets"), False),
    ("Store/Get", _ccr_ready, True),
    ("7070 shardcache.v1.Store/List", _copies_of("gadget-1", "gadget-2"), True),
    ("7070 shardcache.v1.Store/List", _ccr_copy, True),
    ("Store/Update", _ok, False),
    ("Store/Delete", _deleted, False),
    ("7070 shardcache.v1.Store/Watch", _watch_shows("gadget-1", "gadget-3"), True),
    ("7070 shardcache.v1.Store/Delete", _deleted, False),
    ("7070 shardcache.v1.Store/Get", _copy_restored, True),
    ('"leases"', _lease, False),
    ("RV=$(", _ok, False),
    ("Store/Delete", _ccr_held, False),
    ("7071 shardcache.v1.Store/Watch", _ccr_deletion_watched, True),
    ("7070 shardcache.v1.Store/List", _empty_list, True),
    ("7070 shardcache.v1.Store/List", _empty_list, True),
]

# What each command of README.md's "## Quick start" must print, in order, as above.
QUICK_START_CHECKS = [
    ("/readyz", _ok, False),
    ("gadgets.example.com", _created_named("gadgets.example.com"), False),
    ("Store/Write", _written_three, False),
    ("Store/Create", _created_named("gadgets"), False),
    ("7070 shardcache.v1.Store/List", _copies_of("gadget-1", "gadget-2"), True),
    ("Store/Update", _ok, False),
    ("7070 shardcache.v1.Store/Watch", _watch_shows("gadget-1", "gadget-2", "gadget-3"), True),
]


class _DeploymentTest(unittest.TestCase):
    """scripts/run.sh's deployment, fresh for each test class: a shard store, a cache and a
    shard_replicator for shard "a", ready, and a shell that runs documented commands there."""

    @classmethod
    def setUpClass(cls):
        cls.shard = Server("shard").start()
        cls.cache = Server("cache").start()
        cls.replicator = Replicator("a", cls.shard, cls.cache).start().wait_ready()

    @classmethod
    def tearDownClass(cls):
        cls.replicator.stop()
        cls.shard.stop()
        cls.cache.stop()

    def localize(self, command):
        command = command.replace(DOCUMENTED_SHARD_ADDRESS, self.shard.address)
        command = command.replace(DOCUMENTED_CACHE_ADDRESS, self.cache.address)
        return command.replace(DOCUMENTED_REPLICATOR_HTTP_ADDRESS, self.replicator.http_address)

    def open_shell(self, prefix):
        out_dir = tempfile.mkdtemp(prefix=prefix, dir=ARGS.work_dir)
        return _Shell(out_dir, [
            "set -o pipefail",
            'grpcurl() { %s %s -work-dir %s -grpc-proto-dir %s -max-time %d "$@"; }' % (
                shell_quote(sys.executable), shell_quote(GRPCURL_LITE),
                shell_quote(ARGS.work_dir), shell_quote(ARGS.grpc_proto_dir),
                DOC_COMMAND_MAX_TIME),
            # curl with a deadline; without curl, python's urllib in its place (GET only).
            "if command -v curl >/dev/null; then",
            '  curl() { command curl --max-time 10 "$@"; }',
            "else",
            "  curl() { %s -c 'import sys, urllib.request; sys.stdout.write(urllib.request"
            ".urlopen(\"http://\" + sys.argv[-1], timeout=10).read().decode())' \"$@\"; }" %
            shell_quote(sys.executable),
            "fi",
        ])

    def assert_commands_and_checks(self, doc, commands, checks):
        """Every command runs grpcurl or curl, and each has its check."""
        self.assertEqual(
            [c for c, _ in commands if not re.search(r"\b(grpcurl|curl) ", c)], [],
            "every command of %s runs grpcurl or curl" % doc)
        self.assertEqual(len(commands), len(checks),
                         "%s's commands and their checks differ:\n" % doc +
                         "\n---\n".join(c for c, _ in commands))

    def run_checked(self, shell, doc, examples, checks):
        """Runs each documented command in shell and checks what it printed (and, where the
        document shows an output, that it is that one, resourceVersions aside)."""
        for n, ((command, _, shown), (piece, check, eventually)) in enumerate(
                zip(examples, checks)):
            self.assertIn(piece, command, "%s command %d is not the one its checks expect" % (
                doc, n + 1))
            deadline = time.monotonic() + EVENTUALLY_TIMEOUT
            while True:
                rc, out, err, base = shell.run(check_capture(self.localize(command)))
                try:
                    check(self, rc, out, err)
                    if shown is not None:
                        # resourceVersions depend on the replicator's lease renewals.
                        assert_shown_output(self, shown, out, command, numbers=False)
                    break
                except (AssertionError, KeyError, IndexError, ValueError) as e:
                    if eventually and time.monotonic() < deadline:
                        time.sleep(EVENTUALLY_INTERVAL)
                        continue
                    self.fail("%s command %d (%s):\n%s\n%s: %s\n"
                              "exit code %d\nstdout:\n%s\nstderr:\n%s\nreplicator log:\n%s" % (
                                  doc, n + 1, base, command, type(e).__name__, e, rc,
                                  out[-3000:], err[-3000:], self.replicator.log()))


class ReplicationExamplesTest(_DeploymentTest):
    """docs/api-by-example.md, then docs/replication-by-example.md, against scripts/run.sh's
    deployment."""

    def test_ReplicationExamples_RunAsDocumented(self):
        api_commands = doc_commands(read_doc(API_DOC), API_SECTION)
        examples = doc_examples(read_doc(REPLICATION_DOC), REPLICATION_SECTION)
        self.assert_commands_and_checks(REPLICATION_DOC, [(c, f) for c, f, _ in examples],
                                        REPLICATION_CHECKS)
        shell = self.open_shell("replication.")
        try:
            # The API examples first, as a reader of the documents runs them, with the
            # replicator writing its lease to the shard store all along.
            for command, fails in api_commands:
                rc, out, err, _ = shell.run(check_capture(self.localize(command)))
                what = "%s command:\n%s\nexit code %d\nstdout:\n%s\nstderr:\n%s" % (
                    API_DOC, command, rc, out[-3000:], err[-3000:])
                if fails is None:
                    self.assertEqual(rc, 0, what)
                else:
                    code = grpcurl_lite.code_from_name(fails)
                    self.assertEqual(rc, grpcurl_lite.STATUS_CODE_OFFSET + code.value[0], what)
            self.run_checked(shell, REPLICATION_DOC, examples, REPLICATION_CHECKS)
        finally:
            shell.close()


class QuickStartTest(_DeploymentTest):
    """README.md's quick start, against scripts/run.sh's deployment on fresh stores."""

    def test_QuickStart_RunsAsDocumented(self):
        text = read_doc(README)
        examples = doc_examples(text, QUICK_START_SECTION)
        self.assert_commands_and_checks(README, [(c, f) for c, f, _ in examples],
                                        QUICK_START_CHECKS)
        # The stand-in for grpcurl that the quick start names is the one the tests run.
        alias = re.search(r"^alias grpcurl='/usr/bin/python3 (\S+)'$",
                          doc_section(text, QUICK_START_SECTION), re.M)
        self.assertIsNotNone(alias, "the quick start names no stand-in for grpcurl")
        self.assertEqual(alias.group(1), os.path.relpath(GRPCURL_LITE, SOURCE_DIR))
        shell = self.open_shell("quickstart.")
        try:
            self.run_checked(shell, README, examples, QUICK_START_CHECKS)
        finally:
            shell.close()


def shell_quote(s):
    return "'" + s.replace("'", "'\\''") + "'"


# ----------------------------------------------------------------------------------------------


class CountingResult(unittest.TextTestResult):
    """Counts successful tests, so that the summary line need not infer them."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.passed = 0

    def addSuccess(self, test):
        super().addSuccess(test)
        self.passed += 1


def main():
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", required=True, help="the cache_server binary")
    parser.add_argument("--grpc-proto-dir", default=grpcurl_lite.DEFAULT_GRPC_PROTO_DIR,
                        help="where gRPC's protos are (Debian's grpc-proto package)")
    parser.add_argument("--work-dir", required=True,
                        help="scratch directory (server data, logs, generated code)")
    parser.add_argument("--source-dir", default=SOURCE_DIR,
                        help="the source tree whose README.md and docs/ hold the examples")
    parser.add_argument("--replicator", help="the shard_replicator binary; without it, "
                        "ReplicationExamplesTest and QuickStartTest do not run")
    parser.add_argument("tests", nargs="*", help="test names to run (default: all)")
    ARGS = parser.parse_args()
    ARGS.server = os.path.abspath(ARGS.server)
    ARGS.source_dir = os.path.abspath(ARGS.source_dir)
    if ARGS.replicator:
        ARGS.replicator = os.path.abspath(ARGS.replicator)
    # A fresh directory of this run's own inside the one given, kept only when a test fails.
    os.makedirs(ARGS.work_dir, exist_ok=True)
    ARGS.work_dir = tempfile.mkdtemp(prefix="run.", dir=os.path.abspath(ARGS.work_dir))

    loader = unittest.TestLoader()
    if ARGS.tests:
        suite = loader.loadTestsFromNames(ARGS.tests, sys.modules[__name__])
    else:
        cases = [ReflectionTest, ReadmeExamplesTest]
        if ARGS.replicator:
            cases += [ReplicationExamplesTest, QuickStartTest]
        suite = unittest.TestSuite([loader.loadTestsFromTestCase(c) for c in cases])
    runner = unittest.TextTestRunner(stream=sys.stdout, verbosity=2, resultclass=CountingResult)
    passed, failed = 0, 1
    try:
        result = runner.run(suite)
        passed = result.passed
        failed = (len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses))
    finally:
        stop_all_servers()
        if failed:
            print("logs, generated code and documented command outputs: %s" % ARGS.work_dir)
        else:
            shutil.rmtree(ARGS.work_dir, ignore_errors=True)
        print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
