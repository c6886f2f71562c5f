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
that the page shows must be what one of the commands printed. Exits non-zero on any failure.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
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
        unittest.defaultTestLoader.loadTestsFromTestCase(SecurityReadmeTest))
    if result.wasSuccessful():
        shutil.rmtree(ARGS.work_dir, ignore_errors=True)
    else:
        print("logs and outputs: %s" % ARGS.work_dir)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
