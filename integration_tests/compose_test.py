#!/usr/bin/python3
"""compose_test: the docker-compose deployment, end to end, run the way docs/operations.md runs it.

  /usr/bin/python3 integration_tests/compose_test.py [--work-dir DIR] [--keep-work-dir] [--ha-only]

(--ha-only: the image's build, then the high-availability phase alone.)

Run by scripts/test.sh as a stage of its own (after ctest: the image's build compiles the project
and would slow the timed tests beside it). It needs root, Debian's docker.io, docker-compose
(1.29) and debootstrap (scripts/deps.sh installs them), and /usr/bin/python3 with
python3-grpcio for integration_tests/grpcurl_lite.py, which stands in for grpcurl.

The Docker daemon: the one that DOCKER_HOST (or the default socket) names when it answers; else
the test starts a dockerd of its own, with its data under /var/cache/shardcache-compose-test
(SHARDCACHE_COMPOSE_TEST_CACHE overrides it: the image's layers stay there between runs, so that
a rerun on the same machine does not compile again) and its sockets in a temporary folder, and
stops it at the end. A lock on that folder keeps two runs from sharing it. debian:bookworm-slim
is made with debootstrap when the daemon lacks it (no registry is reachable). The test is
skipped, with a line that says why, only where no Docker daemon can run: none answers and this
is not root, or dockerd is not installed, or it cannot start (set
SHARDCACHE_COMPOSE_TEST_REQUIRED=1 to make those a failure).

What it checks, in order, on a copy of the source tree (certs/ is made there) with a compose
project of its own (compose-test-<pid>), an image tag of its own (SHARDCACHE_IMAGE) and free
host ports (the SHARDCACHE_*_PORT variables), so that it never touches a running deployment:

- `docker-compose build`, then docs/operations.md's `docker-compose up --build -d`, which must reuse
  that image (the same SHARDCACHE_BUILD_JOBS for both); every service turns healthy; published
  ports are on 127.0.0.1 only, and each container is on the project's network only; the
  binaries' --version names the commit the tree was copied from.
- The replication walk of docs/replication-by-example.md over TLS (grpcurl_lite.py with
  -cacert/-cert/-key, as grpcurl): a definition, three objects and a CCR in shard "a"; the CCR
  Ready; the copies and the CCR's copy in the cache; a watch on the cache that sees a change
  made in the shard.
- `up -d --scale replicator-a=3`: three healthy replicas, exactly one leads (docs/operations.md's
  metrics loop), `logs --no-color` shows "started leading" without colour codes, and
  `exec replicator-a curl -s 127.0.0.1:8080/readyz` answers ok.
- `docker stop` of the leader: another leads, well before the lease could expire, with the next
  epoch; `docker kill` of the next leader: another leads once the lease has expired. After each,
  a new object reaches the cache.
- docker-compose.shard-b.yml added: every service healthy (it prints which containers were
  recreated), shard "b"'s objects and shard "a"'s both reach the cache.
- `restart cache`: the same store (its id), its data kept, replication from both shards goes on.
- `down -v`: no container, volume or network of the project is left, and the ports are free.

Then the high-availability deployment, docs/operations.md's "High availability: replicas on etcd",
in the same project once the first is down:

- `up --build -d` with docker-compose.yml and docker-compose.ha.yml (it builds the etcd image from
  the Dockerfile's stage `etcd`): etcd-1..3, cache, cache-2, shard-a and replicator-a healthy, the
  members publish no port; `exec etcd-1 etcdctl member list` shows three started members and
  `endpoint health --cluster` three healthy ones (TLS for clients and peers); both cache replicas'
  /readyz says ok.
- The replication walk in short: a definition, an object and a CCR in shard "a"; the object's copy
  and the CCR's read the same, resourceVersions included, through cache and cache-2.
- `docker kill` of etcd's leader: another member leads, a new object reaches the cache (and
  cache-2), both replicas ready again.
- The replacement of that member, with docs/operations.md's commands: member remove, its container
  and volume removed, member add, `SHARDCACHE_ETCD_INITIAL_CLUSTER_STATE=existing up -d --no-deps`;
  it turns healthy with a new member id and three started members; a plain `up -d` afterwards
  keeps it in the cluster.
- `docker kill` of cache: a new object reaches cache-2 (the leading replicator moved to it); cache
  started again serves the same copies at the same resourceVersions.
- `down -v` leaves nothing, as above.

Every wait is bounded. It prints what it saw on the way and the figures last (build time, time
to healthy, the two takeovers, the high-availability phase's steps and its length); exits 0 when
every check passed (or on a skip), 1 otherwise. On a failure it prints the services' state and the
last lines of their logs.
"""

import argparse
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # No __pycache__ in the source tree.
import grpcurl_lite  # noqa: E402  pylint: disable=wrong-import-position

GRPCURL_LITE = os.path.join(HERE, "grpcurl_lite.py")
CACHE_ROOT = os.environ.get("SHARDCACHE_COMPOSE_TEST_CACHE", "/var/cache/shardcache-compose-test")
BASE_IMAGE = "debian:bookworm-slim"
DEBIAN_MIRROR = os.environ.get("SHARDCACHE_DEBIAN_MIRROR", "http://deb.debian.org/debian")
SLIM_IMAGE_FILES = {
    "etc/dpkg/dpkg.cfg.d/docker-apt-speedup": "force-unsafe-io\n",
    "etc/dpkg/dpkg.cfg.d/docker": "".join("path-exclude /usr/share/%s/*\n" % d for d in (
        "doc", "groff", "info", "linda", "lintian", "locale", "man")) +
    "path-include /usr/share/doc/*/copyright\npath-include /usr/share/locale/locale.alias\n",
    "etc/apt/apt.conf.d/docker-no-languages": 'Acquire::Languages "none";\n',
}
IMAGE = "shardcache-compose-test:latest"
ETCD_IMAGE = "shardcache-compose-test-etcd:latest"
PROJECT = "compose-test-%d" % os.getpid()
SHARD_B_FILES = "docker-compose.yml:docker-compose.shard-b.yml"
HA_FILES = "docker-compose.yml:docker-compose.ha.yml"
ETCD_MEMBERS = ("etcd-1", "etcd-2", "etcd-3")

# Bounds of every wait (seconds).
DAEMON_START_TIMEOUT = 60
DAEMON_STOP_TIMEOUT = 60
LOCK_TIMEOUT = 1800  # another run on the same cache folder
DEBOOTSTRAP_TIMEOUT = 900
BUILD_TIMEOUT = 1800  # a cold build: the compile alone took 255 s with JOBS=2 on 2 cores
UP_TIMEOUT = 600
COMMAND_TIMEOUT = 120
HEALTHY_TIMEOUT = 180
EVENTUALLY_TIMEOUT = 60  # replication, a status, a leader
CALL_TIMEOUT = 10
# The replicator's defaults (docs/operations.md, "shard_replicator's flags").
LEASE_DURATION = 15.0
RETRY_PERIOD = 2.0

GADGETS = {"group": "example.com", "version": "v1", "resource": "gadgets"}
CCRS = {"group": "cache.shardcache.io", "version": "v1alpha1",
        "resource": "clustercachedresources"}
DEFINITIONS = {"group": "core.shardcache.io", "version": "v1", "resource": "resourcedefinitions"}
LEASES = {"group": "coordination.shardcache.io", "version": "v1", "resource": "leases"}
LEASE_KEY = {"resource": LEASES, "cluster": "root", "namespace": "shardcache-system",
             "name": "shard-replicator"}

ARGS = None
FIGURES = []  # (name, text), printed at the end.


class Failure(Exception):
    """A check that failed."""


class Skip(Exception):
    """No Docker daemon can run here."""


def log(text):
    sys.stdout.write("compose_test: %s\n" % text)
    sys.stdout.flush()


def figure(name, text):
    FIGURES.append((name, text))
    log("%s: %s" % (name, text))


def tail(text, lines=40):
    return "\n".join((text or "").rstrip().split("\n")[-lines:])


def run(command, timeout=COMMAND_TIMEOUT, check=True, env=None, cwd=None, input_text=None):
    """Runs command; returns the CompletedProcess (text). check: a non-zero exit is a Failure."""
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                                env=env, cwd=cwd, input=input_text,
                                stdin=None if input_text is not None else subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise Failure("%s: still running after %d s\n%s" % (
            " ".join(command), timeout, tail(e.stdout if isinstance(e.stdout, str) else "")))
    if check and result.returncode != 0:
        raise Failure("%s: exit %d\n%s\n%s" % (" ".join(command), result.returncode,
                                               tail(result.stdout), tail(result.stderr)))
    return result


def eventually(what, check, timeout=EVENTUALLY_TIMEOUT, interval=0.5):
    """Calls check() until it returns a true value (returned) or the time is up (Failure with
    what, and the last exception or value)."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            value = check()
            if value:
                return value
            last = value
        except (Failure, grpcurl_lite.Error, grpcurl_lite.grpc.RpcError) as e:
            last = e
        if time.monotonic() >= deadline:
            raise Failure("%s: not so after %d s (last: %s)" % (what, timeout, last))
        time.sleep(interval)


# ----------------------------------------------------------------------------------------------
# The Docker daemon.


class Daemon:
    """The daemon the test talks to: a reachable one, or a dockerd that it starts."""

    def __init__(self, work_dir):
        self.work_dir = work_dir
        self.env = dict(os.environ)
        self.process = None
        self.exec_root = None
        self.lock_file = None
        self.own = False

    def reachable(self, timeout=15):
        try:
            result = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"],
                                    capture_output=True, text=True, timeout=timeout,
                                    env=self.env, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return result.returncode == 0

    def start(self):
        """Uses a reachable daemon, or starts one; raises Skip where none can run."""
        if shutil.which("docker") is None:
            raise Skip("no docker client (scripts/deps.sh installs docker.io)")
        if self.reachable():
            log("using the Docker daemon at %s" % self.env.get("DOCKER_HOST", "the default socket"))
            return
        dockerd = shutil.which("dockerd") or ("/usr/sbin/dockerd" if os.path.exists(
            "/usr/sbin/dockerd") else None)
        if dockerd is None:
            raise Skip("no Docker daemon answers and dockerd is not installed "
                       "(scripts/deps.sh installs docker.io)")
        if os.geteuid() != 0:
            raise Skip("no Docker daemon answers, and only root can start one")
        os.makedirs(CACHE_ROOT, exist_ok=True)
        self._lock()
        self._stop_leftover()
        data_root = os.path.join(CACHE_ROOT, "docker")
        # A short path: the sockets inside must fit in a sockaddr_un.
        self.exec_root = tempfile.mkdtemp(prefix="shardcache-compose-test.", dir="/tmp")
        socket_path = os.path.join(self.exec_root, "docker.sock")
        self.env["DOCKER_HOST"] = "unix://" + socket_path
        log_path = os.path.join(self.work_dir, "dockerd.log")
        command = [dockerd, "--data-root", data_root, "--exec-root", self.exec_root,
                   "-H", "unix://" + socket_path,
                   "--pidfile", os.path.join(self.exec_root, "docker.pid"),
                   "--storage-driver=overlay2"]
        log("starting %s" % " ".join(command))
        with open(log_path, "wb") as f:
            # A session of its own: dockerd and the containerd it starts are stopped together.
            self.process = subprocess.Popen(command, stdout=f, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
        self.own = True
        with open(os.path.join(CACHE_ROOT, "dockerd.pid"), "w") as f:
            f.write("%d\n" % self.process.pid)
        deadline = time.monotonic() + DAEMON_START_TIMEOUT
        while not self.reachable(timeout=5):
            if self.process.poll() is not None or time.monotonic() >= deadline:
                with open(log_path, errors="replace") as f:
                    why = tail(f.read(), 15)
                self.stop()
                raise Skip("dockerd cannot run here (%s):\n%s" % (
                    "it exited" if self.process.poll() is not None else "no answer in %d s" %
                    DAEMON_START_TIMEOUT, why))
            time.sleep(0.5)
        log("dockerd %d answers at %s (data in %s)" % (self.process.pid, socket_path, data_root))
        # What a run that was killed may have left in this daemon's data: it is the test's alone.
        leftovers = run(["docker", "ps", "-aq"], env=self.env).stdout.split()
        if leftovers:
            log("removing %d containers left by an earlier run" % len(leftovers))
            run(["docker", "rm", "-f", "-v"] + leftovers, env=self.env)
        run(["docker", "volume", "prune", "-f"], env=self.env)
        run(["docker", "network", "prune", "-f"], env=self.env)

    def _lock(self):
        self.lock_file = open(os.path.join(CACHE_ROOT, "lock"), "w")
        deadline = time.monotonic() + LOCK_TIMEOUT
        waited = False
        while True:
            try:
                fcntl.flock(self.lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise Failure("%s is locked by another run for %d s" % (CACHE_ROOT,
                                                                         LOCK_TIMEOUT))
                if not waited:
                    log("waiting for another run that uses %s" % CACHE_ROOT)
                    waited = True
                time.sleep(2)

    def _stop_leftover(self):
        """Stops the dockerd that a killed run of this test left on the data root (its pid is
        in dockerd.pid, and its command line names the data root), if it still runs."""
        pid_path = os.path.join(CACHE_ROOT, "dockerd.pid")
        try:
            with open(pid_path) as f:
                pid = int(f.read().strip())
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                cmdline = f.read().decode(errors="replace").split("\0")
        except (OSError, ValueError):
            return
        if not cmdline or not cmdline[0].endswith("dockerd") or \
                os.path.join(CACHE_ROOT, "docker") not in cmdline:
            return
        log("stopping dockerd %d, left running by an earlier run" % pid)
        _stop_process_group(pid)

    def stop(self):
        if self.process is not None:
            log("stopping dockerd %d" % self.process.pid)
            _stop_process_group(self.process.pid, self.process)
            self.process = None
            try:
                os.remove(os.path.join(CACHE_ROOT, "dockerd.pid"))
            except OSError:
                pass
        if self.exec_root is not None:
            shutil.rmtree(self.exec_root, ignore_errors=True)
            self.exec_root = None
        if self.lock_file is not None:
            self.lock_file.close()
            self.lock_file = None


def _stop_process_group(pid, process=None):
    """SIGTERM to pid; after DAEMON_STOP_TIMEOUT, SIGKILL to its process group (a session that
    the test started: dockerd and its containerd)."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + DAEMON_STOP_TIMEOUT
    while time.monotonic() < deadline:
        if process is not None:
            if process.poll() is not None:
                return
        elif not os.path.exists("/proc/%d" % pid):
            return
        time.sleep(0.2)
    log("dockerd %d did not stop in %d s: killing its process group" % (pid, DAEMON_STOP_TIMEOUT))
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if process is not None:
        process.wait(timeout=10)


def ensure_base_image(daemon):
    """debian:bookworm-slim, made with debootstrap when the daemon lacks it."""
    if run(["docker", "image", "inspect", BASE_IMAGE], check=False,
           env=daemon.env).returncode == 0:
        return
    if shutil.which("debootstrap") is None and not os.path.exists("/usr/sbin/debootstrap"):
        raise Failure("the daemon has no %s and debootstrap is not installed "
                      "(scripts/deps.sh installs it)" % BASE_IMAGE)
    start = time.monotonic()
    root = tempfile.mkdtemp(prefix="rootfs.", dir=daemon.work_dir)
    try:
        log("making %s with debootstrap (%s)" % (BASE_IMAGE, DEBIAN_MIRROR))
        run(["debootstrap", "--variant=minbase", "bookworm", root, DEBIAN_MIRROR],
            timeout=DEBOOTSTRAP_TIMEOUT)
        # The sources of Debian's own image: the release, its updates and security.
        os.remove(os.path.join(root, "etc/apt/sources.list"))
        with open(os.path.join(root, "etc/apt/sources.list.d/debian.sources"), "w") as f:
            for uri, suites in ((DEBIAN_MIRROR, "bookworm bookworm-updates"),
                                ("http://deb.debian.org/debian-security", "bookworm-security")):
                f.write("Types: deb\nURIs: %s\nSuites: %s\nComponents: main\n"
                        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n" % (
                            uri, suites))
        # As Debian's slim image: dpkg without a sync per file, and without documentation and
        # translations; apt without translations (the image's builds install faster).
        for path, text in SLIM_IMAGE_FILES.items():
            with open(os.path.join(root, path), "w") as f:
                f.write(text)
        tar = subprocess.Popen(["tar", "-C", root, "-c", "."], stdout=subprocess.PIPE)
        try:
            result = subprocess.run(["docker", "import", "--change", 'CMD ["bash"]', "-",
                                     BASE_IMAGE], stdin=tar.stdout, capture_output=True,
                                    text=True, timeout=300, env=daemon.env)
        finally:
            tar.stdout.close()
            tar.wait(timeout=60)
        if result.returncode != 0 or tar.returncode != 0:
            raise Failure("docker import failed: %s" % result.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    figure("base image", "%s made with debootstrap in %.0f s" % (BASE_IMAGE,
                                                                 time.monotonic() - start))


# ----------------------------------------------------------------------------------------------
# The deployment: a copy of the source tree, docker-compose and grpcurl_lite.py.


def copy_source(dest):
    """The source tree as docker-compose sees it, without build trees, run data and certs; of
    .git only what the image reads (HEAD and the refs)."""
    skip = {".git", ".run", "certs", ".ccache", "__pycache__"}

    def ignore(directory, names):
        top = os.path.abspath(directory) == SOURCE_DIR
        return [n for n in names if n in skip or n.endswith(".pyc") or
                (top and n.startswith("build"))]

    shutil.copytree(SOURCE_DIR, dest, ignore=ignore, symlinks=True)
    git = os.path.join(SOURCE_DIR, ".git")
    if os.path.isfile(git):
        # A worktree's .git names the folder of its own HEAD, which the image cannot follow:
        # give it HEAD's commit, detached (the Dockerfile reads that form too).
        commit = subprocess.run(["git", "-C", SOURCE_DIR, "rev-parse", "HEAD"],
                                capture_output=True, text=True, timeout=30).stdout.strip()
        if commit:
            os.makedirs(os.path.join(dest, ".git"))
            with open(os.path.join(dest, ".git", "HEAD"), "w") as f:
                f.write(commit + "\n")
    elif os.path.isdir(git):
        os.makedirs(os.path.join(dest, ".git"))
        for name in ("HEAD", "refs", "packed-refs"):
            source = os.path.join(git, name)
            if os.path.isdir(source):
                shutil.copytree(source, os.path.join(dest, ".git", name))
            elif os.path.isfile(source):
                shutil.copy2(source, os.path.join(dest, ".git", name))


def source_commit():
    """The commit the image should report: HEAD's, as CMake reads it; "unknown" outside git."""
    try:
        result = subprocess.run(["git", "-C", SOURCE_DIR, "rev-parse", "--short=12", "HEAD"],
                                capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return result.stdout.strip() if result.returncode == 0 and result.stdout.strip() else \
        "unknown"


def free_ports(count):
    """count TCP ports free on 127.0.0.1 now (held together, so that they differ)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def port_free(port):
    """Whether nothing listens on 127.0.0.1:port. SO_REUSEADDR, as servers bind: the connections
    that a published port's proxy closed first stay in TIME_WAIT for a minute, without holding
    the port for a server."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


class Deployment:
    """One compose project in a copy of the source tree."""

    def __init__(self, daemon, directory):
        self.daemon = daemon
        self.dir = directory
        names = ("CACHE", "CACHE_HTTP", "CACHE_KUBE", "SHARD", "SHARD_HTTP", "SHARD_B",
                 "SHARD_B_HTTP", "CACHE_2", "CACHE_2_HTTP", "CACHE_2_KUBE")
        self.ports = dict(zip(names, free_ports(len(names))))
        self.env = dict(daemon.env)
        for name in ("COMPOSE_FILE", "SHARDCACHE_GIT_COMMIT", "COMPOSE_PROFILES",
                     "SHARDCACHE_ETCD_INITIAL_CLUSTER_STATE"):
            self.env.pop(name, None)
        self.env.update({
            "COMPOSE_PROJECT_NAME": PROJECT,
            "SHARDCACHE_IMAGE": IMAGE,
            "SHARDCACHE_ETCD_IMAGE": ETCD_IMAGE,
            "SHARDCACHE_BUILD_JOBS": os.environ.get("SHARDCACHE_BUILD_JOBS", "2"),
        })
        for name, port in self.ports.items():
            self.env["SHARDCACHE_%s_PORT" % name] = str(port)
        self.started = False
        self.clients = {}

    def address(self, name):
        return "127.0.0.1:%d" % self.ports[name]

    def compose(self, *args, timeout=COMMAND_TIMEOUT, check=True, input_text=None):
        return run(["docker-compose"] + list(args), timeout=timeout, check=check, env=self.env,
                   cwd=self.dir, input_text=input_text)

    def docker(self, *args, timeout=COMMAND_TIMEOUT, check=True):
        return run(["docker"] + list(args), timeout=timeout, check=check, env=self.env)

    # The containers, as Docker sees them.

    def containers(self, all_states=False):
        """docker inspect of the project's containers (running ones unless all_states)."""
        command = ["ps", "-q", "--no-trunc", "--filter",
                   "label=com.docker.compose.project=%s" % PROJECT]
        if all_states:
            command.insert(1, "-a")
        ids = self.docker(*command).stdout.split()
        if not ids:
            return []
        return json.loads(self.docker("inspect", *ids).stdout)

    @staticmethod
    def service(container):
        return container["Config"]["Labels"].get("com.docker.compose.service")

    def running(self, service):
        return [c for c in self.containers() if self.service(c) == service]

    def wait_healthy(self, expected, since):
        """Waits until the running containers are exactly expected ({service: count}), each
        healthy; returns the seconds since `since`."""
        def check():
            counts, unhealthy = {}, []
            for c in self.containers():
                name = self.service(c)
                counts[name] = counts.get(name, 0) + 1
                health = c["State"].get("Health", {}).get("Status")
                if health != "healthy":
                    unhealthy.append("%s %s" % (c["Name"].lstrip("/"), health))
            if counts != expected:
                raise Failure("running: %s, want %s" % (counts, expected))
            if unhealthy:
                raise Failure("not healthy: %s" % ", ".join(unhealthy))
            return True
        eventually("every service healthy", check, timeout=HEALTHY_TIMEOUT, interval=1)
        return time.monotonic() - since

    # gRPC, over TLS with the admin's certificate, as docs/security.md's grpcurl commands.

    def tls_flags(self):
        return ["-cacert", "certs/ca.crt", "-cert", "certs/admin.crt", "-key", "certs/admin.key"]

    def grpcurl(self, address, method, data=None, max_time=None, stdin=None, check=True):
        """grpcurl_lite.py as the documents run grpcurl; returns the CompletedProcess."""
        command = ["/usr/bin/python3", GRPCURL_LITE] + self.tls_flags()
        if max_time is not None:
            command += ["-max-time", str(max_time)]
        if data is not None:
            command += ["-d", data if isinstance(data, str) else json.dumps(data)]
        elif stdin is not None:
            command += ["-d", "@"]
        command += [self.address(address), method]
        return run(command, cwd=self.dir, check=check, input_text=stdin,
                   timeout=COMMAND_TIMEOUT + (max_time or 0))

    def call(self, address, method, request):
        """One unary call through grpcurl_lite's client (for the polls); returns the response
        as JSON (proto field names, as grpcurl prints it)."""
        client = self.clients.get(address)
        if client is None:
            certs = os.path.join(self.dir, "certs")
            client = grpcurl_lite.Client(
                self.address(address), plaintext=False, work_dir=ARGS.work_dir,
                tls=(os.path.join(certs, "ca.crt"), os.path.join(certs, "admin.crt"),
                     os.path.join(certs, "admin.key")), default_timeout=CALL_TIMEOUT)
            self.clients[address] = client
        try:
            response = next(client.invoke(method, [request]))
        except grpcurl_lite.grpc.RpcError as e:
            if e.code() == grpcurl_lite.grpc.StatusCode.UNAVAILABLE:
                pass  # The channel reconnects by itself.
            raise
        return json.loads(grpcurl_lite.message_to_json(response, resolve=client.find_message))

    def close_clients(self):
        for client in self.clients.values():
            client.close()
        self.clients = {}

    def lease(self, shard_address="SHARD"):
        return self.call(shard_address, "shardcache.v1.Store/Get", LEASE_KEY)["spec"]

    def cache_gadgets(self, shard=None, cache="CACHE"):
        """{(shard, name)} of the gadgets copies in the cache (through the replica `cache`), in
        cluster root."""
        request = {"resource": GADGETS, "cluster": "root"}
        if shard is not None:
            request["shard"] = shard
        items = self.call(cache, "shardcache.v1.Store/List", request).get("items", [])
        return {(i["metadata"].get("shard"), i["metadata"]["name"]) for i in items}

    def logs(self):
        result = self.compose("logs", "--no-color", "--tail=60", check=False, timeout=60)
        return result.stdout + result.stderr

    def down(self):
        self.close_clients()
        if self.started:
            self.compose("down", "-v", "--remove-orphans", "--timeout", "30", timeout=300,
                         check=False)
            self.started = False


# ----------------------------------------------------------------------------------------------
# The steps.


def gadget_write(names_labels, id_base=1):
    """The Write stream's input (as docs/replication-by-example.md's heredoc) that creates the
    gadgets."""
    lines = []
    for i, (name, label) in enumerate(names_labels):
        lines.append(json.dumps({"id": id_base + i, "create": {
            "resource": GADGETS,
            "object": {"metadata": {"cluster": "root", "namespace": "default", "name": name,
                                    "labels": {"cache": label}},
                       "spec": {"size": i + 1}}}}))
    return "\n".join(lines) + "\n"


def define_and_select(d, shard_address, names_labels):
    """On one shard's store: the gadgets definition, the gadgets, and the CCR that selects those
    labelled cache=yes (docs/replication-by-example.md)."""
    d.grpcurl(shard_address, "shardcache.v1.Store/Create", {
        "resource": DEFINITIONS,
        "object": {"metadata": {"name": "gadgets.example.com"},
                   "spec": {"group": "example.com", "names": {"plural": "gadgets"},
                            "scope": "Namespaced",
                            "versions": [{"name": "v1", "served": True}],
                            "subresources": {"status": {}}}}})
    out = d.grpcurl(shard_address, "shardcache.v1.Store/Write",
                    stdin=gadget_write(names_labels)).stdout
    answers = grpcurl_lite.json_values_from_text(out)
    if len(answers) != len(names_labels) or any("code" in a for a in answers):
        raise Failure("Write answered %s" % out)
    d.grpcurl(shard_address, "shardcache.v1.Store/Create", {
        "resource": CCRS,
        "object": {"metadata": {"cluster": "root", "name": "gadgets"},
                   "spec": {"group": "example.com", "version": "v1", "resource": "gadgets",
                            "labelSelector": {"matchLabels": {"cache": "yes"}}}}})


def create_gadget(d, shard_address, name):
    d.grpcurl(shard_address, "shardcache.v1.Store/Create", {
        "resource": GADGETS,
        "object": {"metadata": {"cluster": "root", "namespace": "default", "name": name,
                                "labels": {"cache": "yes"}}, "spec": {"size": 9}}})


def wait_copied(d, shard, name, cache="CACHE"):
    """Waits for the copy of shard's gadget name in the cache (through the replica `cache`);
    returns the seconds it took."""
    start = time.monotonic()
    eventually("the copy of %s/%s in %s" % (shard, name, cache.lower().replace("_", "-")),
               lambda: (shard, name) in d.cache_gadgets(shard, cache))
    return time.monotonic() - start


def step_build(d):
    start = time.monotonic()
    d.started = True
    build = d.compose("build", timeout=BUILD_TIMEOUT)
    with open(os.path.join(ARGS.work_dir, "build.log"), "w") as f:
        f.write(build.stdout + build.stderr)
    figure("build", "docker-compose build: %.0f s" % (time.monotonic() - start))


def step_build_and_up(d):
    start = time.monotonic()
    d.started = True
    build = d.compose("build", timeout=BUILD_TIMEOUT)
    build_seconds = time.monotonic() - start
    with open(os.path.join(ARGS.work_dir, "build.log"), "w") as f:
        f.write(build.stdout + build.stderr)
    compiled = "Running in" in build.stdout and "cmake --build" in build.stdout
    image = d.docker("image", "inspect", "-f", "{{.Id}}", IMAGE).stdout.strip()
    figure("build", "docker-compose build: %.0f s (%s)" % (
        build_seconds, "compiled" if compiled else "every step cached"))

    start = time.monotonic()
    d.compose("up", "--build", "-d", timeout=UP_TIMEOUT)
    up_seconds = time.monotonic() - start
    rebuilt = d.docker("image", "inspect", "-f", "{{.Id}}", IMAGE).stdout.strip()
    if rebuilt != image:
        raise Failure("docker-compose up --build made another image than docker-compose build "
                      "(%s, then %s): the build arguments differ" % (image, rebuilt))
    healthy = d.wait_healthy({"cache": 1, "shard-a": 1, "replicator-a": 2}, start)
    figure("healthy", "docker-compose up --build -d returned in %.0f s (the same image), every "
           "service healthy %.1f s after it began" % (up_seconds, healthy))

    ps = d.compose("ps").stdout
    for line in ps.split("\n"):
        if re.search(r"_(cache|shard-a|replicator-a)_\d", line) and "(healthy)" not in line:
            raise Failure("docker-compose ps shows a service that is not healthy:\n" + ps)
    if not re.search(r"_certs_1 .*Exit 0", ps):
        raise Failure("docker-compose ps: the certs service did not exit 0:\n" + ps)

    for c in d.containers():
        name = c["Name"].lstrip("/")
        for port, bindings in (c["NetworkSettings"]["Ports"] or {}).items():
            for b in bindings or []:
                if b["HostIp"] != "127.0.0.1":
                    raise Failure("%s publishes %s on %s" % (name, port, b["HostIp"]))
        networks = set(c["NetworkSettings"]["Networks"])
        if networks != {PROJECT + "_default"}:
            raise Failure("%s is on the networks %s" % (name, sorted(networks)))
    log("published ports on 127.0.0.1 only; every container on %s_default only" % PROJECT)

    commit = source_commit()
    for service, program in (("cache", "cache_server"), ("replicator-a", "shard_replicator")):
        version = d.compose("exec", "-T", service, program, "--version").stdout.strip()
        if "(commit %s)" % commit not in version:
            raise Failure("%s --version in the image: %r, want the commit %s" % (
                program, version, commit))
        log("%s --version: %s" % (program, version))


def step_replication_walk(d):
    listing = run(["/usr/bin/python3", GRPCURL_LITE] + d.tls_flags() +
                  [d.address("CACHE"), "list"], cwd=d.dir).stdout
    if "shardcache.v1.Store" not in listing.split():
        raise Failure("grpcurl list on the cache: %r" % listing)
    define_and_select(d, "SHARD", [("gadget-1", "yes"), ("gadget-2", "yes"), ("gadget-3", "no")])

    def ccr_ready():
        ccr = json.loads(d.grpcurl("SHARD", "shardcache.v1.Store/Get", {
            "resource": CCRS, "cluster": "root", "name": "gadgets"}).stdout)
        status = ccr.get("status", {})
        conditions = {c["type"]: c["status"] for c in status.get("conditions", [])}
        return (status.get("phase") == "Ready" and conditions.get("ReplicationStarted") == "True"
                and status.get("resourceCounts") == {"cache": 2, "local": 2})
    eventually("the CCR Ready, ReplicationStarted, with 2 objects in the shard and the cache",
               ccr_ready)
    out = d.grpcurl("CACHE", "shardcache.v1.Store/List", {
        "resource": GADGETS, "shard": "a", "cluster": "root"}).stdout
    items = json.loads(out).get("items", [])
    names = sorted(i["metadata"]["name"] for i in items)
    if names != ["gadget-1", "gadget-2"] or any(i["metadata"]["shard"] != "a" for i in items):
        raise Failure("the copies in the cache: %s" % out)
    ccr_copies = json.loads(d.grpcurl("CACHE", "shardcache.v1.Store/List", {
        "resource": CCRS, "shard": "a"}).stdout).get("items", [])
    if [i["metadata"]["name"] for i in ccr_copies] != ["gadgets"]:
        raise Failure("the CCR's copy in the cache: %s" % ccr_copies)
    log("replication over TLS: the CCR is Ready, the cache holds gadget-1, gadget-2 and the CCR")

    # A watch on the cache, then a change in the shard: the watch sees its copy arrive.
    command = (["/usr/bin/python3", GRPCURL_LITE] + d.tls_flags() +
               ["-max-time", "20", "-d", json.dumps({"resource": GADGETS, "shard": "a"}),
                d.address("CACHE"), "shardcache.v1.Store/Watch"])
    watch = subprocess.Popen(command, cwd=d.dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, stdin=subprocess.DEVNULL)
    seen = []
    lock = threading.Lock()

    def read():
        for line in watch.stdout:
            with lock:
                seen.append(line)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def events():
        with lock:
            text = "".join(seen)
        values, decoder, text = [], json.JSONDecoder(), text.lstrip()
        while text:
            try:
                value, end = decoder.raw_decode(text)
            except json.JSONDecodeError:
                break  # The rest is still being written.
            values.append(value)
            text = text[end:].lstrip()
        return values

    def initial_events_end(event):
        annotations = event.get("object", {}).get("metadata", {}).get("annotations", {})
        return event.get("type") == "BOOKMARK" and \
            annotations.get("k8s.io/initial-events-end") == "true"
    try:
        eventually("the watch's initial events", lambda: any(
            initial_events_end(e) for e in events()), timeout=15, interval=0.2)
        d.grpcurl("SHARD", "shardcache.v1.Store/Update", {
            "resource": GADGETS,
            "object": {"metadata": {"cluster": "root", "namespace": "default", "name": "gadget-3",
                                    "labels": {"cache": "yes"}}, "spec": {"size": 3}}})

        def after_bookmark():
            got = events()
            end = next(i for i, e in enumerate(got) if initial_events_end(e))
            return [e for e in got[end + 1:] if e.get("type") in ("ADDED", "MODIFIED") and
                    e["object"]["metadata"]["name"] == "gadget-3"]
        eventually("the watch on the cache sees gadget-3's copy", after_bookmark, timeout=20,
                   interval=0.2)
    finally:
        watch.kill()
        watch.wait(timeout=10)
        reader.join(timeout=10)
    log("a watch on the cache saw the copy of gadget-3 arrive after its label changed in the shard")

    # The cache's Kubernetes view: kubectl over HTTPS with the admin's certificate, on kcp's paths.
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise Failure("kubectl is not on PATH (scripts/deps.sh installs kubernetes-client)")
    server = "https://%s/services/cache/shards/*/clusters/*" % d.address("CACHE_KUBE")
    out = run([kubectl, "--kubeconfig=/dev/null", "--cache-dir=" + os.path.join(d.dir, ".kube"),
               "--server=" + server, "--certificate-authority=certs/ca.crt",
               "--client-certificate=certs/admin.crt", "--client-key=certs/admin.key",
               "get", "gadgets", "-A", "-o", "json"], cwd=d.dir).stdout
    names = sorted(i["metadata"]["name"] for i in json.loads(out)["items"])
    if names != ["gadget-1", "gadget-2", "gadget-3"]:
        raise Failure("kubectl get gadgets -A through the cache's Kubernetes view: %s" % names)
    log("kubectl get gadgets -A through the cache's Kubernetes view (HTTPS): %s" % names)


def leaders(d):
    """docs/operations.md's loop: shardcache_leader_election_leading of each replicator-a replica
    ({container number: value})."""
    values = {}
    for c in d.running("replicator-a"):
        index = c["Config"]["Labels"]["com.docker.compose.container-number"]
        metrics = d.compose("exec", "-T", "--index=%s" % index, "replicator-a", "curl", "-s",
                            "127.0.0.1:8080/metrics").stdout
        found = re.findall(r"^shardcache_leader_election_leading\{[^}]*\} (\S+)$", metrics, re.M)
        if len(found) != 1:
            raise Failure("replica %s's metrics have no shardcache_leader_election_leading" %
                          index)
        values[index] = float(found[0])
    return values


def lease_holder_container(d, lease):
    """The running replicator-a container whose host name begins the lease's holderIdentity."""
    holder = lease.get("holderIdentity", "")
    for c in d.running("replicator-a"):
        if holder.startswith(c["Config"]["Hostname"] + "-"):
            return c
    return None


def step_scale(d):
    start = time.monotonic()
    d.compose("up", "-d", "--scale", "replicator-a=3", timeout=UP_TIMEOUT)
    d.wait_healthy({"cache": 1, "shard-a": 1, "replicator-a": 3}, start)

    def one_leader():
        values = leaders(d)
        return values if sorted(values.values()) == [0.0, 0.0, 1.0] else None
    values = eventually("exactly one of three replicas leads", one_leader)
    leader = lease_holder_container(d, d.lease())
    if leader is None or values[leader["Config"]["Labels"][
            "com.docker.compose.container-number"]] != 1.0:
        raise Failure("the lease's holder %s is not the replica whose metrics say it leads (%s)" %
                      (d.lease().get("holderIdentity"), values))
    logs = d.compose("logs", "--no-color", "replicator-a").stdout
    leading = [line for line in logs.split("\n") if "leading" in line]
    if not any("started leading" in line for line in leading):
        raise Failure("docker-compose logs --no-color replicator-a | grep leading: %s" % leading)
    if "\x1b[" in logs:
        raise Failure("docker-compose logs --no-color printed colour codes")
    ready = d.compose("exec", "-T", "replicator-a", "curl", "-s", "127.0.0.1:8080/readyz").stdout
    if ready.strip() != "ok":
        raise Failure("docker-compose exec replicator-a curl -s 127.0.0.1:8080/readyz: %r" % ready)
    log("--scale replicator-a=3: three healthy replicas, one leads (%s); readyz ok" %
        leader["Name"].lstrip("/"))


def takeover(d, how):
    """docker stop (how "stop") or docker kill ("kill") of the leader; returns the seconds from
    that command to the lease held by another replica with the next epoch."""
    lease = d.lease()
    leader = lease_holder_container(d, lease)
    if leader is None:
        raise Failure("no running replica holds the lease %s" % lease)
    old_holder, epoch = lease["holderIdentity"], lease.get("leaseTransitions", 0)
    start = time.monotonic()
    d.docker(how, leader["Id"], timeout=60)
    command_seconds = time.monotonic() - start

    def new_holder():
        now = d.lease()
        holder = now.get("holderIdentity", "")
        return now if holder and holder != old_holder else None
    lease = eventually("another replica leads after docker %s" % how, new_holder,
                       timeout=LEASE_DURATION + 30, interval=0.1)
    seconds = time.monotonic() - start
    if lease.get("leaseTransitions", 0) != epoch + 1:
        raise Failure("after docker %s the epoch is %s, want %d" % (
            how, lease.get("leaseTransitions"), epoch + 1))
    state = d.docker("inspect", "-f", "{{.State.Status}}", leader["Id"]).stdout.strip()
    return seconds, command_seconds, lease, state


def step_failover(d):
    seconds, command_seconds, lease, state = takeover(d, "stop")
    # SIGTERM releases the lease: a standby takes it at its next try, within the retry period
    # of the release; far sooner than the lease's expiry.
    if seconds >= LEASE_DURATION - RETRY_PERIOD:
        raise Failure("after docker stop, another replica led only %.1f s later: the lease was "
                      "not released" % seconds)
    figure("takeover after docker stop", "%.1f s (docker stop itself took %.1f s; the retry "
           "period is %.0f s), epoch %s" % (seconds, command_seconds, RETRY_PERIOD,
                                            lease.get("leaseTransitions")))
    figure("replication after docker stop", "a new object's copy was in the cache %.1f s after "
           "its Create returned" % create_and_wait(d, "SHARD", "a", "gadget-4"))

    seconds, command_seconds, lease, state = takeover(d, "kill")
    # The killed leader renewed its lease at most a retry period before it died: the lease
    # expires LEASE_DURATION after that, and a standby takes it at its next try.
    if seconds < LEASE_DURATION - RETRY_PERIOD - 1:
        raise Failure("after docker kill, another replica led %.1f s later, before the lease "
                      "(%.0f s) could expire" % (seconds, LEASE_DURATION))
    figure("takeover after docker kill", "%.1f s (lease %.0f s), epoch %s; the killed container "
           "is %s" % (seconds, LEASE_DURATION, lease.get("leaseTransitions"), state))
    figure("replication after docker kill", "a new object's copy was in the cache %.1f s after "
           "its Create returned" % create_and_wait(d, "SHARD", "a", "gadget-5"))


def create_and_wait(d, shard_address, shard, name):
    create_gadget(d, shard_address, name)
    return wait_copied(d, shard, name)


def step_shard_b(d):
    before = {d.service(c): c["Id"] for c in d.containers() if d.service(c) in (
        "cache", "shard-a")}
    replicators_before = {c["Id"] for c in d.running("replicator-a")}
    start = time.monotonic()
    d.compose("-f", "docker-compose.yml", "-f", "docker-compose.shard-b.yml", "up", "-d",
              timeout=UP_TIMEOUT)
    d.env["COMPOSE_FILE"] = SHARD_B_FILES  # docs/operations.md: or export COMPOSE_FILE=...
    d.close_clients()
    healthy = d.wait_healthy({"cache": 1, "shard-a": 1, "replicator-a": 2, "shard-b": 1,
                              "replicator-b": 2}, start)
    after = {d.service(c): c["Id"] for c in d.containers() if d.service(c) in (
        "cache", "shard-a")}
    recreated = [s for s in ("cache", "shard-a") if before.get(s) != after.get(s)]
    if replicators_before & {c["Id"] for c in d.running("replicator-a")}:
        kept = "some of replicator-a's containers kept"
    else:
        recreated.append("replicator-a")
        kept = ""
    figure("shard b added", "every service healthy %.1f s after up -d; recreated: %s%s" % (
        healthy, ", ".join(recreated) or "none", "; " + kept if kept else ""))

    define_and_select(d, "SHARD_B", [("gadget-b1", "yes"), ("gadget-b2", "no")])
    wait_copied(d, "b", "gadget-b1")
    create_and_wait(d, "SHARD", "a", "gadget-6")
    shards = {shard for shard, _ in d.cache_gadgets()}
    if shards != {"a", "b"}:
        raise Failure("the cache holds gadgets of the shards %s, want a and b" % sorted(shards))
    log("the cache holds copies from both shards: %s" % sorted(d.cache_gadgets()))


def step_restart_cache(d):
    listing = d.call("CACHE", "shardcache.v1.Store/List", {"resource": GADGETS})
    store_id, revision = listing["store_id"], int(listing["resource_version"])
    copies = d.cache_gadgets()
    start = time.monotonic()
    d.compose("restart", "cache", timeout=UP_TIMEOUT)
    healthy = d.wait_healthy({"cache": 1, "shard-a": 1, "replicator-a": 2, "shard-b": 1,
                              "replicator-b": 2}, start)
    listing = eventually("the cache answers after its restart", lambda: d.call(
        "CACHE", "shardcache.v1.Store/List", {"resource": GADGETS}))
    if listing["store_id"] != store_id or int(listing["resource_version"]) < revision:
        raise Failure("after restart cache: store %s at revision %s, before: store %s at %d" % (
            listing["store_id"], listing["resource_version"], store_id, revision))
    missing = copies - d.cache_gadgets()
    if missing:
        raise Failure("after restart cache, the copies %s are gone" % sorted(missing))
    a = create_and_wait(d, "SHARD", "a", "gadget-7")
    b = create_and_wait(d, "SHARD_B", "b", "gadget-b3")
    figure("restart cache", "healthy again %.1f s after it began; the same store (%s) at "
           "revision %s; new objects of shards a and b reached it in %.1f s and %.1f s" % (
               healthy, store_id, listing["resource_version"], a, b))


def step_down(d):
    d.close_clients()
    start = time.monotonic()
    d.compose("down", "-v", timeout=300)
    d.started = False
    label = "label=com.docker.compose.project=%s" % PROJECT
    left = d.docker("ps", "-aq", "--filter", label).stdout.split()
    left += d.docker("volume", "ls", "-q", "--filter", label).stdout.split()
    left += [v for v in d.docker("volume", "ls", "-q").stdout.split()
             if v.startswith(PROJECT + "_")]
    left += [n for n in d.docker("network", "ls", "--format", "{{.Name}}").stdout.split()
             if n.startswith(PROJECT + "_")]
    busy = [p for p in d.ports.values() if not port_free(p)]
    if left or busy:
        raise Failure("after down -v: left %s, ports still in use %s" % (left, busy))
    log("down -v in %.0f s: no container, volume or network left, the ports are free" % (
        time.monotonic() - start))


# ----------------------------------------------------------------------------------------------
# High availability: docker-compose.ha.yml, after the default deployment is down.

HA_SERVICES = {"etcd-1": 1, "etcd-2": 1, "etcd-3": 1, "cache": 1, "cache-2": 1, "shard-a": 1,
               "replicator-a": 2}


def etcdctl(d, member, *args, timeout=COMMAND_TIMEOUT):
    """docs/operations.md's `docker-compose exec etcd-N etcdctl ...`: its output."""
    return d.compose("exec", "-T", member, "etcdctl", *args, timeout=timeout).stdout


def etcd_members(d, member):
    """`etcdctl member list` through member: {name: (id, status)} (an unstarted member has no
    name yet: its peer URL's host stands in)."""
    members = {}
    for line in etcdctl(d, member, "member", "list").strip().split("\n"):
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 4:
            raise Failure("etcdctl member list printed %r" % line)
        name = fields[2] or re.sub(r"^https://([^:]+):.*$", r"\1", fields[3])
        members[name] = (fields[0], fields[1])
    return members


def etcd_leader(d, member):
    """The name of etcd's leader, from `etcdctl endpoint status --cluster` through member."""
    # With a member down it exits 1, after the status of the others.
    out = d.compose("exec", "-T", member, "etcdctl", "--dial-timeout=1s", "--command-timeout=2s",
                    "endpoint", "status", "--cluster", "-w", "json", check=False).stdout
    try:
        statuses = json.loads(out)
    except ValueError:
        raise Failure("etcdctl endpoint status --cluster printed %r" % out)
    for status in statuses:
        # "leader" is left out (0) while there is none.
        if status["Status"]["header"]["member_id"] == status["Status"].get("leader"):
            return re.sub(r"^https://([^:]+):.*$", r"\1", status["Endpoint"])
    raise Failure("etcdctl endpoint status --cluster names no leader: %s" % statuses)


def http_get(d, name, path):
    """GET http://127.0.0.1:<port name>/path: (status, body)."""
    try:
        with urllib.request.urlopen("http://%s%s" % (d.address(name), path),
                                    timeout=CALL_TIMEOUT) as response:
            return response.status, response.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except OSError as e:
        raise Failure("GET %s on %s: %s" % (path, name, e))


def ready(d, name):
    status, body = http_get(d, name, "/readyz")
    if status != 200 or body.strip() != "ok":
        raise Failure("/readyz on %s: %d %s" % (name, status, body.strip()))
    return True


def container_id(d, service):
    running = d.running(service)
    if len(running) != 1:
        raise Failure("%d containers of %s run, want 1" % (len(running), service))
    return running[0]["Id"]


def gadget_versions(d, cache):
    """{name: resource_version} of shard a's gadget copies, through the replica `cache`."""
    items = d.call(cache, "shardcache.v1.Store/List", {
        "resource": GADGETS, "shard": "a", "cluster": "root"}).get("items", [])
    return {i["metadata"]["name"]: i["metadata"]["resource_version"] for i in items}


def step_ha_up(d):
    d.ha_began = time.monotonic()
    d.env["COMPOSE_FILE"] = HA_FILES  # docs/operations.md: or -f ... -f ... on every command
    d.close_clients()
    start = time.monotonic()
    d.started = True
    d.compose("up", "--build", "-d", timeout=BUILD_TIMEOUT)
    up_seconds = time.monotonic() - start
    healthy = d.wait_healthy(HA_SERVICES, start)
    ps = d.compose("ps").stdout
    if not re.search(r"_certs_1 .*Exit 0", ps):
        raise Failure("docker-compose ps: the certs service did not exit 0:\n" + ps)
    for c in d.containers():
        name = c["Name"].lstrip("/")
        bindings = [b for b in (c["NetworkSettings"]["Ports"] or {}).values() if b]
        if d.service(c) in ETCD_MEMBERS and bindings:
            raise Failure("%s publishes ports: %s" % (name, bindings))
        if any(b["HostIp"] != "127.0.0.1" for bs in bindings for b in bs):
            raise Failure("%s publishes %s" % (name, bindings))
    members = etcd_members(d, "etcd-1")
    if sorted(members) != list(ETCD_MEMBERS) or any(s != "started" for _, s in members.values()):
        raise Failure("etcdctl member list: %s" % members)
    # etcdctl prints the health of each endpoint on stderr.
    health = d.compose("exec", "-T", "etcd-1", "etcdctl", "endpoint", "health",
                       "--cluster").stderr
    if health.count("is healthy") != 3:
        raise Failure("etcdctl endpoint health --cluster: %s" % health)
    for name in ("CACHE_HTTP", "CACHE_2_HTTP"):
        eventually("/readyz of %s" % name, lambda: ready(d, name))
    figure("ha: healthy", "up --build -d with docker-compose.ha.yml returned in %.0f s, every "
           "service healthy %.1f s after it began; etcd members %s started, over TLS" % (
               up_seconds, healthy, ", ".join(sorted(members))))


def step_ha_walk(d):
    define_and_select(d, "SHARD", [("gadget-1", "yes"), ("gadget-2", "no")])
    wait_copied(d, "a", "gadget-1")
    ccrs = {}
    for cache in ("CACHE", "CACHE_2"):
        ccrs[cache] = [(i["metadata"]["name"], i["metadata"]["resource_version"]) for i in d.call(
            cache, "shardcache.v1.Store/List", {"resource": CCRS, "shard": "a"}).get("items", [])]
    versions = {cache: gadget_versions(d, cache) for cache in ("CACHE", "CACHE_2")}
    if list(versions["CACHE"]) != ["gadget-1"] or versions["CACHE"] != versions["CACHE_2"] or \
            len(ccrs["CACHE"]) != 1 or ccrs["CACHE"] != ccrs["CACHE_2"]:
        raise Failure("the copies through cache and cache-2 differ: %s, CCRs %s" % (
            versions, ccrs))
    log("ha: gadget-1's copy and the CCR's, through cache and cache-2 alike: %s, %s" % (
        versions["CACHE"], ccrs["CACHE"]))


def step_ha_etcd_member_down(d):
    leader = etcd_leader(d, "etcd-1")
    d.docker("kill", container_id(d, leader), timeout=60)
    d.etcd_killed = leader
    alive = [m for m in ETCD_MEMBERS if m != leader]
    start = time.monotonic()
    eventually("another etcd leader after %s was killed" % leader,
               lambda: etcd_leader(d, alive[0]) in alive)
    elected = time.monotonic() - start
    create_gadget(d, "SHARD", "gadget-3")
    copied = wait_copied(d, "a", "gadget-3")
    wait_copied(d, "a", "gadget-3", cache="CACHE_2")
    for name in ("CACHE_HTTP", "CACHE_2_HTTP"):
        eventually("/readyz of %s with two members" % name, lambda: ready(d, name))
    figure("ha: etcd leader killed", "docker kill %s (etcd's leader): another led %.1f s later "
           "(polled through docker-compose exec); "
           "a new object's copy was in the cache %.1f s after its Create returned, and "
           "both replicas are ready" % (leader, elected, copied))


def step_ha_replace_member(d):
    """docs/operations.md's "Replacing an etcd member", with the member killed above."""
    member = d.etcd_killed
    alive = [m for m in ETCD_MEMBERS if m != member][0]
    start = time.monotonic()
    member_id = etcd_members(d, alive)[member][0]
    etcdctl(d, alive, "member", "remove", member_id)
    d.compose("rm", "-fsv", member)
    d.docker("volume", "rm", "%s_%s-data" % (PROJECT, member))
    added = etcdctl(d, alive, "member", "add", member, "--peer-urls=https://%s:2380" % member)
    if "ETCD_INITIAL_CLUSTER_STATE=\"existing\"" not in added:
        raise Failure("etcdctl member add printed %s" % added)
    env = dict(d.env)
    d.env["SHARDCACHE_ETCD_INITIAL_CLUSTER_STATE"] = "existing"
    try:
        d.compose("up", "-d", "--no-deps", member, timeout=UP_TIMEOUT)
    finally:
        d.env = env
    d.wait_healthy(HA_SERVICES, start)
    members = eventually("three started etcd members", lambda: (lambda m: m if sorted(m) == list(
        ETCD_MEMBERS) and all(s == "started" for _, s in m.values()) else None)(
            etcd_members(d, alive)))
    replaced = time.monotonic() - start
    if members[member][0] == member_id:
        raise Failure("%s kept its member id %s" % (member, member_id))
    # A later up -d without the variable makes the member again with `new`, which its data
    # overrides: it restarts and stays in the cluster.
    start = time.monotonic()
    d.compose("up", "-d", timeout=UP_TIMEOUT)
    d.wait_healthy(HA_SERVICES, start)
    members = etcd_members(d, member)
    if sorted(members) != list(ETCD_MEMBERS) or any(s != "started" for _, s in members.values()):
        raise Failure("after up -d: etcdctl member list through %s: %s" % (member, members))
    figure("ha: etcd member replaced", "%s removed, added afresh (member %s, was %s) and healthy "
           "with three started members %.1f s after member remove; a plain up -d then restarts "
           "it with its data in %.1f s" % (member, members[member][0], member_id, replaced,
                                            time.monotonic() - start))


def step_ha_cache_down(d):
    holder = d.lease().get("holderIdentity")
    d.docker("kill", container_id(d, "cache"), timeout=60)
    create_gadget(d, "SHARD", "gadget-4")
    moved = wait_copied(d, "a", "gadget-4", cache="CACHE_2")
    same_leader = d.lease().get("holderIdentity") == holder
    start = time.monotonic()
    d.compose("up", "-d", "--no-deps", "cache", timeout=UP_TIMEOUT)
    d.wait_healthy(HA_SERVICES, start)
    d.close_clients()
    versions = eventually("the same copies through cache and cache-2", lambda: (
        lambda a, b: a if a == b and "gadget-4" in a else None)(
            gadget_versions(d, "CACHE"), gadget_versions(d, "CACHE_2")))
    figure("ha: cache replica killed", "docker kill of cache: a new object's copy was in cache-2 "
           "%.1f s after its Create returned (%s); cache back with the same copies, %s" % (
               moved, "the same replicator leading" if same_leader else "after a change of "
               "leader", ", ".join("%s@%s" % kv for kv in sorted(versions.items()))))


def step_ha_down(d):
    step_down(d)
    figure("ha: phase", "%.0f s from up to down -v" % (time.monotonic() - d.ha_began))


# ----------------------------------------------------------------------------------------------


def main():
    global ARGS  # pylint: disable=global-statement
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work-dir", help="scratch folder (default: a temporary one, removed)")
    parser.add_argument("--keep-work-dir", action="store_true")
    parser.add_argument("--ha-only", action="store_true",
                        help="build, then only the high-availability phase")
    ARGS = parser.parse_args()
    temporary = ARGS.work_dir is None
    if temporary:
        ARGS.work_dir = tempfile.mkdtemp(prefix="shardcache-compose-test.")
    else:
        os.makedirs(ARGS.work_dir, exist_ok=True)
    ARGS.work_dir = os.path.abspath(ARGS.work_dir)

    # SIGTERM (a timeout of the caller) ends the test through its cleanup, as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *unused: sys.exit(143))
    began = time.monotonic()
    daemon = Daemon(ARGS.work_dir)
    deployment = None
    status = 1
    outcome = "failed"
    try:
        for tool in ("docker-compose",):
            if shutil.which(tool) is None:
                raise Skip("%s is not installed (scripts/deps.sh installs it)" % tool)
        daemon.start()
        ensure_base_image(daemon)
        source = os.path.join(ARGS.work_dir, "shardcache")
        copy_source(source)
        deployment = Deployment(daemon, source)
        log("project %s in %s, ports %s" % (PROJECT, source, deployment.ports))
        steps = [step_build_and_up, step_replication_walk, step_scale, step_failover,
                 step_shard_b, step_restart_cache, step_down]
        if ARGS.ha_only:
            steps = [step_build]
        steps += [step_ha_up, step_ha_walk, step_ha_etcd_member_down, step_ha_replace_member,
                  step_ha_cache_down, step_ha_down]
        for step in steps:
            step(deployment)
        status, outcome = 0, "passed"
    except Skip as e:
        if os.environ.get("SHARDCACHE_COMPOSE_TEST_REQUIRED") == "1":
            log("FAILED: no Docker daemon, and SHARDCACHE_COMPOSE_TEST_REQUIRED=1: %s" % e)
        else:
            log("SKIPPED: %s" % e)
            status, outcome = 0, "skipped"
    except Exception as e:  # pylint: disable=broad-except
        if isinstance(e, (Failure, grpcurl_lite.Error, grpcurl_lite.grpc.RpcError)):
            log("FAILED: %s" % e)
        else:
            log("FAILED:\n%s" % traceback.format_exc())
        if deployment is not None and deployment.started:
            ps = deployment.compose("ps", check=False, timeout=60)
            log("docker-compose ps:\n%s\nlogs:\n%s" % (ps.stdout, deployment.logs()))
    finally:
        if deployment is not None:
            deployment.down()
        daemon.stop()
        if temporary and not ARGS.keep_work_dir:
            shutil.rmtree(ARGS.work_dir, ignore_errors=True)
    for name, text in FIGURES:
        log("figure: %s: %s" % (name, text))
    log("%s in %.0f s" % (outcome, time.monotonic() - began))
    return status


if __name__ == "__main__":
    sys.exit(main())
