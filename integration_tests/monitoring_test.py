#!/usr/bin/python3
"""The monitoring test: the shipped Prometheus configuration, alerting rules and Grafana dashboard
(monitoring/) checked by Debian's prometheus against real processes.

  /usr/bin/python3 monitoring_test.py --server build/cache_server/cache_server \\
      --replicator build/shard_replicator/shard_replicator --work-dir /tmp/monitoring_test

1. `promtool check config` on monitoring/prometheus.yml, `promtool check rules` on
   monitoring/alerts.yml, and `promtool test rules` on monitoring/alerts_test.yml (each rule fed
   the series of a fault and of a healthy neighbour).
2. A shard store, a cache and a shard_replicator for shard "a" on loopback ports they pick, a CCR
   and objects that change all along; a prometheus (ports picked by the test) that scrapes them
   every second with the shipped jobs and labels and the shipped rules. Every query of every
   panel of the dashboard must return data (a histogram quantile: a number, not NaN), the rules
   must load healthy, and the "no leader" rule must find nothing while the replica leads, and
   find shard "a" once the replica is stopped.

Exits non-zero on any failure; every process is stopped at the end (SIGTERM, then SIGKILL).
"""

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # No __pycache__ in the source tree.
import grpcurl_lite  # noqa: E402  pylint: disable=wrong-import-position
import reflection_test  # noqa: E402  pylint: disable=wrong-import-position

MONITORING = os.path.join(os.path.dirname(HERE), "monitoring")
PROMETHEUS_START_TIMEOUT = 30.0
DATA_TIMEOUT = 90.0  # for every dashboard query to return data
CALL_TIMEOUT = 10.0
# The dashboard's Grafana variables, as this test's 1 s scrapes want them.
GRAFANA_VARIABLES = {"$__rate_interval": "10s"}

ARGS = None


def free_port():
    """A port that was free a moment ago (prometheus cannot report one it picked itself)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(command):
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    return result.returncode, result.stdout + result.stderr


class Prometheus:
    """One prometheus process with a configuration of this test's, on a port it tries until one
    is free."""

    def __init__(self, config_text):
        self.dir = tempfile.mkdtemp(prefix="prometheus.", dir=ARGS.work_dir)
        self.config = os.path.join(self.dir, "prometheus.yml")
        with open(self.config, "w") as f:
            f.write(config_text)
        self.process = None
        self.port = None
        self.log_path = os.path.join(self.dir, "prometheus.log")

    def start(self):
        for _ in range(5):
            self.port = free_port()
            with open(self.log_path, "wb") as log:
                self.process = subprocess.Popen(
                    [ARGS.prometheus, "--config.file=" + self.config,
                     "--storage.tsdb.path=" + os.path.join(self.dir, "data"),
                     "--web.listen-address=127.0.0.1:%d" % self.port],
                    cwd=self.dir, stdout=log, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + PROMETHEUS_START_TIMEOUT
            while time.monotonic() < deadline and self.process.poll() is None:
                try:
                    with urllib.request.urlopen("http://127.0.0.1:%d/-/ready" % self.port,
                                                timeout=CALL_TIMEOUT) as response:
                        if response.status == 200:
                            return self
                except OSError:
                    pass
                time.sleep(0.2)
            self.stop()
            if "address already in use" not in self.log():
                break
        raise AssertionError("prometheus did not become ready:\n" + self.log())

    def log(self):
        with open(self.log_path, errors="replace") as f:
            return f.read()[-4000:]

    def api(self, path, **params):
        url = "http://127.0.0.1:%d/api/v1/%s" % (self.port, path)
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=CALL_TIMEOUT) as response:
            body = json.load(response)
        if body.get("status") != "success":
            raise AssertionError("%s: %s" % (url, body))
        return body["data"]

    def query(self, expr):
        return self.api("query", query=expr)["result"]

    def stop(self):
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


def dashboard_queries():
    """(panel title, expression) of every query of the shipped dashboard."""
    with open(os.path.join(MONITORING, "grafana", "dashboards", "shardcache.json")) as f:
        dashboard = json.load(f)
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(name, value)
            out.append((panel["title"], expr))
    return out


def test_config(shipped, rules, cache, shard, replicator):
    """The shipped configuration's jobs and labels, with loopback targets and 1 s scrapes."""
    jobs = re.findall(r"job_name: (\S+)", shipped)
    if jobs != ["cache_server", "shard_replicator"]:
        raise AssertionError("monitoring/prometheus.yml's jobs changed (%s): update this test" %
                             jobs)
    return """global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - %s
scrape_configs:
  - job_name: cache_server
    static_configs:
      - targets: ["%s"]
        labels: {role: cache}
      - targets: ["%s"]
        labels: {role: shard, shard: a}
  - job_name: shard_replicator
    static_configs:
      - targets: ["%s"]
        labels: {shard: a}
""" % (rules, cache, shard, replicator)


class Writer(threading.Thread):
    """Changes objects that the CCR selects, a few times a second, until stopped."""

    def __init__(self, client):
        super().__init__(daemon=True)
        self.client = client
        self.stopped = threading.Event()
        self.errors = []

    def run(self):
        i = 0
        while not self.stopped.is_set():
            name = "w%d" % (i % 5)
            try:
                request = {"resource": reflection_test.WIDGETS,
                           "cluster": "root", "namespace": "default", "name": name}
                list(self.client.invoke("shardcache.v1.Store/Delete", [json.dumps(request)]))
            except Exception:  # pylint: disable=broad-except
                pass  # not there yet
            try:
                list(self.client.invoke("shardcache.v1.Store/Create", [json.dumps({
                    "resource": reflection_test.WIDGETS,
                    "object": {"metadata": {"cluster": "root", "namespace": "default",
                                            "name": name, "labels": {"app": "web"}},
                               "spec": {"size": i}}})]))
            except Exception as e:  # pylint: disable=broad-except
                self.errors.append(str(e))
            i += 1
            self.stopped.wait(0.2)


class MonitoringTest(unittest.TestCase):

    def test_ShippedConfigAndRules_PassPromtool(self):
        for command in (
                [ARGS.promtool, "check", "config", os.path.join(MONITORING, "prometheus.yml")],
                [ARGS.promtool, "check", "rules", os.path.join(MONITORING, "alerts.yml")],
                [ARGS.promtool, "test", "rules", os.path.join(MONITORING, "alerts_test.yml")]):
            code, out = run(command)
            self.assertEqual(code, 0, "%s:\n%s" % (" ".join(command), out))
            self.assertIn("SUCCESS", out)

    def test_EveryDashboardQuery_ReturnsDataFromARealScrape(self):
        shard = reflection_test.Server("shard").start()
        cache = reflection_test.Server("cache").start()
        replicator = reflection_test.Replicator("a", shard, cache).start()
        replicator.wait_ready()
        client = grpcurl_lite.Client(shard.address, work_dir=ARGS.work_dir,
                                     grpc_proto_dir=ARGS.grpc_proto_dir,
                                     default_timeout=CALL_TIMEOUT, connect_timeout=CALL_TIMEOUT)
        self.addCleanup(client.close)
        list(client.invoke("shardcache.v1.Store/Create", [reflection_test.WIDGETS_DEFINITION]))
        list(client.invoke("shardcache.v1.Store/Create", [json.dumps({
            "resource": {"group": "cache.shardcache.io", "version": "v1alpha1",
                         "resource": "clustercachedresources"},
            "object": {"metadata": {"cluster": "root", "name": "widgets"},
                       "spec": {"group": "example.com", "version": "v1",
                                "resource": "widgets"}}})]))
        writer = Writer(client)
        writer.start()
        self.addCleanup(writer.stopped.set)

        with open(os.path.join(MONITORING, "prometheus.yml")) as f:
            shipped = f.read()
        prometheus = Prometheus(test_config(
            shipped, os.path.join(MONITORING, "alerts.yml"),
            "127.0.0.1:%d" % cache.http_port, "127.0.0.1:%d" % shard.http_port,
            replicator.http_address)).start()
        self.addCleanup(prometheus.stop)

        queries = dashboard_queries()
        self.assertGreaterEqual(len(queries), 15)
        missing = {}
        deadline = time.monotonic() + DATA_TIMEOUT
        while time.monotonic() < deadline:
            missing = {}
            for title, expr in queries:
                result = prometheus.query(expr)
                values = [sample["value"][1] for sample in result]
                if not values or all(v == "NaN" for v in values):
                    missing[title] = expr
            if not missing:
                break
            time.sleep(1)
        self.assertEqual(missing, {}, "dashboard queries without data after %.0f s "
                         "(writer errors: %s)" % (DATA_TIMEOUT, writer.errors[-3:]))
        self.assertEqual(len(prometheus.query('up{shard="a",job="shard_replicator"} == 1')), 1)

        groups = prometheus.api("rules")["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        self.assertEqual(len(rules), 9, json.dumps(groups)[:2000])
        for rule in rules:
            self.assertEqual(rule["health"], "ok", rule)

        # The disk reserve rule reads a gauge that both stores export, and finds nothing on
        # disks with room.
        refusing = 'shardcache_store_writes_refused_no_space{job="cache_server"} == 0'
        self.assertEqual(len(prometheus.query(refusing)), 2)
        expr = next(r["query"] for r in rules if r["name"] == "ShardcacheDiskReserveShort")
        self.assertEqual(prometheus.query(expr), [])

        # The "no leader" rule's expression, live: nothing while the replica leads; shard "a"
        # once it is stopped (its scrape fails).
        expr = next(r["query"] for r in rules if r["name"] == "ShardcacheShardWithoutLeader")
        self.assertEqual(prometheus.query(expr), [])
        writer.stopped.set()
        replicator.stop()
        found = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not found:
            found = [s["metric"].get("shard") for s in prometheus.query(expr)]
            time.sleep(0.5)
        self.assertEqual(found, ["a"])


def main():
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", required=True, help="the cache_server binary")
    parser.add_argument("--replicator", required=True, help="the shard_replicator binary")
    parser.add_argument("--prometheus", default="/usr/bin/prometheus")
    parser.add_argument("--promtool", default="/usr/bin/promtool")
    parser.add_argument("--grpc-proto-dir", default=grpcurl_lite.DEFAULT_GRPC_PROTO_DIR)
    parser.add_argument("--work-dir", required=True, help="scratch directory")
    parser.add_argument("tests", nargs="*", help="test names to run (default: all)")
    ARGS = parser.parse_args()
    ARGS.server = os.path.abspath(ARGS.server)
    ARGS.replicator = os.path.abspath(ARGS.replicator)
    os.makedirs(ARGS.work_dir, exist_ok=True)
    ARGS.work_dir = tempfile.mkdtemp(prefix="run.", dir=os.path.abspath(ARGS.work_dir))
    reflection_test.ARGS = ARGS  # its Server and Replicator read the binaries and work dir there

    loader = unittest.TestLoader()
    if ARGS.tests:
        suite = loader.loadTestsFromNames(ARGS.tests, sys.modules[__name__])
    else:
        suite = loader.loadTestsFromTestCase(MonitoringTest)
    ok = False
    try:
        ok = unittest.TextTestRunner(stream=sys.stdout, verbosity=2).run(suite).wasSuccessful()
    finally:
        for server in reversed(reflection_test.SERVERS):
            try:
                server.stop()
            except Exception as e:  # pylint: disable=broad-except
                sys.stderr.write("stopping the %s server: %s\n" % (server.role, e))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
