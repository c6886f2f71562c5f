#!/usr/bin/python3
"""The kube API test: the cache's read-only Kubernetes REST view (--kube-api-listen), end to end,
through kubectl and through a reflector written to client-go's protocol.

  /usr/bin/python3 kube_api_test.py --server build/cache_server/cache_server \\
      --replicator build/shard_replicator/shard_replicator \\
      --grpc-proto-dir /usr/share/grpc-proto --work-dir /tmp/kube_api_test [--kubectl PATH]

Each test class starts, as docs/replication-by-example.md's deployment and on loopback ports that
the processes pick (port 0 and --port-file), a shard store (--role=shard --shard=a), a cache
(--role=cache --kube-api-listen=127.0.0.1:0, plus the class's flags) and a shard_replicator for
shard "a" (reflection_test.py's Server and Replicator). Except DocExamplesTest, it then defines
`widgets` (group example.com, namespaced) in the shard store, creates widgets in two namespaces of
cluster "root" and in cluster "root:org", with labels, and in each cluster a ClusterCachedResource
that selects those labelled cache=yes (WIDGET_OBJECTS below), and waits for their copies in the
cache.

- KubectlTest: kubectl (the one on PATH, or --kubectl) with no kubeconfig of the user's
  (--kubeconfig=/dev/null, a --cache-dir and HOME of its own) and --server pointing at the view:
  get with -A, -n, -o wide, -o json, -l, --field-selector, --chunk-size=1, api-resources, the
  cluster-scoped CCR copies, every path prefix (kcp's /services/cache/shards/{shard}/clusters/
  {cluster} with names and with *, /clusters/{cluster}, the root) and a shard that has no objects,
  a core-group resource (/api/v1) of another shard; get --watch seeing a change made in the shard
  store; delete, apply, create and label refused with MethodNotAllowed and nothing changed. Then
  raw HTTP/1.1 requests: discovery, 404s, every write verb (405) and malformed parameters (400),
  each answered with a Kubernetes Status.
- ReflectorTest (the cache with --history-events=5): what client-go's reflector sends and expects,
  with http.client only and Go's headers (it asks for gzip, so a stream the server compresses
  must still bring each event as it comes): a list in pages (limit, continue) that is one snapshot even when the
  store changes between its pages, the first list of an informer (resourceVersion=0), lists at an
  exact and at a not-older-than resourceVersion, a watch from the list's resourceVersion with
  bookmarks that keeps a store equal to a fresh list through a change, a create and a delete;
  watches with selectors and a cluster prefix, with timeoutSeconds, with sendInitialEvents; an
  idle watch without bookmarks that the view ends soon after its client leaves; and,
  from a resourceVersion that has left the history window, HTTP 200 then one ERROR event (Status
  410 Expired) that ends the stream, after which a relist and a new watch work.
- SlowReaderTest (the cache with --watch-queue-bytes=16384 and --watch-stall-timeout=5s): a
  burst of 40 copies of 24 KiB watched by a client that reads everything, one that reads nothing
  until the burst is in the cache, and one that never reads (both with a 4 KiB receive buffer):
  every write reaches the cache and the reader; the pausing watcher is caught up from the history
  with every event in the reader's order; the silent one is ended as too slow, and finds a prefix
  of the burst then an ERROR event.
- StartupTest: the view is off by default (no kube_api_port in the port file).
- DocExamplesTest: README.md's quick start (its commands and checks, from reflection_test.py),
  then every ```sh command of docs/kubectl.md, in one shell, with kubectl isolated as above and
  the documented addresses (127.0.0.1:8073 for the view) pointing at this test's processes. Each
  command's output is checked (KUBECTL_DOC_CHECKS), and where the page shows it (a ``` or ```json
  block right after the ```sh block), it must be what the command printed, ages, uids, times and
  resourceVersions aside.

Every wait is bounded (WAIT_TIMEOUT) and every kubectl runs with a timeout. Prints "N passed, M
failed" last and exits non-zero on any failure; every process is stopped at the end.
"""

import argparse
import base64
import datetime
import gzip
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.parse
import urllib.request
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # No __pycache__ in the source tree.
import grpcurl_lite  # noqa: E402  pylint: disable=wrong-import-position
import reflection_test as rt  # noqa: E402  pylint: disable=wrong-import-position

import grpc  # noqa: E402  pylint: disable=wrong-import-position

KUBECTL_DOC = os.path.join("docs", "kubectl.md")
KUBECTL_DOC_SECTION = "# The cache with kubectl and client-go"
DOCUMENTED_KUBE_API_ADDRESS = "127.0.0.1:8073"

WAIT_TIMEOUT = 30.0  # for a copy to reach the cache, an event, kubectl to print something
WAIT_INTERVAL = 0.1
CALL_TIMEOUT = 10.0  # one gRPC call or HTTP request
KUBECTL_TIMEOUT = 60.0  # one kubectl run
STREAM_READ_TIMEOUT = 15.0  # one read on a watch stream (bookmarks come every second)
BOOKMARK_INTERVAL = "1s"
HISTORY_EVENTS = 5  # ReflectorTest's cache: a short history window, left with a few writes

ARGS = None

WIDGETS = rt.WIDGETS
WIDGETS_PATH = "/apis/example.com/v1/widgets"
CCRS = {"group": "cache.shardcache.io", "version": "v1alpha1",
        "resource": "clustercachedresources"}
ALL = "/services/cache/shards/*/clusters/*"  # kcp's cache-server scheme: every shard and cluster
ORIGINAL_RV = "cache.shardcache.io/original-resource-version"

# The widgets every class but DocExamplesTest creates in shard "a"'s store:
# (cluster, namespace, name, labels). Those labelled cache=yes are copied to the cache.
WIDGET_OBJECTS = [
    ("root", "dev", "widget-a", {"cache": "yes", "app": "web", "tier": "front"}),
    ("root", "dev", "widget-b", {"cache": "yes", "app": "web", "tier": "db"}),
    ("root", "dev", "widget-x", {"cache": "no", "app": "web", "tier": "front"}),
    ("root", "prod", "widget-c", {"cache": "yes", "app": "web", "tier": "front"}),
    ("root", "prod", "widget-d", {"cache": "yes", "app": "api", "tier": "db"}),
    ("root:org", "dev", "widget-e", {"cache": "yes", "app": "web", "tier": "front"}),
]
CLUSTERS = ("root", "root:org")
COPIED = [(c, ns, n) for c, ns, n, labels in WIDGET_OBJECTS if labels["cache"] == "yes"]
LABELS = {(c, ns, n): labels for c, ns, n, labels in WIDGET_OBJECTS}
AGE = re.compile(r"^(\d+[smhdy])+$")


# ----------------------------------------------------------------------------------------------
# Processes and stores.


class KubeCache(rt.Server):
    """A cache_server (role cache) with the REST view on a port it picks, and extra flags."""

    def __init__(self, flags=()):
        super().__init__("cache")
        self.flags = list(flags)
        self.kube_api_port = None

    def command(self):
        return super().command() + ["--kube-api-listen=127.0.0.1:0"] + self.flags

    def _read_ports(self):
        # The port file is complete once it names the view's port too.
        try:
            with open(self.port_file) as f:
                values = dict(line.strip().split("=", 1) for line in f if "=" in line)
            ports = int(values["grpc_port"]), int(values["http_port"])
            self.kube_api_port = int(values["kube_api_port"])
            return ports
        except (OSError, KeyError, ValueError):
            return None

    @property
    def kube_api_address(self):
        return "127.0.0.1:%d" % self.kube_api_port

    @property
    def url(self):
        return "http://" + self.kube_api_address


class ShardStore(rt.Server):
    """Shard "a"'s store."""

    def __init__(self):
        super().__init__("shard")

    def command(self):
        return super().command() + ["--shard=a"]


def new_client(server):
    return grpcurl_lite.Client(server.address, work_dir=ARGS.work_dir,
                               grpc_proto_dir=ARGS.grpc_proto_dir,
                               default_timeout=CALL_TIMEOUT, connect_timeout=CALL_TIMEOUT)


def call(client, method, request):
    """One unary call; the answer as a dict (proto field names, as grpcurl prints them)."""
    return [rt.message_dict(m) for m in client.invoke(method, [json.dumps(request)])][0]


def widget_object(cluster, namespace, name, labels, spec):
    return {"metadata": {"cluster": cluster, "namespace": namespace, "name": name,
                         "labels": labels}, "spec": spec}


def wait_for(what, condition, timeout=WAIT_TIMEOUT):
    """Calls condition() until it returns a true value, which it returns; fails after timeout."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            value = condition()
            if value:
                return value
        except (AssertionError, grpc.RpcError, OSError, ValueError, KeyError) as e:
            last = e
        if time.monotonic() > deadline:
            raise AssertionError("%s: not within %.0f s (last: %r)" % (what, timeout, last))
        time.sleep(WAIT_INTERVAL)


class _Deployment(unittest.TestCase):
    """A shard store, a cache with the REST view (CACHE_FLAGS beside it) and a shard_replicator
    for shard "a", ready; with WITH_WIDGETS, WIDGET_OBJECTS and a CCR per cluster in the shard
    store and the copies in the cache."""

    CACHE_FLAGS = ["--bookmark-interval=" + BOOKMARK_INTERVAL]
    WITH_WIDGETS = True

    @classmethod
    def setUpClass(cls):
        cls.shard = ShardStore().start()
        cls.cache = KubeCache(cls.CACHE_FLAGS).start()
        cls.replicator = rt.Replicator("a", cls.shard, cls.cache).start().wait_ready()
        cls.shard_client = new_client(cls.shard)
        cls.cache_client = new_client(cls.cache)
        cls.kubectl_home = tempfile.mkdtemp(prefix="kubectl.", dir=ARGS.work_dir)
        cls.kubectl_bin = make_kubectl_wrapper(cls.kubectl_home)
        if cls.WITH_WIDGETS:
            cls.create_widgets()

    @classmethod
    def tearDownClass(cls):
        cls.shard_client.close()
        cls.cache_client.close()
        cls.replicator.stop()
        cls.shard.stop()
        cls.cache.stop()

    @classmethod
    def create_widgets(cls):
        call(cls.shard_client, "shardcache.v1.Store/Create", json.loads(rt.WIDGETS_DEFINITION))
        for n, (cluster, namespace, name, labels) in enumerate(WIDGET_OBJECTS):
            call(cls.shard_client, "shardcache.v1.Store/Create", {
                "resource": WIDGETS,
                "object": widget_object(cluster, namespace, name, labels,
                                        {"size": n + 1, "color": "blue"})})
        for cluster in CLUSTERS:
            call(cls.shard_client, "shardcache.v1.Store/Create", {
                "resource": CCRS,
                "object": {"metadata": {"cluster": cluster, "name": "widgets"},
                           "spec": {"group": "example.com", "version": "v1",
                                    "resource": "widgets",
                                    "labelSelector": {"matchLabels": {"cache": "yes"}}}}})
        wait_for("the copies of %s in the cache" % COPIED,
                 lambda: sorted(cls.cache_copies()) == sorted(COPIED))
        wait_for("the CCRs' copies in the cache", lambda: sorted(
            i["metadata"]["cluster"] for i in call(cls.cache_client, "shardcache.v1.Store/List",
                                                   {"resource": CCRS, "shard": "a"}
                                                   ).get("items", [])) == list(CLUSTERS))

    @classmethod
    def cache_copies(cls):
        """The widget copies in the cache (gRPC, not the view): key -> object."""
        items = call(cls.cache_client, "shardcache.v1.Store/List",
                     {"resource": WIDGETS, "shard": "a"}).get("items", [])
        return {(i["metadata"]["cluster"], i["metadata"]["namespace"], i["metadata"]["name"]): i
                for i in items}

    @classmethod
    def cache_copy(cls, key):
        cluster, namespace, name = key
        return call(cls.cache_client, "shardcache.v1.Store/Get", {
            "resource": WIDGETS, "shard": "a", "cluster": cluster, "namespace": namespace,
            "name": name})

    def update_in_shard(self, key, spec, labels=None):
        """Updates a widget in the shard store (unconditionally) and waits for its copy to be
        updated in the cache; returns the copy."""
        cluster, namespace, name = key
        updated = call(self.shard_client, "shardcache.v1.Store/Update", {
            "resource": WIDGETS,
            "object": widget_object(cluster, namespace, name, labels or LABELS[key], spec)})
        rv = updated["metadata"]["resource_version"]
        return wait_for("the copy of %s/%s/%s at the shard's resourceVersion %s" % (
            cluster, namespace, name, rv), lambda: self._copy_at(key, rv))

    def _copy_at(self, key, origin_rv):
        copy = self.cache_copy(key)
        if copy["metadata"].get("annotations", {}).get(ORIGINAL_RV) == origin_rv:
            return copy
        return None

    def create_in_shard(self, key, labels, spec):
        cluster, namespace, name = key
        call(self.shard_client, "shardcache.v1.Store/Create", {
            "resource": WIDGETS, "object": widget_object(cluster, namespace, name, labels, spec)})
        return wait_for("the copy of new widget %s" % (key,), lambda: self.cache_copy(key))

    def delete_in_shard(self, key):
        cluster, namespace, name = key
        call(self.shard_client, "shardcache.v1.Store/Delete", {
            "resource": WIDGETS, "cluster": cluster, "namespace": namespace, "name": name})

        def gone():
            try:
                self.cache_copy(key)
            except grpc.RpcError as e:
                return e.code() == grpc.StatusCode.NOT_FOUND
            return False
        wait_for("the copy of deleted widget %s to go" % (key,), gone)

    def metric(self, name):
        """The value of an unlabelled metric of the cache (0 when it has none yet)."""
        url = "http://127.0.0.1:%d/metrics" % self.cache.http_port
        with urllib.request.urlopen(url, timeout=CALL_TIMEOUT) as response:
            for line in response.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        return 0.0

    def view_watches(self):
        """The watches of the view in progress (its shardcache_kube_api_watches gauge)."""
        return self.metric("shardcache_kube_api_watches")

    # The view over HTTP.

    def get(self, path, query=None, headers=None):
        return http_request(self.cache.kube_api_port, "GET", path, query, headers)

    def get_json(self, path, query=None, status=200):
        response = self.get(path, query)
        self.assertEqual(response.status, status, response.describe())
        return response.json()

    def assert_status(self, response, code, reason):
        """response is a Kubernetes Status with that code and reason."""
        self.assertEqual(response.status, code, response.describe())
        self.assertTrue(response.content_type.startswith("application/json"),
                        response.describe())
        status = response.json()
        self.assertEqual((status.get("kind"), status.get("apiVersion")), ("Status", "v1"),
                         response.describe())
        self.assertEqual(status.get("status"), "Failure", response.describe())
        self.assertEqual((status.get("code"), status.get("reason")), (code, reason),
                         response.describe())
        self.assertTrue(status.get("message"), response.describe())
        return status

    # kubectl.

    def kubectl(self, server_path, *args, expect_rc=0):
        """Runs kubectl with --server pointing at server_path under the view; returns the
        CompletedProcess, failing if its exit code is not expect_rc (None: any)."""
        server = self.cache.url + server_path
        run = run_kubectl(self.kubectl_bin, self.kubectl_home, ["--server=" + server] + list(args))
        if expect_rc is not None:
            self.assertEqual(run.returncode, expect_rc, describe_run(run))
        return run


# ----------------------------------------------------------------------------------------------
# kubectl.


def make_kubectl_wrapper(home):
    """A directory with a `kubectl` script that runs ARGS.kubectl with no kubeconfig of the
    user's and a discovery cache of its own (usable from a shell and by `timeout`)."""
    bin_dir = os.path.join(home, "bin")
    os.makedirs(bin_dir, exist_ok=True)
    path = os.path.join(bin_dir, "kubectl")
    with open(path, "w") as f:
        f.write("#!/bin/sh\nexec %s --kubeconfig=/dev/null --cache-dir=%s \"$@\"\n" % (
            rt.shell_quote(ARGS.kubectl), rt.shell_quote(os.path.join(home, "cache"))))
    os.chmod(path, 0o755)
    return path


def kubectl_env(home):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBE")}
    env["HOME"] = home
    return env


def run_kubectl(kubectl_bin, home, args, timeout=KUBECTL_TIMEOUT):
    return subprocess.run([kubectl_bin] + list(args), capture_output=True, text=True,
                          timeout=timeout, env=kubectl_env(home), stdin=subprocess.DEVNULL)


def describe_run(run):
    return "%s\nexit code %d\nstdout:\n%s\nstderr:\n%s" % (
        " ".join(run.args), run.returncode, run.stdout[-3000:], run.stderr[-3000:])


def parse_table(text):
    """kubectl's table output as a list of dicts, column name -> cell, cut at the columns'
    starts in the header line (a cell may be empty)."""
    lines = [line for line in text.split("\n") if line.strip()]
    if not lines:
        return []
    header = lines[0]
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    names = header.split()
    rows = []
    for line in lines[1:]:
        if line.split() == names:
            continue  # kubectl --watch may print the header again
        cells = [line[s:e].strip() for s, e in zip(starts, starts[1:] + [len(line) + 1])]
        rows.append(dict(zip(names, cells)))
    return rows


def table_keys(rows, cluster_column=False):
    """(namespace, name) of each row, or (cluster, namespace, name) from -o wide."""
    if cluster_column:
        return sorted((r["CLUSTER"], r.get("NAMESPACE", ""), r["NAME"]) for r in rows)
    return sorted((r.get("NAMESPACE", ""), r["NAME"]) for r in rows)


def keys_of(keys, cluster=None, namespace=None):
    return sorted((ns, n) for c, ns, n in keys
                  if cluster in (None, c) and namespace in (None, ns))


def normalize_table(text):
    """kubectl's table output as the lines' cells, with ages (5s, 2m3s) replaced: the column
    widths and the ages differ from run to run."""
    return [["<age>" if AGE.match(cell) else cell for cell in line.split()]
            for line in text.strip().split("\n") if line.strip()]


# ----------------------------------------------------------------------------------------------
# HTTP.


class Response:

    def __init__(self, method, path, status, version, headers, body):
        self.method, self.path = method, path
        self.status, self.version, self.headers, self.body = status, version, headers, body

    @property
    def content_type(self):
        return self.headers.get("content-type", "")

    def json(self):
        return json.loads(self.body)

    def describe(self):
        return "%s %s: HTTP %d %s\n%s" % (self.method, self.path, self.status, self.headers,
                                          self.body[:3000].decode(errors="replace"))


def request_path(path, query=None):
    if not query:
        return path
    return path + "?" + urllib.parse.urlencode(query)


# What Go's net/http, and so client-go and kubectl, send with every request.
GO_CLIENT_HEADERS = {"Accept": "application/json", "Accept-Encoding": "gzip"}


def http_request(port, method, path, query=None, headers=None, body=None):
    """One HTTP/1.1 request to the view; the Response (its body decompressed when the server
    compressed it)."""
    target = request_path(path, query)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=CALL_TIMEOUT)
    try:
        conn.request(method, target, body=body, headers=headers or {})
        response = conn.getresponse()
        data = response.read()
        if response.getheader("Content-Encoding") == "gzip":
            data = gzip.decompress(data)
        return Response(method, target, response.status, response.version,
                        {k.lower(): v for k, v in response.getheaders()}, data)
    finally:
        conn.close()


class WatchStream:
    """A watch request, sent as client-go sends it (GO_CLIENT_HEADERS), and its stream of
    events, one JSON object a line, read as they come (decompressed when the server compresses
    the stream)."""

    def __init__(self, port, path, query, read_timeout=STREAM_READ_TIMEOUT, watch="true",
                 receive_buffer=None):
        """With receive_buffer (bytes), the connection's socket gets that SO_RCVBUF, and the
        response is not read until the stream is: a client that reads nothing stops the
        server's writes after a few KiB."""
        self.target = request_path(path, dict(query, watch=watch))
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=read_timeout)
        if receive_buffer is not None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
            sock.settimeout(read_timeout)
            sock.connect(("127.0.0.1", port))
            self.conn.sock = sock
        self.conn.request("GET", self.target, headers=GO_CLIENT_HEADERS)
        self._response = None
        if receive_buffer is None:
            self._start()
        self.buffer = b""
        self.events = []  # every event read

    def _start(self):
        if self._response is None:
            self._response = self.conn.getresponse()
            self.decompressor = None
            if self._response.getheader("Content-Encoding") == "gzip":
                self.decompressor = zlib.decompressobj(16 + zlib.MAX_WBITS)

    @property
    def response(self):
        self._start()
        return self._response

    @property
    def status(self):
        return self.response.status

    def _line(self):
        """The next line of the stream (b"" at its end), from what has arrived so far."""
        self._start()
        while b"\n" not in self.buffer:
            data = self.response.read1(65536)  # what one chunk holds, once some has come
            if not data:
                if self.decompressor is not None:
                    self.buffer += self.decompressor.flush()
                line, self.buffer = self.buffer, b""
                return line
            if self.decompressor is not None:
                data = self.decompressor.decompress(data)
            self.buffer += data
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line + b"\n"

    def next(self):
        """The next event, or None once the stream has ended."""
        while True:
            line = self._line()
            if not line:
                return None
            if line.strip():
                event = json.loads(line)
                self.events.append(event)
                return event

    def read_until(self, test, predicate, what, timeout=WAIT_TIMEOUT):
        """Reads events until predicate(event); returns the events read, that one last."""
        deadline = time.monotonic() + timeout
        read = []
        while time.monotonic() < deadline:
            event = self.next()
            test.assertIsNotNone(event, "the watch %s ended before %s; events: %s" % (
                self.target, what, json.dumps(read)[:3000]))
            read.append(event)
            if predicate(event):
                return read
        test.fail("no %s within %.0f s on %s; events: %s" % (what, timeout, self.target,
                                                             json.dumps(read)[:3000]))

    def read_to_end(self, test, limit):
        """Every event until the stream ends; fails past `limit` events."""
        events = []
        while True:
            event = self.next()
            if event is None:
                return events
            events.append(event)
            test.assertLessEqual(len(events), limit, events)

    def close(self):
        self.conn.close()


def object_key(obj):
    """(cluster, namespace, name) of an object of the view, its cluster from kcp.io/cluster."""
    meta = obj["metadata"]
    return (meta.get("annotations", {}).get("kcp.io/cluster"), meta.get("namespace", ""),
            meta["name"])


def is_event(type_, name=None):
    return lambda e: e["type"] == type_ and (
        name is None or e["object"]["metadata"].get("name") == name)


class Reflector:
    """client-go's reflector, as far as the protocol goes: it lists (in pages of page_size:
    limit, then continue) into a store keyed by (cluster, namespace, name), watches from the
    list's resourceVersion with allowWatchBookmarks, applies each event to the store and keeps
    the resourceVersion of the last one (bookmarks too). Its requests carry Go's headers
    (GO_CLIENT_HEADERS)."""

    def __init__(self, test, port, path, page_size):
        self.test, self.port, self.path, self.page_size = test, port, path, page_size
        self.store = {}
        self.resource_version = None
        self.pages = []

    def list(self, query=None, between_pages=None):
        """Lists into a fresh store; between_pages() runs after the first page. Returns the
        pages."""
        t = self.test
        self.store, self.pages = {}, []
        token = None
        while True:
            q = dict(query or {}, limit=str(self.page_size))
            if token:  # client-go's pager: a continued page names no resourceVersion
                q.pop("resourceVersion", None)
                q.pop("resourceVersionMatch", None)
                q["continue"] = token
            response = http_request(self.port, "GET", self.path, q, GO_CLIENT_HEADERS)
            t.assertEqual(response.status, 200, response.describe())
            page = response.json()
            t.assertEqual((page.get("kind"), page.get("apiVersion")),
                          ("WidgetList", "example.com/v1"), response.describe())
            self.pages.append(page)
            for item in page.get("items") or []:
                t.assertEqual((item.get("kind"), item.get("apiVersion")),
                              ("Widget", "example.com/v1"), item)
                self.store[object_key(item)] = item
            token = page["metadata"].get("continue")
            if not token:
                break
            t.assertLessEqual(len(self.pages), 50, "the pages never end")
            if between_pages is not None and len(self.pages) == 1:
                between_pages()
        versions = {p["metadata"]["resourceVersion"] for p in self.pages}
        t.assertEqual(len(versions), 1, "every page of a list is one snapshot: %s" % versions)
        self.resource_version = versions.pop()
        t.assertRegex(self.resource_version, r"^[0-9]+$")
        return self.pages

    def watch(self, **query):
        q = {"resourceVersion": self.resource_version, "allowWatchBookmarks": "true",
             "timeoutSeconds": "60"}
        q.update(query)
        stream = WatchStream(self.port, self.path, q)
        self.test.addCleanup(stream.close)
        self.test.assertEqual(stream.status, 200, stream.target)
        return stream

    def apply(self, event):
        t = self.test
        obj = event["object"]
        rv = obj["metadata"]["resourceVersion"]
        t.assertGreaterEqual(int(rv), int(self.resource_version),
                             "resourceVersions only grow: %s" % json.dumps(event))
        if event["type"] in ("ADDED", "MODIFIED"):
            t.assertEqual((obj.get("kind"), obj.get("apiVersion")), ("Widget", "example.com/v1"))
            self.store[object_key(obj)] = obj
        elif event["type"] == "DELETED":
            t.assertIn(object_key(obj), self.store, "a delete of an object it does not hold")
            del self.store[object_key(obj)]
        elif event["type"] == "BOOKMARK":
            t.assertEqual(obj.get("apiVersion"), "example.com/v1", event)
            t.assertEqual(obj.get("kind"), "Widget", event)
        else:
            t.fail("unexpected event %s" % json.dumps(event))
        self.resource_version = rv

    def snapshot(self):
        """The store, as (key, resourceVersion) pairs."""
        return sorted((k, o["metadata"]["resourceVersion"]) for k, o in self.store.items())


# ----------------------------------------------------------------------------------------------


class KubectlTest(_Deployment):
    """kubectl against the view, then raw requests."""

    def test_CoreGroupOfAnotherShard_IsServedUnderApiV1(self):
        # The cache takes any resource from anyone: a core-group object of shard "b", written
        # there directly.
        configmaps = {"group": "", "version": "v1", "resource": "configmaps"}
        call(self.cache_client, "shardcache.v1.Store/Create", {
            "resource": configmaps,
            "object": {"metadata": {"shard": "b", "cluster": "root", "namespace": "dev",
                                    "name": "settings", "labels": {"app": "web"}},
                       "spec": {"color": "red"}}})
        self.addCleanup(call, self.cache_client, "shardcache.v1.Store/Delete", {
            "resource": configmaps, "shard": "b", "cluster": "root", "namespace": "dev",
            "name": "settings"})
        self.assertIn("v1", self.get_json("/api")["versions"])
        resources = self.get_json(ALL + "/api/v1")
        self.assertEqual([(r["name"], r["namespaced"], r["verbs"])
                          for r in resources["resources"]],
                         [("configmaps", True, ["get", "list", "watch"])])
        run = self.kubectl(ALL, "get", "configmaps", "-A", "-o", "wide")
        self.assertEqual([(r["NAMESPACE"], r["NAME"], r["SHARD"], r["CLUSTER"])
                          for r in parse_table(run.stdout)], [("dev", "settings", "b", "root")])
        run = self.kubectl("/services/cache/shards/b/clusters/root", "get", "configmaps",
                           "settings", "-n", "dev", "-o", "json")
        obj = json.loads(run.stdout)
        self.assertEqual((obj["apiVersion"], obj["metadata"]["annotations"]["kcp.io/shard"],
                          obj["spec"]), ("v1", "b", {"color": "red"}))
        for prefix, resource in (("/services/cache/shards/a/clusters/*", "configmaps"),
                                 ("/services/cache/shards/b/clusters/*", "widgets")):
            run = self.kubectl(prefix, "get", resource, "-A")
            self.assertEqual((run.stdout, "No resources found" in run.stderr), ("", True),
                             describe_run(run))

    def test_GetAllNamespaces_ListsEveryCopyWithItsAge(self):
        run = self.kubectl(ALL, "get", "widgets", "-A")
        rows = parse_table(run.stdout)
        self.assertEqual(list(rows[0]), ["NAMESPACE", "NAME", "AGE"], run.stdout)
        self.assertEqual(table_keys(rows), keys_of(COPIED), run.stdout)
        for row in rows:  # the origins were created seconds ago
            self.assertRegex(row["AGE"], r"^(\d+s|\d+m(\d+s)?)$", run.stdout)

    def test_GetWide_ShowsShardAndCluster(self):
        run = self.kubectl(ALL, "get", "widgets", "-A", "-o", "wide")
        rows = parse_table(run.stdout)
        self.assertEqual(list(rows[0]), ["NAMESPACE", "NAME", "AGE", "SHARD", "CLUSTER"],
                         run.stdout)
        self.assertEqual(table_keys(rows, cluster_column=True), sorted(COPIED), run.stdout)
        self.assertEqual({r["SHARD"] for r in rows}, {"a"}, run.stdout)

    def test_GetInANamespace(self):
        for namespace in ("dev", "prod", "nosuch"):
            run = self.kubectl(ALL, "get", "widgets", "-n", namespace)
            rows = parse_table(run.stdout)
            self.assertEqual([n for _, n in table_keys(rows)],
                             [n for _, n in keys_of(COPIED, namespace=namespace)], run.stdout)
            if rows:
                self.assertEqual(list(rows[0]), ["NAME", "AGE"], run.stdout)
            else:
                self.assertIn("No resources found", run.stderr)

    def test_GetOneAsJson_IsTheCopyAsAKubernetesObject(self):
        key = ("root", "dev", "widget-a")
        copy = self.cache_copy(key)
        run = self.kubectl(ALL, "get", "widget", "widget-a", "-n", "dev", "-o", "json")
        obj = json.loads(run.stdout)
        self.assertEqual((obj["apiVersion"], obj["kind"]), ("example.com/v1", "Widget"))
        meta, want = obj["metadata"], copy["metadata"]
        self.assertEqual((meta["name"], meta["namespace"]), ("widget-a", "dev"))
        self.assertEqual(meta["uid"], want["uid"])
        self.assertEqual(meta["resourceVersion"], want["resource_version"])
        self.assertEqual(meta["generation"], int(want["generation"]))
        self.assertLess(abs(parse_time(meta["creationTimestamp"]) -
                            parse_time(want["creation_timestamp"])).total_seconds(), 1)
        self.assertEqual(meta["labels"], LABELS[key])
        annotations = dict(want.get("annotations", {}), **{"kcp.io/cluster": "root",
                                                           "kcp.io/shard": "a"})
        self.assertEqual(meta["annotations"], annotations)
        self.assertFalse(meta.get("finalizers"))  # the copy has none
        self.assertIsNone(meta.get("deletionTimestamp"))
        self.assertEqual(obj["spec"], copy["spec"])
        self.assertEqual(obj["spec"], {"size": 1, "color": "blue"})

    def test_GetMissing_IsNotFound(self):
        run = self.kubectl(ALL, "get", "widget", "nosuch", "-n", "dev", expect_rc=1)
        self.assertIn("(NotFound)", run.stderr)

    def test_LabelAndFieldSelectors(self):
        cases = [
            (["-l", "app=web"], lambda labels, ns, n: labels["app"] == "web"),
            (["-l", "app=web,tier=front"],
             lambda labels, ns, n: labels["app"] == "web" and labels["tier"] == "front"),
            (["-l", "tier in (db)"], lambda labels, ns, n: labels["tier"] == "db"),
            (["-l", "app!=web"], lambda labels, ns, n: labels["app"] != "web"),
            (["--field-selector", "metadata.name=widget-c"], lambda labels, ns, n: n == "widget-c"),
            (["--field-selector", "metadata.namespace!=dev"], lambda labels, ns, n: ns != "dev"),
            (["--field-selector", "metadata.namespace==dev,metadata.name!=widget-a", "-l",
              "tier=front"],
             lambda labels, ns, n: ns == "dev" and n != "widget-a" and labels["tier"] == "front"),
        ]
        for flags, selected in cases:
            with self.subTest(flags=flags):
                run = self.kubectl(ALL, "get", "widgets", "-A", *flags)
                want = sorted((ns, n) for c, ns, n in COPIED if selected(LABELS[(c, ns, n)], ns, n))
                self.assertTrue(want)
                self.assertEqual(table_keys(parse_table(run.stdout)), want, describe_run(run))

    def test_ApiResources_ShowsTheCachedResources(self):
        run = self.kubectl(ALL, "api-resources")
        rows = {r["NAME"]: r for r in parse_table(run.stdout)}
        self.assertEqual(
            {k: rows.get("widgets", {}).get(k) for k in ("APIVERSION", "NAMESPACED", "KIND")},
            {"APIVERSION": "example.com/v1", "NAMESPACED": "true", "KIND": "Widget"},
            run.stdout)
        ccrs = rows.get("clustercachedresources", {})
        self.assertEqual((ccrs.get("APIVERSION"), ccrs.get("NAMESPACED")),
                         ("cache.shardcache.io/v1alpha1", "false"), run.stdout)
        self.assertEqual(ccrs.get("KIND", "").lower(), "clustercachedresource", run.stdout)

    def test_ChunkSize1_PagesThroughEveryObject(self):
        # -v=6 logs each request: one per object, each after the first with a continue token.
        run = self.kubectl(ALL, "get", "widgets", "-A", "--chunk-size=1", "-v=6")
        self.assertEqual(table_keys(parse_table(run.stdout)), keys_of(COPIED), run.stdout)
        pages = re.findall(r"GET http\S*/widgets\?\S*limit=1\S* 200", run.stderr)
        self.assertGreaterEqual(len(pages), len(COPIED), run.stderr)
        self.assertEqual(len([p for p in pages if "continue=" in p]), len(pages) - 1, pages)

    def test_ClusterCachedResources_AreClusterScoped(self):
        run = self.kubectl(ALL, "get", "clustercachedresources", "-o", "wide")
        rows = parse_table(run.stdout)
        self.assertEqual(sorted((r["NAME"], r["CLUSTER"], r["SHARD"]) for r in rows),
                         [("widgets", c, "a") for c in CLUSTERS], run.stdout)
        self.assertNotIn("NAMESPACE", rows[0])

    def test_PathPrefixes_SelectShardAndCluster(self):
        cases = [
            ("/services/cache/shards/a/clusters/*", COPIED),
            ("/services/cache/shards/a/clusters/root", [k for k in COPIED if k[0] == "root"]),
            ("/services/cache/shards/*/clusters/root:org",
             [k for k in COPIED if k[0] == "root:org"]),
            ("/clusters/root", [k for k in COPIED if k[0] == "root"]),
            ("/clusters/root:org", [k for k in COPIED if k[0] == "root:org"]),
            ("/clusters/*", COPIED),
            ("", COPIED),
            ("/services/cache/shards/nosuch/clusters/*", []),
            ("/clusters/nosuch", []),
        ]
        for prefix, want in cases:
            with self.subTest(prefix=prefix):
                run = self.kubectl(prefix, "get", "widgets", "-A", "-o", "wide")
                rows = parse_table(run.stdout)
                self.assertEqual(table_keys(rows, cluster_column=True), sorted(want),
                                 describe_run(run))
                if not want:
                    self.assertIn("No resources found", run.stderr)
        # The same object under each prefix that holds it, with the same annotations.
        for prefix in (ALL, "/clusters/root", ""):
            run = self.kubectl(prefix, "get", "widget", "widget-d", "-n", "prod", "-o", "json")
            annotations = json.loads(run.stdout)["metadata"]["annotations"]
            self.assertEqual((annotations["kcp.io/cluster"], annotations["kcp.io/shard"]),
                             ("root", "a"))

    def test_Watch_PrintsAChangeMadeInTheShard(self):
        out_path = os.path.join(self.kubectl_home, "watch.out")
        with open(out_path, "w") as out, open(out_path + ".err", "w") as err:
            watch = subprocess.Popen(
                [self.kubectl_bin, "--server=" + self.cache.url + ALL, "get", "widgets", "-n",
                 "prod", "--watch", "--output-watch-events"],
                stdout=out, stderr=err, env=kubectl_env(self.kubectl_home),
                stdin=subprocess.DEVNULL)

        def events():
            with open(out_path) as f:
                return [(r["EVENT"], r["NAME"]) for r in parse_table(f.read())]

        def stop():
            watch.terminate()
            watch.wait(timeout=CALL_TIMEOUT)
        self.addCleanup(stop)
        try:
            wait_for("kubectl --watch to print the widgets of prod", lambda: sorted(events()) == [
                ("ADDED", "widget-c"), ("ADDED", "widget-d")])
            self.update_in_shard(("root", "prod", "widget-d"), {"size": 40, "color": "red"})
            wait_for("kubectl --watch to print widget-d's change",
                     lambda: ("MODIFIED", "widget-d") in events())
        except AssertionError as e:
            with open(out_path) as f, open(out_path + ".err") as f_err:
                raise AssertionError("%s\nkubectl printed:\n%s\n%s" % (e, f.read(), f_err.read()))
        self.assertEqual(events()[2:], [("MODIFIED", "widget-d")])
        run = self.kubectl(ALL, "get", "widget", "widget-d", "-n", "prod", "-o",
                           "jsonpath={.spec.size} {.spec.color}")
        self.assertEqual(run.stdout, "40 red")

    def test_Writes_AreRefusedAndChangeNothing(self):
        key = ("root", "dev", "widget-b")
        before = self.cache_copies()
        origin = call(self.shard_client, "shardcache.v1.Store/Get", {
            "resource": WIDGETS, "cluster": "root", "namespace": "dev", "name": "widget-b"})
        manifest = os.path.join(self.kubectl_home, "widget-b.json")
        with open(manifest, "w") as f:
            json.dump({"apiVersion": "example.com/v1", "kind": "Widget",
                       "metadata": {"name": "widget-b", "namespace": "dev"},
                       "spec": {"size": 99}}, f)
        new = os.path.join(self.kubectl_home, "widget-new.json")
        with open(new, "w") as f:
            json.dump({"apiVersion": "example.com/v1", "kind": "Widget",
                       "metadata": {"name": "widget-new", "namespace": "dev"},
                       "spec": {"size": 1}}, f)
        # kubectl's client-side validation needs OpenAPI, which the view does not serve:
        # --validate=false lets apply and create send their requests.
        for args in (["delete", "widget", "widget-b", "-n", "dev", "--wait=false"],
                     ["apply", "--validate=false", "-f", manifest],
                     ["create", "--validate=false", "-f", new],
                     ["label", "widget", "widget-b", "-n", "dev", "app=other", "--overwrite"],
                     ["delete", "widgets", "--all", "-n", "dev", "--wait=false"]):
            with self.subTest(args=args):
                run = self.kubectl(ALL, *args, expect_rc=1)
                self.assertIn("(MethodNotAllowed)", run.stderr, describe_run(run))
        self.assertEqual(self.cache_copies(), before)
        self.assertEqual(call(self.shard_client, "shardcache.v1.Store/Get", {
            "resource": WIDGETS, "cluster": "root", "namespace": "dev", "name": "widget-b"}),
            origin)
        run = self.kubectl(ALL, "get", "widget", "widget-b", "-n", "dev", "-o", "json")
        obj = json.loads(run.stdout)
        self.assertEqual(obj["metadata"]["resourceVersion"],
                         before[key]["metadata"]["resource_version"])
        self.assertNotIn("kubectl.kubernetes.io/last-applied-configuration",
                         obj["metadata"]["annotations"])

    # Raw requests.

    def test_Discovery(self):
        version = self.get_json("/version")
        self.assertIsInstance(version, dict)
        for prefix in (ALL, "/clusters/root", "/services/cache/shards/a/clusters/root:org", ""):
            with self.subTest(prefix=prefix):
                api = self.get_json(prefix + "/api")
                self.assertEqual(api.get("kind"), "APIVersions", api)
                groups = self.get_json(prefix + "/apis")
                self.assertEqual((groups.get("kind"), groups.get("apiVersion")),
                                 ("APIGroupList", "v1"), groups)
                by_name = {g["name"]: g for g in groups["groups"]}
                self.assertIn("example.com", by_name, groups)
                self.assertIn("cache.shardcache.io", by_name, groups)
                self.assertEqual(by_name["example.com"]["versions"],
                                 [{"groupVersion": "example.com/v1", "version": "v1"}])
                self.assertEqual(by_name["example.com"]["preferredVersion"],
                                 {"groupVersion": "example.com/v1", "version": "v1"})
                self.assertIn({"groupVersion": "cache.shardcache.io/v1alpha1",
                               "version": "v1alpha1"}, by_name["cache.shardcache.io"]["versions"])
                resources = self.get_json(prefix + "/apis/example.com/v1")
                self.assertEqual((resources.get("kind"), resources.get("groupVersion")),
                                 ("APIResourceList", "example.com/v1"), resources)
                widgets = [r for r in resources["resources"] if r["name"] == "widgets"]
                self.assertEqual(len(widgets), 1, resources)
                self.assertEqual((widgets[0]["kind"], widgets[0]["namespaced"],
                                  widgets[0]["verbs"]),
                                 ("Widget", True, ["get", "list", "watch"]))
                resources = self.get_json(prefix + "/apis/cache.shardcache.io/v1alpha1")
                ccrs = [r for r in resources["resources"] if r["name"] == "clustercachedresources"]
                self.assertEqual(len(ccrs), 1, resources)
                self.assertEqual((ccrs[0]["namespaced"], ccrs[0]["verbs"]),
                                 (False, ["get", "list", "watch"]))

    def test_ListAndGet_AsKubernetesJson(self):
        response = self.get(ALL + "/apis/example.com/v1/namespaces/prod/widgets")
        self.assertEqual((response.status, response.version), (200, 11), response.describe())
        self.assertTrue(response.content_type.startswith("application/json"), response.headers)
        body = response.json()
        self.assertEqual((body["kind"], body["apiVersion"]), ("WidgetList", "example.com/v1"))
        self.assertRegex(body["metadata"]["resourceVersion"], r"^[0-9]+$")
        self.assertFalse(body["metadata"].get("continue"))
        self.assertEqual(sorted(object_key(i) for i in body["items"]),
                         [k for k in sorted(COPIED) if k[1] == "prod"])
        for item in body["items"]:
            self.assertEqual((item["kind"], item["apiVersion"]), ("Widget", "example.com/v1"))
            self.assertEqual(item["metadata"]["annotations"]["kcp.io/shard"], "a")
        obj = self.get_json("/clusters/root:org/apis/example.com/v1/namespaces/dev/widgets/"
                            "widget-e")
        self.assertEqual(object_key(obj), ("root:org", "dev", "widget-e"))
        ccrs = self.get_json("/clusters/root/apis/cache.shardcache.io/v1alpha1/"
                             "clustercachedresources")
        self.assertEqual([(i["metadata"]["name"], i["spec"]["resource"]) for i in ccrs["items"]],
                         [("widgets", "widgets")])
        self.assertNotIn("namespace", ccrs["items"][0]["metadata"])
        ccr = self.get_json("/clusters/root/apis/cache.shardcache.io/v1alpha1/"
                            "clustercachedresources/widgets")
        self.assertEqual(ccr["metadata"]["annotations"]["kcp.io/cluster"], "root")

    def test_Missing_IsNotFoundStatus(self):
        for path in (ALL + "/apis/example.com/v1/namespaces/dev/widgets/nosuch",
                     "/clusters/root:org/apis/example.com/v1/namespaces/dev/widgets/widget-a",
                     "/services/cache/shards/nosuch/clusters/*/apis/example.com/v1/namespaces/"
                     "dev/widgets/widget-a"):
            with self.subTest(path=path):
                self.assert_status(self.get(path), 404, "NotFound")
        for path in ("/nonsense", "/services/cache/shards/a", "/apis/example.com/v1/widgets/x/y/z",
                     "/clusters"):
            with self.subTest(path=path):
                self.assertEqual(self.get(path).status, 404, path)

    def test_WriteVerbs_AreMethodNotAllowed(self):
        before = self.cache_copies()
        collection = ALL + "/apis/example.com/v1/namespaces/dev/widgets"
        one = collection + "/widget-a"
        body = json.dumps({"apiVersion": "example.com/v1", "kind": "Widget",
                           "metadata": {"name": "widget-a", "namespace": "dev"},
                           "spec": {"size": 7}})
        for method, path, content_type in (
                ("POST", collection, "application/json"),
                ("PUT", one, "application/json"),
                ("PATCH", one, "application/merge-patch+json"),
                ("PATCH", one, "application/apply-patch+yaml"),
                ("DELETE", one, "application/json"),
                ("DELETE", collection, "application/json"),
                ("POST", "/apis/example.com/v1/namespaces/dev/widgets", "application/json"),
                ("DELETE", "/clusters/root/apis/cache.shardcache.io/v1alpha1/"
                           "clustercachedresources/widgets", "application/json")):
            with self.subTest(method=method, path=path):
                response = http_request(self.cache.kube_api_port, method, path, body=body,
                                        headers={"Content-Type": content_type})
                self.assert_status(response, 405, "MethodNotAllowed")
        self.assertEqual(self.cache_copies(), before)

    def test_MalformedParameters_AreBadRequest(self):
        path = ALL + WIDGETS_PATH
        for query in ({"labelSelector": "app in (web"}, {"labelSelector": "=web"},
                      {"fieldSelector": "metadata.name"}, {"fieldSelector": "spec.size=1"},
                      {"limit": "abc"}, {"limit": "10x"},
                      {"resourceVersion": "abc"}, {"resourceVersion": "1x"},
                      {"limit": "2", "resourceVersion": "abc"},
                      {"watch": "true", "resourceVersion": "abc"},
                      {"watch": "true", "labelSelector": "app in (web"},
                      {"watch": "true", "fieldSelector": "status.phase=x"}):
            with self.subTest(query=query):
                self.assert_status(self.get(path, query), 400, "BadRequest")


def parse_time(text):
    """An RFC 3339 time in UTC (Z), to the microsecond."""
    match = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?Z$", text)
    assert match, "not an RFC 3339 UTC time: %r" % text
    fraction = (match.group(2) or ".0")[1:7].ljust(6, "0")
    return datetime.datetime.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S").replace(
        microsecond=int(fraction))


class ReflectorTest(_Deployment):
    """The view as client-go's reflector uses it, on a cache with a short history window."""

    CACHE_FLAGS = ["--bookmark-interval=" + BOOKMARK_INTERVAL,
                   "--history-events=%d" % HISTORY_EVENTS]

    def fresh_list(self, path=ALL + WIDGETS_PATH):
        reflector = Reflector(self, self.cache.kube_api_port, path, page_size=100)
        reflector.list()
        return reflector

    def test_ListInPages_IsOneSnapshot(self):
        reflector = Reflector(self, self.cache.kube_api_port, ALL + WIDGETS_PATH, page_size=2)
        before = self.fresh_list()
        changed = []

        def change():  # between the first page and the next: invisible to this list
            changed.append(self.update_in_shard(("root", "dev", "widget-b"), {"size": 20}))
        pages = reflector.list(between_pages=change)
        self.assertGreaterEqual(len(pages), 3)
        self.assertEqual([len(p["items"]) for p in pages[:-1]], [2] * (len(pages) - 1))
        self.assertEqual(reflector.snapshot(), before.snapshot())
        for page in pages:
            for item in page["items"]:
                self.assertLessEqual(int(item["metadata"]["resourceVersion"]),
                                     int(reflector.resource_version))
        after = self.fresh_list()
        self.assertGreater(int(after.resource_version), int(before.resource_version))
        self.assertEqual(after.store[("root", "dev", "widget-b")]["metadata"]["resourceVersion"],
                         changed[0]["metadata"]["resource_version"])

    def test_InformersFirstList_ResourceVersion0(self):
        # client-go's first list: resourceVersion=0 (any), limit=500.
        reflector = Reflector(self, self.cache.kube_api_port, ALL + WIDGETS_PATH, page_size=500)
        reflector.list({"resourceVersion": "0"})
        self.assertEqual(sorted(reflector.store), sorted(self.fresh_list().store))

    def test_ListAtResourceVersion_ExactAndNotOlderThan(self):
        first = self.fresh_list()
        self.update_in_shard(("root", "prod", "widget-c"), {"size": 30})
        latest = self.fresh_list()
        self.assertNotEqual(latest.snapshot(), first.snapshot())
        exact = Reflector(self, self.cache.kube_api_port, ALL + WIDGETS_PATH, page_size=2)
        exact.list({"resourceVersion": first.resource_version, "resourceVersionMatch": "Exact"})
        self.assertEqual((exact.resource_version, exact.snapshot()),
                         (first.resource_version, first.snapshot()))
        newer = Reflector(self, self.cache.kube_api_port, ALL + WIDGETS_PATH, page_size=100)
        newer.list({"resourceVersion": first.resource_version,
                    "resourceVersionMatch": "NotOlderThan"})
        self.assertGreaterEqual(int(newer.resource_version), int(latest.resource_version))
        self.assertEqual(newer.snapshot(), latest.snapshot())

    def test_WatchFromTheList_KeepsTheStoreEqualToAFreshList(self):
        self.create_in_shard(("root:org", "dev", "widget-g"),
                             {"cache": "yes", "app": "web", "tier": "db"}, {"size": 7})
        reflector = Reflector(self, self.cache.kube_api_port, ALL + WIDGETS_PATH, page_size=2)
        reflector.list({"resourceVersion": "0"})
        listed_rv = reflector.resource_version
        stream = reflector.watch()
        bookmark = stream.read_until(self, is_event("BOOKMARK"), "a bookmark")
        self.assertEqual([e["type"] for e in bookmark], ["BOOKMARK"],
                         "nothing changed since the list")
        self.assertEqual(set(bookmark[0]["object"]), {"kind", "apiVersion", "metadata"})
        self.assertEqual(set(bookmark[0]["object"]["metadata"]), {"resourceVersion"})
        for event in bookmark:
            reflector.apply(event)
        self.assertGreaterEqual(int(reflector.resource_version), int(listed_rv))

        modified = ("root", "dev", "widget-a")
        added = ("root", "prod", "widget-f")
        deleted = ("root:org", "dev", "widget-g")
        self.update_in_shard(modified, {"size": 10, "color": "green"})
        self.create_in_shard(added, {"cache": "yes", "app": "web", "tier": "db"}, {"size": 6})
        self.addCleanup(self.delete_in_shard, added)
        self.delete_in_shard(deleted)
        seen = set()

        def all_seen(event):
            reflector.apply(event)
            seen.add((event["type"], object_key(event["object"])
                      if event["type"] != "BOOKMARK" else None))
            return {("MODIFIED", modified), ("ADDED", added), ("DELETED", deleted)} <= seen
        events = stream.read_until(self, all_seen, "the three changes")
        self.assertEqual(sorted(t for t, _ in seen if t != "BOOKMARK"),
                         ["ADDED", "DELETED", "MODIFIED"], events)
        self.assertEqual(reflector.store[modified]["spec"], {"size": 10, "color": "green"})
        self.assertEqual(reflector.snapshot(), self.fresh_list().snapshot())

    def test_WatchWithSelectorsAndClusterPrefix_SeesOnlyItsObjects(self):
        # Cluster root, namespace dev, tier=front: widget-a only (widget-e is in root:org).
        path = "/clusters/root" + WIDGETS_PATH
        reflector = Reflector(self, self.cache.kube_api_port, path, page_size=100)
        query = {"labelSelector": "tier=front", "fieldSelector": "metadata.namespace=dev"}
        reflector.list(query)
        self.assertEqual(sorted(reflector.store), [("root", "dev", "widget-a")])
        stream = reflector.watch(**query)
        for key in (("root", "dev", "widget-b"), ("root", "prod", "widget-c"),
                    ("root:org", "dev", "widget-e"), ("root", "dev", "widget-a")):
            self.update_in_shard(key, {"size": 77}, labels=LABELS.get(key))
        events = stream.read_until(self, is_event("MODIFIED", "widget-a"), "widget-a's change")
        self.assertEqual([(e["type"], object_key(e["object"])) for e in events
                          if e["type"] != "BOOKMARK"], [("MODIFIED", ("root", "dev", "widget-a"))])
        # By name, in every cluster.
        stream = WatchStream(self.cache.kube_api_port, ALL + WIDGETS_PATH, {
            "resourceVersion": self.fresh_list().resource_version,
            "fieldSelector": "metadata.name==widget-e", "allowWatchBookmarks": "true"})
        self.addCleanup(stream.close)
        self.update_in_shard(("root", "dev", "widget-a"), {"size": 78})
        self.update_in_shard(("root:org", "dev", "widget-e"), {"size": 79})
        events = stream.read_until(self, is_event("MODIFIED", "widget-e"), "widget-e's change")
        self.assertEqual([object_key(e["object"]) for e in events if e["type"] != "BOOKMARK"],
                         [("root:org", "dev", "widget-e")])

    def test_WatchTimeoutSeconds_EndsTheStreamWithoutBookmarksUnlessAsked(self):
        start = time.monotonic()
        stream = WatchStream(self.cache.kube_api_port, ALL + WIDGETS_PATH, {
            "resourceVersion": self.fresh_list().resource_version, "timeoutSeconds": "3"},
            watch="1")
        self.addCleanup(stream.close)
        self.assertEqual(stream.status, 200)
        self.assertEqual(stream.response.getheader("Transfer-Encoding"), "chunked")
        self.assertTrue(stream.response.getheader("Content-Type", "").startswith(
            "application/json"))
        self.assertIsNone(stream.next(), "no change, no bookmarks asked for: no event")
        self.assertGreaterEqual(time.monotonic() - start, 2.5)
        self.assertEqual(stream.events, [])

    def test_IdleWatchWithoutBookmarks_EndsSoonAfterItsClientLeaves(self):
        # The client asks for no bookmarks and nothing changes, so nothing is written to it;
        # still, once it has gone, the view notices within a few bookmark intervals, not at the
        # watch's timeout (30 min), and its connection's thread is free again.
        before = self.view_watches()
        stream = WatchStream(self.cache.kube_api_port, ALL + WIDGETS_PATH, {
            "resourceVersion": self.fresh_list().resource_version})
        self.assertEqual(stream.status, 200)
        wait_for("the view's watch to start", lambda: self.view_watches() == before + 1)
        stream.close()
        wait_for("the view to end the watch whose client left",
                 lambda: self.view_watches() == before, timeout=10)
        self.assertEqual(stream.events, [])

    def test_SendInitialEvents_AddsEveryObjectThenTheEndBookmark(self):
        for with_version in (True, False):
            with self.subTest(resource_version=with_version):
                self.check_send_initial_events(with_version)

    def check_send_initial_events(self, with_version):
        """A watch-list, with the list's resourceVersion, or without one as client-go's
        reflector sends its first."""
        listed = self.fresh_list()
        params = {"sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan",
                  "allowWatchBookmarks": "true"}
        if with_version:
            params["resourceVersion"] = listed.resource_version
        stream = WatchStream(self.cache.kube_api_port, ALL + WIDGETS_PATH, params)
        self.addCleanup(stream.close)
        self.assertEqual(stream.status, 200)
        events = stream.read_until(self, is_event("BOOKMARK"), "the initial events' bookmark")
        self.assertEqual(sorted((e["type"], object_key(e["object"])) for e in events[:-1]),
                         [("ADDED", k) for k in sorted(listed.store)])
        end = events[-1]["object"]["metadata"]
        self.assertEqual(end.get("annotations", {}).get("k8s.io/initial-events-end"), "true",
                         events[-1])
        self.assertGreaterEqual(int(end["resourceVersion"]), int(listed.resource_version))

    def test_WatchFromAnExpiredVersion_GetsExpiredThenRelists(self):
        reflector = Reflector(self, self.cache.kube_api_port, ALL + WIDGETS_PATH, page_size=2)
        reflector.list()
        old_rv = reflector.resource_version
        key = ("root", "prod", "widget-d")
        for n in range(HISTORY_EVENTS + 2):  # each one write to the cache, waited for
            self.update_in_shard(key, {"size": 100 + n})
        stream = reflector.watch()
        events = stream.read_to_end(self, limit=9)
        self.assertEqual([e["type"] for e in events], ["ERROR"],
                         "one ERROR event, then the stream ends: %s" % events)
        status = events[-1]["object"]
        self.assertEqual((status.get("kind"), status.get("apiVersion"), status.get("status"),
                          status.get("code"), status.get("reason")),
                         ("Status", "v1", "Failure", 410, "Expired"), status)

        # client-go relists from its last resourceVersion (200 not older than it, or 410)...
        response = http_request(self.cache.kube_api_port, "GET", ALL + WIDGETS_PATH,
                                {"resourceVersion": old_rv, "limit": "2"})
        if response.status != 200:
            self.assert_status(response, 410, "Expired")
        # ... and, that failing, from the latest.
        reflector.list()
        self.assertGreater(int(reflector.resource_version), int(old_rv))
        self.assertEqual(reflector.store[key]["spec"], {"size": 100 + HISTORY_EVENTS + 1})
        self.assertEqual(reflector.snapshot(), self.fresh_list().snapshot())
        stream = reflector.watch()
        stream.read_until(self, is_event("BOOKMARK"), "a bookmark on the new watch")
        self.assertEqual([e["type"] for e in stream.events], ["BOOKMARK"])


class SlowReaderTest(_Deployment):
    """The view's watchers are the fan-out's, treated as its gRPC watchers are: on a cache whose
    watchers may each hold 16 KiB of events (--watch-queue-bytes) and whose silent ones are ended
    after 5 s (--watch-stall-timeout), a burst of WIDGETS_IN_BURST copies of 24 KiB, watched
    by a client that reads everything, one that reads nothing for a while (its socket's receive
    buffer 4 KiB) and one that never reads."""

    CACHE_FLAGS = ["--bookmark-interval=" + BOOKMARK_INTERVAL, "--watch-queue-bytes=16384",
                   "--watch-stall-timeout=5s"]
    WIDGETS_IN_BURST = 40

    def read_burst(self, stream, names, what):
        """Reads ADDED events of the burst until every name has come; checks that they come
        in resourceVersion order, once each; returns the names in the order they came (the
        cache's: the replicator copies several at a time)."""
        seen, last_rv = [], 0
        deadline = time.monotonic() + WAIT_TIMEOUT
        while len(seen) < len(names):
            self.assertLess(time.monotonic(), deadline, "%s: %d of %d events within %.0f s" % (
                what, len(seen), len(names), WAIT_TIMEOUT))
            event = stream.next()
            self.assertIsNotNone(event, "%s: the stream ended after %d of %d events" % (
                what, len(seen), len(names)))
            if event["type"] == "BOOKMARK":
                continue
            self.assertEqual(event["type"], "ADDED", event)
            rv = int(event["object"]["metadata"]["resourceVersion"])
            self.assertGreater(rv, last_rv, "%s: out of order or repeated" % what)
            last_rv = rv
            seen.append(event["object"]["metadata"]["name"])
        self.assertEqual(sorted(seen), names, "%s: every copy, once" % what)
        return seen

    def test_SlowAndSilentReaders_HoldBackNeitherWritesNorOtherWatchers(self):
        listed = Reflector(self, self.cache.kube_api_port, ALL + WIDGETS_PATH, page_size=500)
        listed.list()
        query = {"resourceVersion": listed.resource_version}
        path = ALL + WIDGETS_PATH
        reader = WatchStream(self.cache.kube_api_port, path, query)
        pausing = WatchStream(self.cache.kube_api_port, path, query, receive_buffer=4096)
        silent = WatchStream(self.cache.kube_api_port, path, query, receive_buffer=4096)
        for stream in (reader, pausing, silent):
            self.addCleanup(stream.close)
        wait_for("the three watches to start", lambda: self.view_watches() >= 3)
        caught_up = self.metric("shardcache_store_watch_catch_up_events_total")
        too_slow = self.metric("shardcache_store_watchers_too_slow_total")
        names = ["burst-%03d" % n for n in range(self.WIDGETS_IN_BURST)]

        def pad():  # 24 KiB that gzip (which the client accepts) cannot shrink much
            return base64.b64encode(os.urandom(18432)).decode()
        for n, name in enumerate(names):
            call(self.shard_client, "shardcache.v1.Store/Create", {
                "resource": WIDGETS, "object": widget_object(
                    "root", "burst", name, {"cache": "yes"}, {"size": n, "pad": pad()})})
        # Every write reached the cache while two of the watchers read nothing.
        wait_for("the burst's copies in the cache", lambda: len(
            [k for k in self.cache_copies() if k[1] == "burst"]) == len(names))
        # The pausing watcher was parked (its queue of 16 KiB filled) and is caught up from the
        # history as it reads: everything, in order, with no gap and no duplicate, as the reader
        # got it.
        paused_order = self.read_burst(pausing, names, "the watcher that paused")
        order = self.read_burst(reader, names, "the reader")
        self.assertEqual(paused_order, order)
        self.assertGreater(self.metric("shardcache_store_watch_catch_up_events_total"),
                           caught_up, "the paused watcher was caught up from the history")
        # The silent one is ended as too slow once it has read nothing for 5 s; when it reads at
        # last it finds a prefix of the burst in order, then an ERROR event that says why.
        try:
            wait_for("the silent watcher to be ended as too slow", lambda: self.metric(
                "shardcache_store_watchers_too_slow_total") > too_slow, timeout=20)
        except AssertionError as e:
            raise AssertionError("%s; watches %s, parked %s; sockets:\n%s" % (
                e, self.view_watches(), self.metric("shardcache_store_watchers_parked"),
                subprocess.run(["ss", "-tn", "sport", "=", str(self.cache.kube_api_port)],
                               capture_output=True, text=True).stdout)) from None
        events = silent.read_to_end(self, limit=len(names) + 1)
        self.assertTrue(events, "the silent watcher's stream")
        self.assertEqual(events[-1]["type"], "ERROR", events[-1])
        self.assertIn("too slow", events[-1]["object"]["message"])
        added = [e["object"]["metadata"]["name"] for e in events[:-1] if e["type"] == "ADDED"]
        self.assertLess(len(added), len(names))
        self.assertEqual(added, order[:len(added)])


class StartupTest(unittest.TestCase):

    def test_WithoutTheFlag_TheViewIsOff(self):
        cache = rt.Server("cache").start()
        try:
            with open(cache.port_file) as f:
                ports = f.read()
            self.assertNotIn("kube_api_port", ports)
        finally:
            cache.stop()


# ----------------------------------------------------------------------------------------------
# docs/kubectl.md.


def doc_examples_with_tables(text, section_title):
    """As reflection_test.doc_examples, with also what the page shows a command print as a
    plain ``` block: (command, fails, shown json, shown text), the shown blocks attached to the
    last command of the ```sh block that they directly follow."""
    section = rt.doc_section(text, section_title)
    examples = []
    previous = None
    for language, block in re.findall(r"^```(\w*)\n(.*?)^```", section, re.M | re.S):
        if previous == "sh" and examples and language in ("json", ""):
            command, fails, shown_json, shown_text = examples[-1]
            if language == "json":
                shown_json = block
            else:
                shown_text = block
            examples[-1] = (command, fails, shown_json, shown_text)
        elif language == "sh":
            examples.extend((c, f, None, None) for c, f in rt._block_commands(block))
        previous = language
    return examples


def _shows(shown, check=None):
    """A check that the command printed the page's table: stdout, or, when kubectl printed
    nothing there, stderr (kubectl says "No resources found" and errors on stderr); cells
    compared, ages aside."""
    def run(t, rc, out, err):
        if check is not None:
            check(t, rc, out, err)
        if shown is not None:
            t.assertEqual(normalize_table(shown), normalize_table(out if out.strip() else err))
    return run


def _rc(code):
    def check(t, rc, out, err):
        t.assertEqual(rc, code, "stderr:\n" + err)
    return check


def _fails_with(reason):
    """kubectl failed with that reason, as in "Error from server (NotFound): ..."."""
    def check(t, rc, out, err):
        t.assertEqual(rc, 1)
        t.assertIn("Error from server (%s): " % reason, err)
    return check


def _gadget_json(t, rc, out, err):
    t.assertEqual(rc, 0, err)
    obj = json.loads(out)
    t.assertEqual((obj["kind"], obj["metadata"]["annotations"]["kcp.io/shard"]), ("Gadget", "a"))


def _lists(*keys):
    """kubectl get printed these (namespace, name) rows ("" for the namespace without -A)."""
    def check(t, rc, out, err):
        t.assertEqual(rc, 0, err)
        t.assertEqual(table_keys(parse_table(out)), sorted(keys))
        if not keys:
            t.assertIn("No resources found", err)
    return check


GADGETS_1_TO_3 = [("default", "gadget-%d" % n) for n in (1, 2, 3)]

# What each command of docs/kubectl.md must do, in order: (a piece of the command's text, its
# check, whether to run it again until the check passes). A table that the page shows is
# checked too. A command that ends with "# fails: REASON" has no check of its own: it must fail
# with that reason (_fails_with).
KUBECTL_DOC_CHECKS = [
    ("Store/Create", rt._created_named("gadget-4"), False),
    ("CACHE=", _rc(0), False),
    ("get gadgets -A", _lists(*GADGETS_1_TO_3 + [("staging", "gadget-4")]), True),
    ("-l tier=db", _lists(("staging", "gadget-4")), True),
    ("--field-selector", _lists(("", "gadget-1"), ("", "gadget-3")), False),
    ("/clusters/root get", _lists(("", "gadget-4")), False),
    ("shards/b/", _lists(), False),
    ("--chunk-size=2", _lists(*GADGETS_1_TO_3 + [("staging", "gadget-4")]), False),
    ("-o json", _gadget_json, False),
    ("api-resources", _rc(0), False),
    ("Store/Update", _rc(0), False),
    ("--watch", _rc(0), False),
    ("delete", None, False),
]


class DocExamplesTest(rt._DeploymentTest):
    """README.md's quick start, then docs/kubectl.md, against scripts/run.sh's deployment with
    the view on."""

    @classmethod
    def setUpClass(cls):
        cls.shard = ShardStore().start()
        cls.cache = KubeCache().start()
        cls.replicator = rt.Replicator("a", cls.shard, cls.cache).start().wait_ready()
        cls.kubectl_home = tempfile.mkdtemp(prefix="kubectl.", dir=ARGS.work_dir)
        cls.kubectl_bin = make_kubectl_wrapper(cls.kubectl_home)

    def localize(self, command):
        command = command.replace(DOCUMENTED_KUBE_API_ADDRESS, self.cache.kube_api_address)
        return super().localize(command)

    def test_KubectlExamples_RunAsDocumented(self):
        quick_start = rt.doc_examples(rt.read_doc(rt.README), rt.QUICK_START_SECTION)
        self.assert_commands_and_checks(rt.README, [(c, f) for c, f, _ in quick_start],
                                        rt.QUICK_START_CHECKS)
        examples = doc_examples_with_tables(rt.read_doc(KUBECTL_DOC), KUBECTL_DOC_SECTION)
        self.assertEqual(len(examples), len(KUBECTL_DOC_CHECKS),
                         "%s's commands and their checks differ:\n" % KUBECTL_DOC +
                         "\n---\n".join(c for c, _, _, _ in examples))
        checks = []
        for (command, fails, _, text), (piece, check, eventually) in zip(examples,
                                                                         KUBECTL_DOC_CHECKS):
            self.assertRegex(command, r"\b(kubectl|grpcurl) |^CACHE=", command)
            self.assertEqual(fails is None, check is not None, command)
            checks.append((piece, _shows(text, check or _fails_with(fails)), eventually))
        shell = self.open_shell("kubectl-doc.")
        try:
            rc, _, err, _ = shell.run("export HOME=%s PATH=%s:\"$PATH\"; unset KUBECONFIG" % (
                rt.shell_quote(self.kubectl_home),
                rt.shell_quote(os.path.dirname(self.kubectl_bin))))
            self.assertEqual(rc, 0, err)
            self.run_checked(shell, rt.README, quick_start, rt.QUICK_START_CHECKS)
            self.run_checked(shell, KUBECTL_DOC, [(c, f, j) for c, f, j, _ in examples], checks)
        finally:
            shell.close()


# ----------------------------------------------------------------------------------------------


def main():
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", required=True, help="the cache_server binary")
    parser.add_argument("--replicator", required=True, help="the shard_replicator binary")
    parser.add_argument("--grpc-proto-dir", default=grpcurl_lite.DEFAULT_GRPC_PROTO_DIR,
                        help="where gRPC's protos are (Debian's grpc-proto package)")
    parser.add_argument("--work-dir", required=True,
                        help="scratch directory (server data, logs, kubectl's outputs)")
    parser.add_argument("--source-dir", default=rt.SOURCE_DIR,
                        help="the source tree whose README.md and docs/ hold the examples")
    parser.add_argument("--kubectl", default=shutil.which("kubectl"),
                        help="the kubectl to run (default: the one on PATH)")
    parser.add_argument("tests", nargs="*", help="test names to run (default: all)")
    ARGS = parser.parse_args()
    if not ARGS.kubectl:
        parser.error("no kubectl on PATH (scripts/deps.sh installs Debian's kubernetes-client)")
    ARGS.server = os.path.abspath(ARGS.server)
    ARGS.replicator = os.path.abspath(ARGS.replicator)
    ARGS.kubectl = os.path.abspath(ARGS.kubectl)
    ARGS.source_dir = os.path.abspath(ARGS.source_dir)
    # A fresh directory of this run's own inside the one given, kept only when a test fails.
    os.makedirs(ARGS.work_dir, exist_ok=True)
    ARGS.work_dir = tempfile.mkdtemp(prefix="run.", dir=os.path.abspath(ARGS.work_dir))
    rt.ARGS = ARGS  # its Server and Replicator read the binaries and work dir there

    loader = unittest.TestLoader()
    if ARGS.tests:
        suite = loader.loadTestsFromNames(ARGS.tests, sys.modules[__name__])
    else:
        suite = unittest.TestSuite([loader.loadTestsFromTestCase(c) for c in (
            StartupTest, KubectlTest, ReflectorTest, SlowReaderTest, DocExamplesTest)])
    runner = unittest.TextTestRunner(stream=sys.stdout, verbosity=2,
                                     resultclass=rt.CountingResult)
    passed, failed = 0, 1
    try:
        result = runner.run(suite)
        passed = result.passed
        failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    finally:
        rt.stop_all_servers()
        if failed:
            print("logs and outputs: %s" % ARGS.work_dir)
        else:
            shutil.rmtree(ARGS.work_dir, ignore_errors=True)
        print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
