"""Issue 11, network: a group's namespace reaches hosts outside through pasta (behind the
launcher's egress router where it can be made), never the host's loopback nor another group;
``egress: false`` and ``hostNetwork`` (pool settings); no pasta nor veth outlives its group,
one pasta per launcher.

There is no internet here: "outside" is an HTTP server on this machine's non-loopback
address (the interface of the default route), which a task reaches only through egress.
"""

from __future__ import annotations

import contextlib
import http.server
import ipaddress
import os
import re
import secrets
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from local_support import final, group_launches, isolation_available, task_log, wait_final

from trainyard.backends.base import FactKind
from trainyard.backends.local import LocalBackend, loopback_address
from trainyard.backends.local import launcher as launcher_mod
from trainyard.backends.local import router as router_mod
from trainyard.backends.local.messages import NetworkSpec, Ping
from trainyard.backends.local.netns import EGRESS_ADDRESS, probe_egress
from trainyard.backends.local.router import GROUP_IFNAME_PREFIX, GROUP_NETWORK, probe_router
from trainyard.errors import BackendError
from trainyard.pools import default_local_pool

pytestmark = pytest.mark.skipif(
    probe_egress() is not None, reason=f"no egress here: {probe_egress()}"
)

FETCH = """import sys, urllib.request
for url in sys.argv[1:]:
    try:
        body = urllib.request.urlopen(url, timeout=4).read().decode()
        print("GOT", url, body)
    except Exception as exc:
        print("FAILED", url, type(exc).__name__)
"""


def outside_address() -> str:
    """This machine's address on the interface of its default route (not loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: only the route is chosen
            address = probe.getsockname()[0]
        except OSError:
            address = "127.0.0.1"
    if address.startswith("127."):
        pytest.skip("this machine has no non-loopback IPv4 address to serve 'outside' on")
    return address


class _Secret(http.server.BaseHTTPRequestHandler):
    secret = ""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = self.secret.encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def serve(address: str) -> tuple[http.server.ThreadingHTTPServer, str]:
    """An HTTP server on ``address`` that answers a random secret; returns it and its URL."""
    handler = type("Handler", (_Secret,), {"secret": secrets.token_hex(8)})
    server = http.server.ThreadingHTTPServer((address, 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://{address}:{server.server_address[1]}/"


@pytest.fixture
def outside() -> Iterator[tuple[str, str]]:
    """(url, secret) of a server on the non-loopback address."""
    server, url = serve(outside_address())
    yield url, server.RequestHandlerClass.secret  # type: ignore[attr-defined]
    server.shutdown()
    server.server_close()


def _backend(home: Path, **pool_fields: object) -> LocalBackend:
    why_not = isolation_available("bwrap", "netns")
    if why_not:
        pytest.skip(f"sandboxed isolation not available here: {why_not}")
    pool = default_local_pool().model_copy(update=pool_fields)
    return LocalBackend(pool, home=home, sandbox="bwrap", network="netns", stop_grace_s=2.0)


def fetch_task(urls: list[str], **fields: object) -> dict[str, object]:
    return {
        "command": ["python3", "/tmp/fetch.py", *urls],
        "files": [{"path": "/tmp/fetch.py", "contents": FETCH}],
        **fields,
    }


def run_one(backend: LocalBackend, home: Path, wid: str, task: dict[str, object]) -> str:
    launches = group_launches(backend, home, wid, {"t": task})
    backend.start_group(launches)
    fact = final(wait_final(backend, [launches[0].key], timeout_s=90)[launches[0].key])
    assert fact.kind is FactKind.EXITED and fact.exit_code == 0, task_log(launches[0])
    return task_log(launches[0])


@pytest.mark.parametrize("runner", ["hosted", "process"])
def test_a_task_reaches_a_host_outside_through_egress(
    home: Path, outside: tuple[str, str], runner: str
) -> None:
    """Both ways a runner joins the group's namespace: a thread of the launcher (setns) and
    a runner process (nsenter); a task with an output folder is never hosted."""
    url, secret = outside
    backend = _backend(home)
    extra = {"outputs": [{"url": (home / "out").as_uri() + "/"}]} if runner == "process" else {}
    text = run_one(backend, home, f"wf-egress-{runner}", fetch_task([url], **extra))
    assert f"GOT {url} {secret}" in text
    assert "egress through pasta" in text
    assert "address" in text


def test_egress_false_leaves_loopback_only(home: Path, outside: tuple[str, str]) -> None:
    url, secret = outside
    backend = _backend(home, egress=False)
    text = run_one(backend, home, "wf-no-egress", fetch_task([url]))
    assert f"FAILED {url}" in text and secret not in text
    assert "no egress (pool egress: false)" in text


def test_the_hosts_loopback_is_out_of_reach_through_egress(home: Path) -> None:
    """A service on the host's 127.0.0.1 (the trainyard server, say) that is not forwarded
    on purpose: not at 127.0.0.1 (the namespace's own loopback), not at the host's outside
    address, not at the namespace's gateway (pasta runs with --no-map-gw)."""
    server, url = serve("127.0.0.1")
    port = server.server_address[1]
    secret = server.RequestHandlerClass.secret  # type: ignore[attr-defined]
    try:
        urls = [url, f"http://{outside_address()}:{port}/", f"http://10.0.2.2:{port}/"]
        text = run_one(_backend(home), home, "wf-loopback", fetch_task(urls))
    finally:
        server.shutdown()
        server.server_close()
    assert secret not in text
    assert f"FAILED {url}" in text


def test_the_server_url_still_reaches_the_server_with_egress(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``TRAINYARD_SERVER_URL`` (a port on the host's loopback) is forwarded on purpose."""
    server, url = serve("127.0.0.1")
    secret = server.RequestHandlerClass.secret  # type: ignore[attr-defined]
    monkeypatch.setenv("TRAINYARD_SERVER_URL", url.rstrip("/"))
    try:
        text = run_one(
            _backend(home),
            home,
            "wf-server",
            {
                "command": ["sh", "-c", 'python3 /tmp/fetch.py "$TRAINYARD_SERVER_URL/"'],
                "files": [{"path": "/tmp/fetch.py", "contents": FETCH}],
            },
        )
    finally:
        server.shutdown()
        server.server_close()
    assert f"GOT {url} {secret}" in text


LISTEN = """import socket, sys, time
srv = socket.create_server(("0.0.0.0", int(sys.argv[1])))
srv.settimeout(float(sys.argv[2]))
try:
    conn, _ = srv.accept()
    conn.sendall(b"workflow-a-secret")
    print("ACCEPTED")
except socket.timeout:
    print("NOBODY CAME")
"""
CONNECT = """import socket, sys
for host in sys.argv[2:]:
    try:
        with socket.create_connection((host, int(sys.argv[1])), timeout=3) as c:
            print("CONNECTED", host, c.recv(100))
    except OSError as exc:
        print("REFUSED", host, type(exc).__name__)
"""


def test_one_workflow_cannot_reach_another(home: Path) -> None:
    """Workflow A listens on 0.0.0.0; workflow B tries A's group address, the host's outside
    address and the egress address: none reaches A."""
    backend = _backend(home)
    port = 20000 + os.getpid() % 20000
    a = group_launches(
        backend,
        home,
        "wf-a",
        {
            "listener": {
                "command": ["python3", "/tmp/listen.py", str(port), "25"],
                "files": [{"path": "/tmp/listen.py", "contents": LISTEN}],
            }
        },
    )
    backend.start_group(a)
    time.sleep(2.0)  # A listens (B only has to fail, so a late A only makes the test weaker)
    a_host = loopback_address("wf-a", "listener")
    targets = [a_host, outside_address(), EGRESS_ADDRESS, "127.0.0.1"]
    b = group_launches(
        backend,
        home,
        "wf-b",
        {
            "prober": {
                "command": ["python3", "/tmp/connect.py", str(port), *targets],
                "files": [{"path": "/tmp/connect.py", "contents": CONNECT}],
            }
        },
    )
    backend.start_group(b)
    facts = wait_final(backend, [b[0].key], timeout_s=90)
    assert final(facts[b[0].key]).exit_code == 0
    text = task_log(b[0])
    assert "workflow-a-secret" not in text
    # In B's own namespace nothing listens on these; the host's outside address may have an
    # unrelated listener on that port (another program of this machine), never A.
    assert all(f"REFUSED {t}" in text for t in (a_host, EGRESS_ADDRESS, "127.0.0.1")), text
    backend.stop([a[0].key])
    wait_final(backend, [a[0].key], timeout_s=60)
    assert "ACCEPTED" not in task_log(a[0])


def _pastas_of(launcher_pid: int) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["name", "ppid"]):
        if proc.info["name"].startswith(("pasta", "passt")) and proc.info["ppid"] == launcher_pid:
            found.append(proc)
    return found


def _launcher_pid(backend: LocalBackend) -> int:
    return int(backend._launcher.request(Ping())["pid"])


def _net_namespaces_of(pid: int) -> set[str]:
    """The network namespaces process ``pid`` holds as descriptors (``/proc/PID/fd/N``)."""
    found = {}
    for name in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{name}")
            if target.startswith("net:["):
                found[target] = f"/proc/{pid}/fd/{name}"
    return set(found.values())


def _router_veths(launcher: int) -> list[str]:
    """The group veths (``tyg*``) in every namespace the launcher holds (the router's and
    the groups' still alive)."""
    names = []
    for path in _net_namespaces_of(launcher):
        done = subprocess.run(
            ["nsenter", f"--net={path}", "ip", "-o", "link", "show"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        names += [line.split(":")[1].strip().split("@")[0] for line in done.stdout.splitlines()]
    return [name for name in names if name.startswith(GROUP_IFNAME_PREFIX)]


def test_no_pasta_nor_veth_outlives_its_group(home: Path) -> None:
    """With the egress router: the group's veth goes with it, the one pasta stays with the
    launcher; without one (not root, no nft): the group's own pasta goes with it."""
    backend = _backend(home)
    launches = group_launches(backend, home, "wf-leak", {"t": {"command": ["sleep", "1"]}})
    backend.start_group(launches)
    launcher = _launcher_pid(backend)
    assert len(_pastas_of(launcher)) == 1
    routed = probe_router() is None
    if routed:
        assert len(_router_veths(launcher)) == 1
    wait_final(backend, [launches[0].key], timeout_s=60)
    deadline = time.monotonic() + 30  # the launcher keeps a group 5 s after its last runner
    while time.monotonic() < deadline and (
        _router_veths(launcher) if routed else _pastas_of(launcher)
    ):
        time.sleep(0.2)
    if routed:
        assert _router_veths(launcher) == []
        assert len(_pastas_of(launcher)) == 1  # the router's, for the launcher's life
    else:
        assert _pastas_of(launcher) == []


def test_one_pasta_per_launcher_not_per_group(home: Path) -> None:
    """Three groups at once (two workflows): one pasta, the router's (was one per group)."""
    if probe_router() is not None:
        pytest.skip(f"no egress router here ({probe_router()}): a pasta per group is the fallback")
    backend = _backend(home)
    keys = []
    for wid, group in (("wf-p1", "g1"), ("wf-p1", "g2"), ("wf-p2", "g1")):
        launches = group_launches(
            backend, home, wid, {f"t-{group}": {"command": ["sleep", "4"]}}, group=group
        )
        backend.start_group(launches)
        keys.append(launches[0].key)
    launcher = _launcher_pid(backend)
    assert len(_router_veths(launcher)) == 3
    assert len(_pastas_of(launcher)) == 1
    facts = wait_final(backend, keys, timeout_s=90)
    assert all(final(facts[k]).exit_code == 0 for k in keys)


ADDRESS_THEN_LISTEN = """import socket, sys, time
probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
probe.connect(("192.0.2.1", 9))
print("ADDRESS", probe.getsockname()[0], flush=True)
srv = socket.create_server(("0.0.0.0", int(sys.argv[1])))
srv.settimeout(float(sys.argv[2]))
try:
    conn, _ = srv.accept()
    conn.sendall(b"group-a-secret")
    print("ACCEPTED")
except socket.timeout:
    print("NOBODY CAME")
"""
PROBE_PEERS = """import ipaddress, socket, sys
probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
probe.connect(("192.0.2.1", 9))
mine = probe.getsockname()[0]
gateway = str(ipaddress.IPv4Address(mine) - 1)
print("ADDRESS", mine)
for host in [*sys.argv[2:], gateway]:
    try:
        with socket.create_connection((host, int(sys.argv[1])), timeout=3) as c:
            print("CONNECTED", host, c.recv(100))
    except OSError as exc:
        print("REFUSED", host, type(exc).__name__)
"""


def _address_in_log(launch: object, timeout_s: float = 60) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            found = re.search(r"\bADDRESS (\S+)", task_log(launch))  # type: ignore[arg-type]
            if found:
                return found.group(1)
        time.sleep(0.1)
    raise AssertionError(f"no ADDRESS line in {timeout_s} s: {task_log(launch)}")  # type: ignore[arg-type]


@pytest.mark.parametrize("same_workflow", [True, False], ids=["same-workflow", "other-workflow"])
def test_a_group_cannot_reach_another_groups_socket(home: Path, same_workflow: bool) -> None:
    """Group A listens on 0.0.0.0 and says its eth0 address; group B (of the same workflow or
    another) connects to that address and to its own gateway (the router): each refused.
    Each group has an address of its own in the router's space."""
    if probe_router() is not None:
        pytest.skip(f"no egress router here ({probe_router()})")
    backend = _backend(home)
    port = 22000 + os.getpid() % 20000
    a = group_launches(
        backend,
        home,
        "wf-ra",
        {
            "listener": {
                "command": ["python3", "/tmp/listen.py", str(port), "25"],
                "files": [{"path": "/tmp/listen.py", "contents": ADDRESS_THEN_LISTEN}],
            }
        },
        group="ga",
    )
    backend.start_group(a)
    a_address = _address_in_log(a[0])
    assert ipaddress.IPv4Address(a_address) in GROUP_NETWORK
    b = group_launches(
        backend,
        home,
        "wf-ra" if same_workflow else "wf-rb",
        {
            "prober": {
                "command": ["python3", "/tmp/probe.py", str(port), a_address],
                "files": [{"path": "/tmp/probe.py", "contents": PROBE_PEERS}],
            }
        },
        group="gb",
    )
    backend.start_group(b)
    facts = wait_final(backend, [b[0].key], timeout_s=90)
    assert final(facts[b[0].key]).exit_code == 0
    text = task_log(b[0])
    assert "group-a-secret" not in text and "CONNECTED" not in text, text
    assert f"REFUSED {a_address}" in text
    assert _address_in_log(b[0]) != a_address
    backend.stop([a[0].key])
    wait_final(backend, [a[0].key], timeout_s=60)
    assert "ACCEPTED" not in task_log(a[0])


def test_pasta_dies_with_a_killed_launcher(home: Path) -> None:
    backend = _backend(home)
    launches = group_launches(backend, home, "wf-kill", {"t": {"command": ["sleep", "30"]}})
    backend.start_group(launches)
    launcher = _launcher_pid(backend)
    pastas = _pastas_of(launcher)
    assert len(pastas) == 1
    os.kill(launcher, signal.SIGKILL)
    gone, alive = psutil.wait_procs(pastas, timeout=15)
    assert alive == []
    wait_final(backend, [launches[0].key], timeout_s=60)


def test_host_network_runs_in_the_hosts_namespace_where_the_pool_allows_it(home: Path) -> None:
    server, url = serve("127.0.0.1")  # only the host's own namespace reaches it
    secret = server.RequestHandlerClass.secret  # type: ignore[attr-defined]
    try:
        backend = _backend(home, allow_host_network=True)
        text = run_one(backend, home, "wf-hostnet", fetch_task([url], host_network=True))
    finally:
        server.shutdown()
        server.server_close()
    assert f"GOT {url} {secret}" in text
    assert "the host's network (hostNetwork: true)" in text


def test_host_network_is_refused_where_the_pool_does_not_allow_it(home: Path) -> None:
    backend = _backend(home)
    launches = group_launches(
        backend, home, "wf-hostnet-no", {"t": {"command": ["true"], "host_network": True}}
    )
    with pytest.raises(BackendError, match="allow_host_network"):
        backend.start_group(launches)
    assert not (launches[0].run_dir / "events.jsonl").exists()


def test_names_resolve_in_a_task_as_on_the_host(home: Path) -> None:
    """DNS: the task's resolv.conf is the host's; its servers are reached through egress."""
    name = "deb.debian.org"
    try:
        socket.getaddrinfo(name, 80, socket.AF_INET)
    except OSError:
        pytest.skip(f"this machine itself does not resolve {name}")
    code = f"import socket; print('RESOLVED', socket.getaddrinfo({name!r}, 80, socket.AF_INET)[0][4][0])"
    text = run_one(_backend(home), home, "wf-dns", {"command": ["python3", "-c", code]})
    assert "RESOLVED" in text


def test_group_members_reach_each_other_with_egress(home: Path) -> None:
    backend = _backend(home)
    port = 21000 + os.getpid() % 20000
    launches = group_launches(
        backend,
        home,
        "wf-pair",
        {
            "server": {
                "command": ["python3", "/tmp/listen.py", str(port), "30"],
                "files": [{"path": "/tmp/listen.py", "contents": LISTEN}],
            },
            "client": {
                "command": [
                    "sh",
                    "-c",
                    f"sleep 1; python3 /tmp/connect.py {port} {{{{host:server}}}}",
                ],
                "files": [{"path": "/tmp/connect.py", "contents": CONNECT}],
            },
        },
        barrier=True,
    )
    backend.start_group(launches)
    facts = wait_final(backend, [l.key for l in launches], timeout_s=90)
    assert [final(facts[l.key]).exit_code for l in launches] == [0, 0]
    assert "ACCEPTED" in task_log(launches[0])
    assert "CONNECTED" in task_log(launches[1])


DUAL_STACK_NAMER = """import socket, sys
srv = socket.create_server(("::", int(sys.argv[1])), family=socket.AF_INET6, dualstack_ipv6=True)
srv.settimeout(30)
conn, peer = srv.accept()
print("PEER", peer[0])
try:
    print("NAMED", socket.getnameinfo(peer, socket.NI_NUMERICSERV | socket.NI_NAMEREQD)[0])
except OSError as exc:
    print("UNNAMED", exc)
"""


def test_a_dual_stack_server_names_its_peer_from_the_groups_hosts_file(home: Path) -> None:
    """torch's TCPStore listens on ``::`` and names every peer with getnameinfo; an IPv4
    peer is ``::ffff:a.b.c.d`` there, which glibc's ``files`` source resolves only from a
    line in that form. Without it each rendezvous connection asked DNS (issue 15's 10 s
    stalls). Here the name must come from the task's /etc/hosts: NI_NAMEREQD fails if no
    source names the address. A group shares one loopback, so the client's source address
    is 127.0.0.1 (the loopback route's source), which only the hosts file calls localhost.
    The client finds the server by its name, also from that file, which the task's root
    (the host's nobody) must be able to read under the server's umask 077."""
    backend = _backend(home)
    port = 22000 + os.getpid() % 20000
    launches = group_launches(
        backend,
        home,
        "wf-named",
        {
            "server": {
                "command": ["python3", "/tmp/namer.py", str(port)],
                "files": [{"path": "/tmp/namer.py", "contents": DUAL_STACK_NAMER}],
            },
            "client": {
                "command": ["sh", "-c", f"sleep 1; python3 /tmp/connect.py {port} server"],
                "files": [{"path": "/tmp/connect.py", "contents": CONNECT}],
            },
        },
        barrier=True,
    )
    backend.start_group(launches)
    facts = wait_final(backend, [l.key for l in launches], timeout_s=90)
    assert "CONNECTED server" in task_log(launches[1]), task_log(launches[1])
    log = task_log(launches[0])
    assert [final(facts[l.key]).exit_code for l in launches] == [0, 0], log
    assert "PEER ::ffff:" in log, log
    assert re.search(r"NAMED (localhost|client)\n", log), log


def test_the_launcher_is_out_of_reach_from_a_task(home: Path) -> None:
    """The launcher's socket is an abstract Unix socket of the host's network namespace:
    a task in its group's namespace cannot connect to it, egress or not."""
    backend = _backend(home)
    name = backend._launcher.name
    code = (
        "import socket; s = socket.socket(socket.AF_UNIX)\n"
        f"try: s.connect('\\0' + {name!r}); print('LAUNCHER REACHED')\n"
        "except OSError as exc: print('NO LAUNCHER', type(exc).__name__)\n"
    )
    text = run_one(backend, home, "wf-launcher", {"command": ["python3", "-c", code]})
    assert "NO LAUNCHER" in text and "LAUNCHER REACHED" not in text


def test_without_nft_each_group_gets_a_pasta_and_the_log_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The launcher's own code in this process, ``nft`` missing: no router (never one without
    rules), a pasta per group, and its log says why once."""
    if os.geteuid() != 0:
        pytest.skip("the launcher holds namespaces as descriptors only as root")
    real_which = router_mod.shutil.which
    monkeypatch.setattr(
        router_mod.shutil, "which", lambda name: None if name == "nft" else real_which(name)
    )
    launcher = launcher_mod._Launcher("test-no-nft", idle_s=60, group_grace_s=5)
    try:
        for key in ("wf/g1", "wf/g2"):
            launcher.networks.network(NetworkSpec(group=key, forward=[], egress=True))
        groups = [launcher.networks.groups[k] for k in ("wf/g1", "wf/g2")]
        assert launcher.networks.router is None
        assert all(
            g.egress is not None and g.egress.poll() is None and g.link is None for g in groups
        )
        assert len({g.egress.pid for g in groups if g.egress is not None}) == 2
    finally:
        launcher.close()
    log = capsys.readouterr().err
    assert log.count("no egress router (nft is not installed (Debian package nftables))") == 1
    assert all(g.egress is not None and g.egress.poll() is not None for g in groups)


def test_a_new_launcher_makes_a_new_router(home: Path, outside: tuple[str, str]) -> None:
    """The launcher killed: its router and pasta go with it; the next group's start brings a
    new launcher with a router of its own, and egress works again."""
    url, secret = outside
    backend = _backend(home)
    assert f"GOT {url} {secret}" in run_one(backend, home, "wf-first", fetch_task([url]))
    first = _launcher_pid(backend)
    pastas = _pastas_of(first)
    assert len(pastas) == 1
    os.kill(first, signal.SIGKILL)
    _gone, alive = psutil.wait_procs(pastas, timeout=15)
    assert alive == []
    assert f"GOT {url} {secret}" in run_one(backend, home, "wf-second", fetch_task([url]))
    second = _launcher_pid(backend)
    assert second != first and len(_pastas_of(second)) == 1
