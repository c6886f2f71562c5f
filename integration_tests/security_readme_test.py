#!/usr/bin/python3
"""docs/security.md's examples, run as documented against TLS stores.

  /usr/bin/python3 security_readme_test.py --server build/cache_server/cache_server \\
      --grpc-proto-dir /usr/share/grpc-proto --work-dir /tmp/security_readme_test

Makes certificates with scripts/make-certs.sh (-o certs -s "a b", as docs/security.md says) in a
fresh directory, starts a cache (--role=cache) and shard "a"'s store (--role=shard --shard=a)
with the page's TLS flags (--tls-cert-file, --tls-key-file, --client-ca-file) on loopback ports
they pick, then runs every command of the page's ```sh blocks in one shell in that directory, with
grpcurl_lite.py in grpcurl's place and the documented addresses (127.0.0.1:7070 the cache,
127.0.0.1:7071 shard "a"'s store) pointing at those servers. Each command must exit 0 unless its
line ends with "# fails: CODE": then it must fail with that code. The PERMISSION_DENIED message
that the page shows must be what one of the commands printed.

Then the Kubernetes view over HTTPS (cache_server --kube-api-listen with the same TLS flags):
kubectl with the administrator's and the reader's certificates reads and watches, without a
certificate it gets 401 Unauthorized, with a certificate of no role 403 Forbidden, and a write
405; nothing changes in the store. Exits non-zero on any failure.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # No __pycache__ in the source tree.
import grpcurl_lite  # noqa: E402  pylint: disable=wrong-import-position
import reflection_test  # noqa: E402  pylint: disable=wrong-import-position

DOC = os.path.join("docs", "security.md")
SECTION = "# Security"
MAKE_CERTS = os.path.join(os.path.dirname(HERE), "scripts", "make-certs.sh")
ARGS = None


class TlsServer(reflection_test.Server):
    """A cache_server with docs/security.md's TLS flags, relative to the run directory."""

    def __init__(self, role, run_dir, extra=()):
        super().__init__(role)
        self.run_dir = run_dir
        self.extra = list(extra)

    def command(self):
        certs = os.path.join(self.run_dir, "certs")
        return super().command() + [
            "--data-dir=" + os.path.join(self.dir, "data"),
            "--tls-cert-file=" + os.path.join(certs, "server.crt"),
            "--tls-key-file=" + os.path.join(certs, "server.key"),
            "--client-ca-file=" + os.path.join(certs, "ca.crt"),
        ] + self.extra


class SecurityReadmeTest(unittest.TestCase):

    def setUp(self):
        self.run_dir = tempfile.mkdtemp(prefix="security.", dir=ARGS.work_dir)
        subprocess.run([MAKE_CERTS, "-o", "certs", "-s", "a b"], cwd=self.run_dir, check=True,
                       capture_output=True)
        self.cache = TlsServer("cache", self.run_dir).start()
        self.shard = TlsServer("shard", self.run_dir, ["--shard=a"]).start()

    def tearDown(self):
        self.cache.stop()
        self.shard.stop()

    def test_SecurityExamples_RunAsDocumented(self):
        text = reflection_test.read_doc(DOC)
        commands = reflection_test.doc_commands(text, SECTION)
        self.assertGreaterEqual(len(commands), 8, "too few grpcurl examples in the section")
        for command, _ in commands:
            self.assertIn("grpcurl ", command)
        out_dir = os.path.join(self.run_dir, "out")
        os.makedirs(out_dir)
        q = reflection_test.shell_quote
        script = [
            "set -o pipefail",
            'grpcurl() { %s %s -work-dir %s -grpc-proto-dir %s -max-time %d "$@"; }' % (
                q(sys.executable), q(reflection_test.GRPCURL_LITE), q(ARGS.work_dir),
                q(ARGS.grpc_proto_dir), reflection_test.DOC_COMMAND_MAX_TIME),
        ]
        for n, (command, _) in enumerate(commands):
            command = command.replace(reflection_test.DOCUMENTED_SHARD_ADDRESS,
                                      self.shard.address)
            command = command.replace(reflection_test.DOCUMENTED_CACHE_ADDRESS,
                                      self.cache.address)
            base = os.path.join(out_dir, str(n))
            script += ["{", command, "} >%s.out 2>%s.err" % (base, base),
                       "echo $? >%s.rc" % base]
        script_path = os.path.join(out_dir, "examples.sh")
        with open(script_path, "w") as f:
            f.write("\n".join(script) + "\n")
        run = subprocess.run(["/bin/bash", script_path], capture_output=True, text=True,
                             cwd=self.run_dir, timeout=reflection_test.DOC_SCRIPT_TIMEOUT)
        self.assertEqual(run.returncode, 0, "%s\n%s" % (run.stdout, run.stderr))

        errors = []
        for n, (command, fails) in enumerate(commands):
            rc, out, err = reflection_test.command_result(out_dir, n)
            errors.append(err)
            what = "%s command %d:\n%s\nexit code %d\nstdout:\n%s\nstderr:\n%s\n%s\n%s" % (
                DOC, n + 1, command, rc, out[-3000:], err[-3000:], self.cache.log(),
                self.shard.log())
            with self.subTest(command=n + 1):
                if fails is None:
                    self.assertEqual(rc, 0, what)
                else:
                    code = grpcurl_lite.code_from_name(fails)
                    self.assertEqual(rc, grpcurl_lite.STATUS_CODE_OFFSET + code.value[0], what)
                    self.assertIn("Code: %s\n" % grpcurl_lite.code_name(code), err, what)

        section = reflection_test.doc_section(text, SECTION)
        shown = re.search(r"^```\n(ERROR:\n.*?)^```", section, re.M | re.S)
        self.assertIsNotNone(shown, "the section shows no error message")
        self.assertIn(shown.group(1), errors, "no command printed the error the page shows")


KUBECTL_TIMEOUT = 60.0


class KubeApiTlsTest(unittest.TestCase):
    """The Kubernetes view behind the same certificates and policy as the gRPC port."""

    def setUp(self):
        self.run_dir = tempfile.mkdtemp(prefix="kube-tls.", dir=ARGS.work_dir)
        subprocess.run([MAKE_CERTS, "-o", "certs", "-s", "a"], cwd=self.run_dir, check=True,
                       capture_output=True)
        certs = os.path.join(self.run_dir, "certs")
        # A certificate of the CA that names no role.
        subprocess.run(["openssl", "req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout",
                        "nobody.key", "-out", "nobody.csr", "-subj", "/CN=nobody"],
                       cwd=certs, check=True, capture_output=True)
        subprocess.run(["openssl", "x509", "-req", "-in", "nobody.csr", "-CA", "ca.crt", "-CAkey",
                        "ca.key", "-CAcreateserial", "-out", "nobody.crt", "-days", "1"],
                       cwd=certs, check=True, capture_output=True)
        self.cache = TlsServer("cache", self.run_dir, ["--kube-api-listen=127.0.0.1:0"]).start()
        with open(self.cache.port_file) as f:
            ports = dict(line.strip().split("=", 1) for line in f if "=" in line)
        self.kube_port = int(ports["kube_api_port"])
        self.kubectl_path = shutil.which("kubectl")
        self.assertIsNotNone(self.kubectl_path, "kubectl is not on PATH (scripts/deps.sh installs "
                             "Debian's kubernetes-client)")

    def tearDown(self):
        self.cache.stop()

    def grpcurl(self, user, *args):
        certs = os.path.join(self.run_dir, "certs")
        return reflection_test.run_grpcurl_lite(
            ["-cacert", os.path.join(certs, "ca.crt"),
             "-cert", os.path.join(certs, user + ".crt"),
             "-key", os.path.join(certs, user + ".key")] + list(args))

    def kubectl(self, user, *args, popen=False):
        certs = os.path.join(self.run_dir, "certs")
        command = [self.kubectl_path, "--kubeconfig=/dev/null",
                   "--cache-dir=" + os.path.join(self.run_dir, "kubectl-cache"),
                   "--server=https://127.0.0.1:%d/services/cache/shards/*/clusters/*" %
                   self.kube_port,
                   "--certificate-authority=" + os.path.join(certs, "ca.crt")]
        if user is not None:
            command += ["--client-certificate=" + os.path.join(certs, user + ".crt"),
                        "--client-key=" + os.path.join(certs, user + ".key")]
        else:
            # A bearer token, which the view does not take: without any credentials kubectl
            # would ask for a user name instead of sending the request.
            command += ["--token=not-a-certificate"]
        command += list(args)
        if popen:
            return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
        return subprocess.run(command, capture_output=True, text=True, timeout=KUBECTL_TIMEOUT,
                              stdin=subprocess.DEVNULL)

    def write_widget(self, method, name, size):
        body = {"resource": reflection_test.WIDGETS,
                "object": {"metadata": {"shard": "a", "cluster": "root:org",
                                        "namespace": "default", "name": name},
                           "spec": {"size": size}}}
        run = self.grpcurl("admin", "-d", json.dumps(body), self.cache.address,
                           "shardcache.v1.Store/" + method)
        self.assertEqual(run.returncode, 0, run.stderr + self.cache.log())

    def test_KubectlWithCertificatesAndPolicy(self):
        self.write_widget("Create", "w1", 1)
        run = self.kubectl("admin", "get", "widgets", "-A", "-o", "json")
        self.assertEqual(run.returncode, 0, run.stderr + self.cache.log())
        items = json.loads(run.stdout)["items"]
        self.assertEqual([i["metadata"]["name"] for i in items], ["w1"])
        self.assertEqual(items[0]["metadata"]["annotations"]["kcp.io/shard"], "a")

        # The reader watches, and sees a change.
        watch = self.kubectl("reader", "get", "widgets", "-n", "default", "--watch-only",
                             "-o", "custom-columns=NAME:.metadata.name,SIZE:.spec.size",
                             "--no-headers", popen=True)
        lines = []
        reader = threading.Thread(target=lambda: lines.extend(iter(watch.stdout.readline, "")))
        reader.start()
        try:
            deadline = time.monotonic() + 30
            size = 2
            # The watch may start after a write: write until kubectl prints a change.
            while time.monotonic() < deadline and not any("w1" in line for line in lines):
                self.write_widget("Update", "w1", size)
                size += 1
                wait_until = time.monotonic() + 2
                while time.monotonic() < wait_until and not lines:
                    time.sleep(0.05)
        finally:
            watch.kill()
            reader.join(timeout=10)
            err = watch.stderr.read()
            watch.wait(timeout=10)
        seen = "".join(lines)
        self.assertRegex(seen, r"w1\s+\d+", "the reader's watch printed no change: " + err)

        run = self.kubectl(None, "get", "widgets", "-A")
        self.assertNotEqual(run.returncode, 0)
        self.assertIn("Unauthorized", run.stderr)
        run = self.kubectl("nobody", "get", "widgets", "-A")
        self.assertNotEqual(run.returncode, 0)
        self.assertIn("Forbidden", run.stderr + run.stdout)
        self.assertIn('user "nobody"', run.stderr)
        before = self.kubectl("admin", "get", "widget", "w1", "-n", "default", "-o", "json")
        run = self.kubectl("admin", "delete", "widget", "w1", "-n", "default")
        self.assertNotEqual(run.returncode, 0)
        self.assertIn("MethodNotAllowed", run.stderr + run.stdout)
        after = self.kubectl("admin", "get", "widget", "w1", "-n", "default", "-o", "json")
        self.assertEqual(after.returncode, 0, after.stderr)
        self.assertEqual(json.loads(after.stdout), json.loads(before.stdout))


def main():
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", required=True, help="the cache_server binary")
    parser.add_argument("--grpc-proto-dir", default=grpcurl_lite.DEFAULT_GRPC_PROTO_DIR)
    parser.add_argument("--work-dir", required=True, help="scratch directory")
    parser.add_argument("--source-dir", default=reflection_test.SOURCE_DIR,
                        help="the source tree whose docs/security.md holds the examples")
    ARGS = parser.parse_args()
    ARGS.server = os.path.abspath(ARGS.server)
    ARGS.source_dir = os.path.abspath(ARGS.source_dir)
    os.makedirs(ARGS.work_dir, exist_ok=True)
    ARGS.work_dir = tempfile.mkdtemp(prefix="run.", dir=os.path.abspath(ARGS.work_dir))
    reflection_test.ARGS = ARGS
    result = unittest.TextTestRunner(verbosity=2).run(
        unittest.TestSuite([
            unittest.defaultTestLoader.loadTestsFromTestCase(SecurityReadmeTest),
            unittest.defaultTestLoader.loadTestsFromTestCase(KubeApiTlsTest)]))
    if result.wasSuccessful():
        shutil.rmtree(ARGS.work_dir, ignore_errors=True)
    else:
        print("logs and outputs: %s" % ARGS.work_dir)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
