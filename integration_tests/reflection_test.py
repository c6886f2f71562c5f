#!/usr/bin/python3
"""The reflection test: cache_server as seen by a client that knows only gRPC reflection.

  /usr/bin/python3 reflection_test.py --server build/cache_server/cache_server \\
      --grpc-proto-dir /usr/share/grpc-proto --work-dir /tmp/reflection_test

Two test cases, each against servers of its own that it starts on loopback ports it lets the
server pick (--listen=127.0.0.1:0, --port-file):

- ReflectionTest: with grpcurl_lite's machinery (no shardcache proto is compiled in), lists the
  services, resolves every method of every service and every type they reach, describes
  grpc.health.v1.Health, calls Health/Check, then creates a ResourceDefinition and an object
  from JSON text, reads it back, lists with a label selector and watches with -max-time.
- ReadmeExamplesTest: runs every grpcurl command of README.md's "## The API by example"
  section, in order, with grpcurl_lite.py in grpcurl's place and the documented addresses
  (127.0.0.1:7071 for the shard store, 127.0.0.1:7070 for the cache) pointing at a fresh shard
  server and a fresh cache server. Each command must exit 0, unless its line ends with a comment
  "# fails: CODE" (a gRPC code as grpcurl prints it, e.g. NotFound): then it must fail with it.

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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # No __pycache__ in the source tree.
import grpcurl_lite  # noqa: E402  pylint: disable=wrong-import-position

import grpc  # noqa: E402  pylint: disable=wrong-import-position

GRPCURL_LITE = os.path.join(HERE, "grpcurl_lite.py")
README = os.path.join(os.path.dirname(HERE), "README.md")
README_SECTION = "## The API by example"
DOCUMENTED_SHARD_ADDRESS = "127.0.0.1:7071"
DOCUMENTED_CACHE_ADDRESS = "127.0.0.1:7070"

# Deadlines: every call and every wait below has one.
SERVER_START_TIMEOUT = 30.0
SERVER_STOP_GRACE = 10.0
CALL_TIMEOUT = 10.0
COMMAND_TIMEOUT = 60.0  # one grpcurl_lite.py process
README_COMMAND_MAX_TIME = 20  # -max-time given to README commands that set none themselves
README_SCRIPT_TIMEOUT = 150.0

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

    def start(self):
        command = [ARGS.server, "--role=" + self.role, "--listen=127.0.0.1:0",
                   "--http-listen=127.0.0.1:0", "--port-file=" + self.port_file]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(command, cwd=self.dir, stdout=log,
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
            ("Get", "List", "Watch", "Create", "Update", "UpdateStatus", "Delete", "Write")))

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
        self.assertGreater(int(meta["resourceVersion"]), 1)
        self.assertEqual(meta["generation"], "1")  # int64: a string in proto3 JSON.
        self.assertRegex(meta["creationTimestamp"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d")
        self.assertNotIn("shard", meta)

        listed = self.call("shardcache.v1.Store/List", json.dumps({
            "resource": WIDGETS, "cluster": "root:org",
            "labelSelector": "app=web,tier in (front,back)"}))[0]
        self.assertEqual([i["metadata"]["name"] for i in listed["items"]], ["alpha"])
        self.assertGreaterEqual(int(listed["resourceVersion"]), int(meta["resourceVersion"]))
        listed = self.call("shardcache.v1.Store/List", json.dumps({
            "resource": WIDGETS, "labelSelector": "app=web"}))[0]
        self.assertEqual([i["metadata"]["name"] for i in listed["items"]], ["alpha", "beta"])

        # A watch from now, ended by -max-time as grpcurl ends it: DeadlineExceeded (64 + 4).
        cli = run_grpcurl_lite([
            "-plaintext", "-max-time", "2", "-d",
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
        self.assertEqual(events[1]["object"]["metadata"]["resourceVersion"],
                         listed["resourceVersion"])

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


# ----------------------------------------------------------------------------------------------
# README.md's examples.

_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][A-Za-z_0-9]*)\1")
_FAILS = re.compile(r"#\s*fails:\s*([A-Za-z_]+)")


def readme_commands(text):
    """The commands of the ```sh blocks of the API section, in order, as (command, fails) pairs.

    A command is a line with its continuation lines (trailing backslash) and its heredoc bodies;
    fails is the code named by a trailing "# fails: CODE" comment, or None. Comment lines and
    blank lines are skipped.
    """
    start = text.find("\n" + README_SECTION + "\n")
    if start < 0:
        raise AssertionError("README.md has no section %r" % README_SECTION)
    section = text[start + len(README_SECTION) + 2:]
    following = re.search(r"^## ", section, re.M)
    if following:
        section = section[:following.start()]
    blocks = re.findall(r"^```sh\n(.*?)^```", section, re.M | re.S)
    commands = []
    for block in blocks:
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
    """README.md's API examples, run against a fresh shard store and a fresh cache."""

    @classmethod
    def setUpClass(cls):
        cls.shard = Server("shard").start()
        cls.cache = Server("cache").start()

    @classmethod
    def tearDownClass(cls):
        cls.shard.stop()
        cls.cache.stop()

    def test_ApiExamples_RunAsDocumented(self):
        with open(ARGS.readme) as f:
            commands = readme_commands(f.read())
        self.assertGreaterEqual(len(commands), 10, "too few grpcurl examples in README.md")
        for command, _ in commands:
            self.assertIn("grpcurl ", command)

        out_dir = tempfile.mkdtemp(prefix="readme.", dir=ARGS.work_dir)
        # One shell for all, so that a variable set by one command serves the next ones.
        script = [
            "set -o pipefail",
            # grpcurl's flags may be given again: a README command's own -max-time wins.
            'grpcurl() { %s %s -work-dir %s -grpc-proto-dir %s -max-time %d "$@"; }' % (
                shell_quote(sys.executable), shell_quote(GRPCURL_LITE),
                shell_quote(ARGS.work_dir), shell_quote(ARGS.grpc_proto_dir),
                README_COMMAND_MAX_TIME),
        ]
        for n, (command, _) in enumerate(commands):
            command = command.replace(DOCUMENTED_SHARD_ADDRESS, self.shard.address)
            command = command.replace(DOCUMENTED_CACHE_ADDRESS, self.cache.address)
            base = os.path.join(out_dir, str(n))
            script += ["{", command, "} >%s.out 2>%s.err" % (base, base),
                       "echo $? >%s.rc" % base]
        script_path = os.path.join(out_dir, "examples.sh")
        with open(script_path, "w") as f:
            f.write("\n".join(script) + "\n")
        run = subprocess.run(["/bin/bash", script_path], capture_output=True, text=True,
                             timeout=README_SCRIPT_TIMEOUT)
        self.assertEqual(run.returncode, 0, "%s\n%s" % (run.stdout, run.stderr))

        for n, (command, fails) in enumerate(commands):
            base = os.path.join(out_dir, str(n))
            with open(base + ".rc") as f:
                rc = int(f.read())
            with open(base + ".out", errors="replace") as f:
                out = f.read()
            with open(base + ".err", errors="replace") as f:
                err = f.read()
            what = "README command %d:\n%s\nexit code %d\nstdout:\n%s\nstderr:\n%s" % (
                n + 1, command, rc, out[-3000:], err[-3000:])
            with self.subTest(command=n + 1):
                if fails is None:
                    self.assertEqual(rc, 0, what)
                else:
                    code = grpcurl_lite.code_from_name(fails)
                    self.assertEqual(rc, grpcurl_lite.STATUS_CODE_OFFSET + code.value[0], what)
                    self.assertIn("Code: %s\n" % grpcurl_lite.code_name(code), err, what)


def shell_quote(s):
    return "'" + s.replace("'", "'\\''") + "'"


# ----------------------------------------------------------------------------------------------


class _CountingResult(unittest.TextTestResult):
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
    parser.add_argument("--readme", default=README, help="the README.md with the API examples")
    parser.add_argument("tests", nargs="*", help="test names to run (default: all)")
    ARGS = parser.parse_args()
    ARGS.server = os.path.abspath(ARGS.server)
    # A fresh directory of this run's own inside the one given, kept only when a test fails.
    os.makedirs(ARGS.work_dir, exist_ok=True)
    ARGS.work_dir = tempfile.mkdtemp(prefix="run.", dir=os.path.abspath(ARGS.work_dir))

    loader = unittest.TestLoader()
    if ARGS.tests:
        suite = loader.loadTestsFromNames(ARGS.tests, sys.modules[__name__])
    else:
        suite = unittest.TestSuite([loader.loadTestsFromTestCase(ReflectionTest),
                                    loader.loadTestsFromTestCase(ReadmeExamplesTest)])
    runner = unittest.TextTestRunner(stream=sys.stdout, verbosity=2, resultclass=_CountingResult)
    passed, failed = 0, 1
    try:
        result = runner.run(suite)
        passed = result.passed
        failed = (len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses))
    finally:
        for server in SERVERS:
            try:
                server.stop()
            except Exception as e:  # pylint: disable=broad-except
                sys.stderr.write("stopping the %s server: %s\n" % (server.role, e))
                if server.process is not None and server.process.poll() is None:
                    server.process.kill()
        if failed:
            print("logs, generated code and README command outputs: %s" % ARGS.work_dir)
        else:
            shutil.rmtree(ARGS.work_dir, ignore_errors=True)
        print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
