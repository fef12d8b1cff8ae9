"""Linux network namespaces for netsplit tests: N brokers, each in its own namespace.

    with NetnsLab(3) as lab:                       # needs root and ``ip netns``
        cluster = start_cluster(3, placement=lab.placement)
        lab.partition([[0, 1], [2]])               # 2 | 1: brokers 0, 1 no longer reach 2
        lab.heal()                                 # one network again

Layout (every name ends with this process's pid, so parallel runs do not collide):

* ``skipmq-<pid>-<i>``: the namespace of broker i. Interface ``x0`` is on the **cluster net**
  ``10.211.0.0/24`` (broker i = ``10.211.0.<i+1>``); its cluster gRPC port binds there and that
  address is its peer id. Interface ``c0`` is on the **client net** (``10.212.<k>.<i+1>``) where
  its MQTT and HTTP listeners bind.
* ``skipmq-<pid>-br``: the switch. Bridge ``bx`` joins the brokers' ``x0`` (through veth peers
  ``x<i>``); bridge ``bc`` joins their ``c0`` (through ``c<i>``) and the root namespace.
* The root namespace (where the test and its MQTT clients run) gets one veth ``sq<pid>h`` with
  ``10.212.<k>.254/24`` on the client bridge, so clients and the launcher's HTTP checks reach
  every broker, on either side of a partition: partitions cut the cluster net only. ``k`` is
  picked so that the /24 overlaps no address or route of the root namespace. The cluster net
  exists only inside the namespaces.

``partition(groups)`` cuts the cluster net into groups: the brokers of each group stay linked
to each other and lose every other broker. Each group gets a bridge of its own (its members'
``x<i>`` ports are moved onto it); a broker listed in no group has its link set down (alone).
``heal()`` sets every link up and moves every port back onto ``bx``. Nothing in the namespaces
is a router, so no packet crosses between groups. Established TCP connections are not reset:
their packets vanish, as in a real netsplit, until the peers' timeouts notice.

Every namespace and the root-side veth are removed on exit, also when set-up or the test fails;
namespaces left behind by an earlier run whose process is gone are removed on set-up too.
Processes started in the namespaces must be stopped before the lab exits.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from types import TracebackType

from tools.launcher import BrokerPlacement

NS_PREFIX = "skipmq-"
CLUSTER_NET = "10.211.0"  # /24, inside the namespaces only
CLIENT_NET_FIRST = "10.212"  # 10.212.<k>.0/24, also on the root namespace's veth
HOST_OCTET = 254
PROBE_PORT = 9  # discard: nothing listens there, a reachable host refuses
CMD_TIMEOUT_S = 10.0


class NetnsUnavailable(RuntimeError):
    """Network namespaces cannot be used here (not root, no ``ip``, or ``ip netns add`` fails)."""


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(args), capture_output=True, text=True, timeout=CMD_TIMEOUT_S, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def unavailable_reason() -> str | None:
    """Why NetnsLab cannot run here, or None when it can (root, ``ip`` found, a probe namespace
    can be created and removed)."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    probe = f"{NS_PREFIX}{os.getpid()}-probe"
    result = _run("ip", "netns", "add", probe, check=False)
    if result.returncode != 0:
        return f"ip netns add does not work here: {result.stderr.strip()}"
    _run("ip", "netns", "del", probe, check=False)
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_namespaces() -> list[str]:
    """Remove ``skipmq-<pid>-*`` namespaces whose pid is no longer running; returns their names."""
    listing = _run("ip", "netns", "list", check=False).stdout
    removed = []
    for line in listing.splitlines():
        name = line.split()[0] if line.split() else ""
        if not name.startswith(NS_PREFIX):
            continue
        pid_text = name[len(NS_PREFIX) :].split("-", 1)[0]
        if pid_text.isdigit() and int(pid_text) != os.getpid() and not _pid_alive(int(pid_text)):
            _run("ip", "netns", "del", name, check=False)
            removed.append(name)
    return removed


def _root_networks() -> list[ipaddress.IPv4Network]:
    """The IPv4 networks of the root namespace's addresses and routes (default route left out)."""
    nets: list[ipaddress.IPv4Network] = []
    for line in _run("ip", "-4", "-o", "addr", "show", check=False).stdout.splitlines():
        parts = line.split()
        if "inet" in parts:
            nets.append(ipaddress.IPv4Interface(parts[parts.index("inet") + 1]).network)
    for line in _run("ip", "-4", "route", "show", "table", "all", check=False).stdout.splitlines():
        first = line.split()[0] if line.split() else ""
        if first in ("local", "broadcast", "unreachable", "blackhole", "prohibit", "multicast"):
            first = line.split()[1]
        if first == "default":
            continue
        with contextlib.suppress(ValueError):
            nets.append(ipaddress.IPv4Network(first, strict=False))
    return nets


def _free_client_net() -> str:
    """A 10.212.<k> /24 prefix that overlaps nothing in the root namespace (k from the pid on)."""
    used = _root_networks()
    start = os.getpid() % 250
    for step in range(250):
        prefix = f"{CLIENT_NET_FIRST}.{(start + step) % 250}"
        net = ipaddress.IPv4Network(f"{prefix}.0/24")
        if not any(net.overlaps(other) for other in used):
            return prefix
    raise NetnsUnavailable(f"no free /24 under {CLIENT_NET_FIRST}.0.0/16 in the root namespace")


class NetnsLab:
    """N network namespaces on a switch, with partition/heal of their cluster net (module doc)."""

    def __init__(self, n: int) -> None:
        if n < 1:
            raise ValueError(f"a lab needs at least 1 namespace, not {n}")
        self.n = n
        pid = os.getpid()
        self.namespaces = [f"{NS_PREFIX}{pid}-{i}" for i in range(n)]
        self.switch = f"{NS_PREFIX}{pid}-br"
        self.host_link = f"sq{pid}h"
        self.client_net = ""
        self.groups: list[list[int]] | None = None
        self._created: list[str] = []

    # ------------------------------------------------------------------ addresses
    def cluster_addr(self, i: int) -> str:
        return f"{CLUSTER_NET}.{i + 1}"

    def client_addr(self, i: int) -> str:
        return f"{self.client_net}.{i + 1}"

    @property
    def host_addr(self) -> str:
        return f"{self.client_net}.{HOST_OCTET}"

    def exec_prefix(self, i: int) -> tuple[str, ...]:
        """Prefix that runs a command in namespace i (``ip netns exec`` execs it: same pid)."""
        return ("ip", "netns", "exec", self.namespaces[i])

    def placement(self, i: int) -> BrokerPlacement:
        """tools.launcher placement of broker i: in namespace i, clients on its client address."""
        return BrokerPlacement(
            self.exec_prefix(i), host=self.client_addr(i), cluster_host=self.cluster_addr(i)
        )

    # ------------------------------------------------------------------ set-up / tear-down
    def __enter__(self) -> NetnsLab:
        reason = unavailable_reason()
        if reason is not None:
            raise NetnsUnavailable(reason)
        try:
            self._setup()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _ns(self, name: str) -> None:
        _run("ip", "netns", "add", name)
        self._created.append(name)
        _run("ip", "-n", name, "link", "set", "lo", "up")

    def _setup(self) -> None:
        remove_stale_namespaces()
        self.client_net = _free_client_net()
        sw = self.switch
        self._ns(sw)
        for bridge in ("bx", "bc"):
            _run("ip", "-n", sw, "link", "add", bridge, "type", "bridge")
            _run("ip", "-n", sw, "link", "set", bridge, "up")
        for i, ns in enumerate(self.namespaces):
            self._ns(ns)
            for net, port, bridge, addr in (
                ("x", f"x{i}", "bx", self.cluster_addr(i)),
                ("c", f"c{i}", "bc", self.client_addr(i)),
            ):
                inner = f"{net}0"
                _run("ip", "-n", sw, "link", "add", port, "type", "veth", "peer", "name", inner, "netns", ns)
                _run("ip", "-n", sw, "link", "set", port, "master", bridge)
                _run("ip", "-n", sw, "link", "set", port, "up")
                _run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", inner)
                _run("ip", "-n", ns, "link", "set", inner, "up")
        # the root namespace's door onto the client bridge
        _run("ip", "link", "add", self.host_link, "type", "veth", "peer", "name", "h0", "netns", sw)
        self._created.append(self.host_link)
        _run("ip", "-n", sw, "link", "set", "h0", "master", "bc")
        _run("ip", "-n", sw, "link", "set", "h0", "up")
        _run("ip", "addr", "add", f"{self.host_addr}/24", "dev", self.host_link)
        _run("ip", "link", "set", self.host_link, "up")
        for i in range(1, self.n):  # the cluster net answers before anything starts
            if not self.reachable(i, 0, timeout_s=3.0):
                raise RuntimeError(f"{self.namespaces[i]} does not reach {self.cluster_addr(0)}")

    def close(self) -> None:
        """Remove every namespace and the root-side veth (idempotent, never raises)."""
        with contextlib.suppress(Exception):
            _run("ip", "link", "del", self.host_link, check=False)
        for name in [*self.namespaces, self.switch]:
            with contextlib.suppress(Exception):
                _run("ip", "netns", "del", name, check=False)
        self._created.clear()

    # ------------------------------------------------------------------ faults
    def partition(self, groups: Sequence[Sequence[int]]) -> None:
        """Cut the cluster net into ``groups`` of broker indexes (see the module doc)."""
        seen: set[int] = set()
        for group in groups:
            for i in group:
                if not 0 <= i < self.n or i in seen:
                    raise ValueError(f"bad partition {groups!r}: index {i} out of range or repeated")
                seen.add(i)
        self.heal()
        sw = self.switch
        for number, group in enumerate(groups):
            bridge = f"bx{number}"
            _run("ip", "-n", sw, "link", "add", bridge, "type", "bridge")
            _run("ip", "-n", sw, "link", "set", bridge, "up")
            for i in group:
                _run("ip", "-n", sw, "link", "set", f"x{i}", "master", bridge)
        for i in range(self.n):
            if i not in seen:
                _run("ip", "-n", sw, "link", "set", f"x{i}", "down")
        self.groups = [list(group) for group in groups]

    def heal(self) -> None:
        """One cluster net again: every broker's link up and on the shared bridge."""
        sw = self.switch
        for i in range(self.n):
            _run("ip", "-n", sw, "link", "set", f"x{i}", "master", "bx")
            _run("ip", "-n", sw, "link", "set", f"x{i}", "up")
        for line in _run("ip", "-n", sw, "-o", "link", "show", "type", "bridge").stdout.splitlines():
            name = line.split(":")[1].strip().split("@")[0]
            if name.startswith("bx") and name != "bx":
                _run("ip", "-n", sw, "link", "del", name)
        self.groups = None

    def reachable(self, i: int, j: int, timeout_s: float = 1.0) -> bool:
        """Whether broker i's namespace reaches broker j's cluster address: a TCP connection to
        a closed port there is refused (reachable) rather than timing out (cut off)."""
        probe = (
            "import socket,sys\n"
            "try:\n"
            f" socket.create_connection(({self.cluster_addr(j)!r}, {PROBE_PORT}), timeout={timeout_s})\n"
            "except ConnectionRefusedError:\n sys.exit(0)\n"
            "except OSError:\n sys.exit(1)\n"
        )
        result = _run(*self.exec_prefix(i), sys.executable, "-c", probe, check=False)
        return result.returncode == 0
