"""The podman container's privileges (issue 11, images): root inside is the host's
``nobody`` and nothing else is mapped, no capability, ``no_new_privs``, no default sysctls,
and a seccomp profile without nested user namespaces. Fast checks of what
``backends.local.container`` asks podman for; tests/integration/backends/test_local_container.py
runs the real container."""

from __future__ import annotations

import json
from pathlib import Path

from trainyard.backends.local.container import (
    CONTAINERS_CONF_TEXT,
    ContainerPlan,
    container_userns,
    containers_conf,
    no_nested_userns,
    podman_argv,
    seccomp_profile,
)


def plan(tmp_path: Path, **fields: object) -> ContainerPlan:
    return ContainerPlan(
        image="localhost/bb:1",
        name="trainyard-x",
        hostname="t",
        network="ns:/proc/7/fd/9",
        root_dir=tmp_path / "root",
        **fields,
    )


def _after(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_root_inside_is_the_hosts_nobody_without_capabilities(tmp_path: Path) -> None:
    argv = podman_argv(plan(tmp_path))
    assert _after(argv, "--uidmap") == ["0:65534:1"] and _after(argv, "--gidmap") == ["0:65534:1"]
    assert _after(argv, "--cap-drop") == ["all"]
    assert "no-new-privileges" in _after(argv, "--security-opt")
    assert "--privileged" not in argv and "--cap-add" not in argv
    assert argv[-1] == "localhost/bb:1"


def test_the_runner_gives_the_containers_root_its_folders_without_a_handshake(
    tmp_path: Path,
) -> None:
    userns = container_userns(plan(tmp_path))
    assert (userns.host_uid, userns.host_gid, userns.args_at) == (65534, 65534, None)
    assert userns.own == [
        str(tmp_path / "root"),
        str(tmp_path / "root" / "tmp"),
        str(tmp_path / "root" / "osmo" / "run" / "workspace"),
    ]


def test_podman_gets_trainyards_conf_and_profile(tmp_path: Path) -> None:
    conf = containers_conf(tmp_path / "state")
    assert (
        conf.read_text() == CONTAINERS_CONF_TEXT and "default_sysctls = []" in CONTAINERS_CONF_TEXT
    )
    assert containers_conf(tmp_path / "state") == conf  # written once
    source = tmp_path / "podman-seccomp.json"
    source.write_text(
        json.dumps(
            {
                "defaultAction": "SCMP_ACT_ERRNO",
                "syscalls": [
                    {
                        "names": ["read", "unshare", "clone", "clone3", "setns"],
                        "action": "SCMP_ACT_ALLOW",
                    }
                ],
            }
        )
    )
    profile = seccomp_profile(tmp_path / "state", source)
    assert profile is not None
    argv = podman_argv(plan(tmp_path, conf=conf, seccomp=profile))
    assert argv[:2] == ["env", f"CONTAINERS_CONF={conf}"] and argv[2] == "podman"
    assert f"seccomp={profile}" in _after(argv, "--security-opt")
    assert seccomp_profile(tmp_path / "state", tmp_path / "absent.json") is None


def test_the_profile_refuses_new_user_namespaces_only() -> None:
    rules = no_nested_userns(
        {
            "defaultAction": "SCMP_ACT_ERRNO",
            "syscalls": [
                {"names": ["read", "unshare", "clone", "clone3"], "action": "SCMP_ACT_ALLOW"},
                {
                    "names": ["clone"],
                    "action": "SCMP_ACT_ALLOW",
                    "includes": {"caps": ["CAP_SYS_ADMIN"]},
                },
            ],
        }
    )["syscalls"]
    unconditional = [
        n
        for r in rules
        if not r.get("args") and r["action"] == "SCMP_ACT_ALLOW"
        for n in r["names"]
    ]
    assert unconditional == ["read"]  # no rule allows unshare/clone/clone3 whatever the flags
    allow, deny = (r for r in rules if r.get("args"))
    assert allow["action"] == "SCMP_ACT_ALLOW" and allow["args"][0]["valueTwo"] == 0
    assert deny["action"] == "SCMP_ACT_ERRNO" and deny["args"][0]["valueTwo"] == 0x10000000
    assert {a["value"] for a in (allow["args"][0], deny["args"][0])} == {0x10000000}
    (clone3,) = (r for r in rules if r["names"] == ["clone3"])
    assert (clone3["action"], clone3["errnoRet"]) == ("SCMP_ACT_ERRNO", 38)
