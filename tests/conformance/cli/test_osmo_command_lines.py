"""OSMO's own command lines, run through ``osmo`` against a real trainyard server.

Each row is a command line in the form OSMO's CLI reference gives it (its usage lines and
"Ex." examples: ``osmo workflow list -f 5`` pages, it does not pick an output format), with
``{name}`` standing for what the example names (a workflow id, a spec file, an app, a
storage URL: ``conftest.osmo``). Each must parse as OSMO's argparse parses it (exit 0, no
usage error) and do what OSMO's reference says it does, checked on what the server then
holds or prints. ``test_every_osmo_flag_is_accepted`` checks the whole flag table
(``osmo-cli.txt``: every command and flag of OSMO's CLI, from its argparse definitions)
against the ``osmo`` command tree; the flags not taken yet are listed there, by name.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
from osmo_lines_support import Osmo, Ran

from trainyard.cli.main import build_app


@dataclass(frozen=True)
class Row:
    """An OSMO command line and what OSMO's reference says it does, as a check."""

    line: str
    check: Callable[[Osmo, Ran], None]
    setup: Callable[[Osmo], dict[str, str]] | None = None

    def __str__(self) -> str:
        return self.line


def ids(ran: Ran) -> list[str]:
    return [w["id"] for w in ran.json()]


def submitted_id(ran: Ran) -> str:
    """The id in ``Workflow submitted: ID`` (text) or ``{"id"}`` (json)."""
    text = ran.out.strip()
    return json.loads(text)["id"] if text.startswith("{") else text.rsplit(" ", 1)[-1]


def fresh(spec: str = "hello.yaml") -> Callable[[Osmo], dict[str, str]]:
    """A setup: submit ``spec`` and wait for its end; ``{wf}`` is its id."""

    def setup(osmo: Osmo) -> dict[str, str]:
        workflow_id = osmo.submit(spec)
        osmo.wait(workflow_id)
        return {"wf": workflow_id}

    return setup


def running(osmo: Osmo) -> dict[str, str]:
    """A setup: two workflows that run a while; ``{wf}`` and ``{wf2}``."""
    sleepy = osmo.root / "sleepy.yaml"
    sleepy.write_text(
        "workflow:\n  name: sleepy\n  tasks:\n  - name: s\n    command: [sleep, '300']\n"
    )
    return {"wf": osmo.submit("sleepy.yaml"), "wf2": osmo.submit("sleepy.yaml")}


_app_numbers = itertools.count(1)


def new_app(osmo: Osmo) -> dict[str, str]:
    """A setup: an app of two versions of its own; ``{name}``."""
    name = f"app-{next(_app_numbers)}"
    osmo.ok(f"osmo app create {name} -d first -f {osmo.values['spec']}")
    osmo.ok(f"osmo app update {name} -f {osmo.values['spec']}")
    return {"name": name}


# ------------------------------------------------------------------------------- checks


def check_submitted(osmo: Osmo, ran: Ran) -> None:
    assert ran.out.startswith("Workflow submitted: ")
    assert osmo.wait(submitted_id(ran))["status"] == "COMPLETED"


def rsync_setup(osmo: Osmo) -> dict[str, str]:
    """A setup: a folder to upload and a spec whose lead waits for it in its workspace."""
    folder = osmo.root / "to-upload"
    folder.mkdir(exist_ok=True)
    (folder / "payload.txt").write_text("uploaded by the daemon\n")
    spec = osmo.root / "waits.yaml"
    spec.write_text(
        "workflow:\n  name: waits\n  tasks:\n  - name: lead\n    command: [sh, -c, "
        "'for i in $(seq 60); do f=/osmo/run/workspace/to-upload/payload.txt; "
        "test -f $f && { cat $f; exit 0; }; sleep 1; done; exit 7']\n"
    )
    return {"rsync_spec": str(spec), "rsync_dir": str(folder)}


def check_rsync(osmo: Osmo, ran: Ran) -> None:
    """OSMO: a background daemon uploads LOCAL into the lead task once it runs."""
    assert "Rsync daemon started" in ran.err
    workflow_id = submitted_id(ran)
    assert osmo.wait(workflow_id)["status"] == "COMPLETED"
    assert "uploaded by the daemon" in osmo.ok(f"osmo workflow logs {workflow_id}").out


def one_gpu_spec(osmo: Osmo, name: str, seconds: int) -> str:
    spec = osmo.root / f"{name}.yaml"
    spec.write_text(
        f"workflow:\n  name: {name}\n  resources:\n    default: {{gpu: 1, cpu: 1}}\n"
        f"  tasks:\n  - name: t\n    command: [sleep, '{seconds}']\n"
    )
    return spec.name


def queue_behind_a_blocker(osmo: Osmo) -> dict[str, str]:
    """A setup: pool tiny's one GPU held by a blocker (until the check cancels it), then a
    LOW workflow queued behind it; the row queues a HIGH one after that."""
    blocker = osmo.submit(one_gpu_spec(osmo, "blocker", 600), "-p", "tiny")
    low = osmo.submit(one_gpu_spec(osmo, "lowprio", 1), "-p", "tiny", "--priority", "LOW")
    return {
        "blocker": blocker,
        "low": low,
        "high_spec": str(osmo.root / one_gpu_spec(osmo, "highprio", 1)),
    }


def check_high_first(osmo: Osmo, ran: Ran) -> None:
    """OSMO: the scheduler places HIGH before NORMAL before LOW: once the blocker's GPU is
    free, the HIGH workflow queued last starts before the LOW one queued first."""
    osmo.ok(f"osmo workflow cancel {osmo.values['blocker']}")
    high = osmo.wait(submitted_id(ran))
    low = osmo.wait(osmo.values["low"])
    start = {
        name: data["groups"][0]["tasks"][0]["start_time"]
        for name, data in (("high", high), ("low", low))
    }
    assert start["high"] < start["low"], start


def check_submit_pool_priority(osmo: Osmo, ran: Ran) -> None:
    data = osmo.query(submitted_id(ran))
    assert (data["pool"], data["priority"]) == ("local", "LOW")


def check_set(osmo: Osmo, ran: Ran) -> None:
    workflow_id = submitted_id(ran)
    assert workflow_id.startswith("greetings-")
    osmo.wait(workflow_id)
    assert "Custom" in osmo.ok(f"osmo workflow logs {workflow_id}").out


def check_list_default(osmo: Osmo, ran: Ran) -> None:
    lines = ran.out.splitlines()
    assert lines[0].split()[:2] == ["id", "status"]
    shown = [line.split()[0] for line in lines[2:]]
    newest = ids(osmo.run("osmo workflow list -o desc -t json"))
    assert shown == list(reversed(newest))[-20:]  # asc: the latest at the bottom


def check_offset(osmo: Osmo, ran: Ran) -> None:
    every = ids(osmo.run("osmo workflow list -c 1000 -o desc -t json"))
    assert ids(ran) == list(reversed(every[1:3]))  # skip the newest, 2, latest at the bottom


def check_statuses(osmo: Osmo, ran: Ran) -> None:
    got = ran.json()
    assert {w["status"] for w in got} <= {"COMPLETED", "FAILED"}
    assert {osmo.values["done"], osmo.values["failed"]} <= {w["id"] for w in got}


def check_tags(osmo: Osmo, ran: Ran) -> None:
    assert ran.out.count("tags:") == 1
    tagged = ids(osmo.run("osmo workflow list --tags nightly -t json"))
    assert tagged == [osmo.values["done"]]
    assert osmo.query(osmo.values["done"])["tags"] == ["experiment", "nightly"]


def old_tag(osmo: Osmo) -> dict[str, str]:
    """A setup: {done} tagged ``old`` (and ``experiment``, removed and added back by the
    row: OSMO applies --remove before --add)."""
    osmo.ok("osmo workflow tag -w {done} -a old experiment")
    return {}


def check_cancel(osmo: Osmo, ran: Ran) -> None:
    for key in ("wf", "wf2"):
        assert osmo.wait(osmo.values[key])["status"] == "FAILED_CANCELED"


def check_restart(osmo: Osmo, ran: Ran) -> None:
    assert "restarted" in ran.out
    data = osmo.wait(osmo.values["wf"])
    assert data["status"].startswith("FAILED")
    assert any(t["retry_id"] >= 1 for g in data["groups"] for t in g["tasks"])


def check_app_update(osmo: Osmo, ran: Ran) -> None:
    rows = osmo.ok(f"osmo app info {osmo.values['app']} -t json").json()
    assert [r["version"] for r in rows][-1] >= 2
    assert rows[-1]["description"] == "the hello app"  # kept from create


def check_app_submit(osmo: Osmo, ran: Ran) -> None:
    workflow_id = submitted_id(ran)
    assert osmo.wait(workflow_id)["status"] == "COMPLETED"
    assert workflow_id in ids(osmo.run(f"osmo workflow list -P {osmo.values['app']} -t json"))


def local_path_app(osmo: Osmo) -> dict[str, str]:
    """A setup: an app whose spec names a localpath file, and another folder holding a
    different file of that name."""
    made, other = osmo.root / "lp-made", osmo.root / "lp-other"
    for folder, text in ((made, "echo stored at create"), (other, "echo read at submit")):
        folder.mkdir(exist_ok=True)
        (folder / "run.sh").write_text(text + "\n")
    (made / "app.yaml").write_text(
        "workflow:\n  name: lp\n  tasks:\n  - name: t\n    command: [sh, /tmp/run.sh]\n"
        "    files:\n    - path: /tmp/run.sh\n      localpath: run.sh\n"
    )
    osmo.ok(f"osmo app create lp-app -d 'local files' -f {made / 'app.yaml'}")
    return {"lp_app": "lp-app", "lp_dir": str(other)}


def check_local_path(osmo: Osmo, ran: Ran) -> None:
    """OSMO: --local-path is where the spec's local files are fetched from at submit."""
    workflow_id = submitted_id(ran)
    assert osmo.wait(workflow_id)["status"] == "COMPLETED"
    assert "read at submit" in osmo.ok(f"osmo workflow logs {workflow_id}").out


def check_rename(osmo: Osmo, ran: Ran) -> None:
    assert osmo.run(f"osmo app info {osmo.values['name']}").code == 3
    assert len(osmo.ok(f"osmo app info {osmo.values['name']}-renamed -t json").json()) == 2


def check_delete_version(osmo: Osmo, ran: Ran) -> None:
    rows = osmo.ok(f"osmo app info {osmo.values['name']} -t json").json()
    assert [r["version"] for r in rows] == [2]


def check_delete_latest(osmo: Osmo, ran: Ran) -> None:
    rows = osmo.ok(f"osmo app info {osmo.values['name']} -t json").json()
    assert [r["version"] for r in rows] == [1]  # osmo: NAME alone is its latest version


def check_delete_all(osmo: Osmo, ran: Ran) -> None:
    assert osmo.run(f"osmo app info {osmo.values['name']}").code == 3


def check_profile(osmo: Osmo, ran: Ran) -> None:
    listed = osmo.ok("osmo profile list -t json").json()
    assert listed["pool"] == "local"
    workflow_id = osmo.ok(f"osmo workflow submit {osmo.root / 'hello.yaml'} -t json").json()["id"]
    assert osmo.query(workflow_id)["pool"] == "local"


def check_token_set(osmo: Osmo, ran: Ran) -> None:
    token = ran.out.strip()
    listed = osmo.ok("osmo token list -t json").json()
    assert {
        "name": "ci-token",
        "expires_at": "2099-12-31",
        "description": "for CI",
    }.items() <= next(r for r in listed if r["name"] == "ci-token").items()
    assert token not in json.dumps(listed)  # a token is shown once, when made


def check_token_delete(osmo: Osmo, ran: Ran) -> None:
    assert "gone-token" not in [r["name"] for r in osmo.ok("osmo token list -t json").json()]


def check_user_create(osmo: Osmo, ran: Ran) -> None:
    users = osmo.ok("osmo user list -t json").json()
    assert {"id": "alice", "roles": ["osmo-user"]} in users


def check_login(osmo: Osmo, ran: Ran) -> None:
    assert ran.out.strip().endswith(" as alice")
    mine = osmo.ok("osmo profile list -t json").json()
    assert mine["user"] == "alice"
    assert osmo.ok("osmo logout").out.strip() == "Logged out"
    assert osmo.ok("osmo profile list -t json").json()["user"] != "alice"


def login_setup(osmo: Osmo) -> dict[str, str]:
    if "alice" not in [u["id"] for u in osmo.ok("osmo user list -t json").json()]:
        osmo.ok("osmo user create alice -r osmo-user")
    token = osmo.ok("osmo token set alice-cli -u alice").out.strip()
    return {"token": token}


def check_upload(osmo: Osmo, ran: Ran) -> None:
    listed = osmo.ok("osmo data list {url}/copy -r -t json").json()
    assert {r["path"] for r in listed} == {"a.txt", "b.txt"}


def check_download(osmo: Osmo, ran: Ran) -> None:
    local = Path(osmo.values["dir"])
    assert sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file()) == [
        "a.txt",
        "b.txt",
    ]


def check_data_list(osmo: Osmo, ran: Ran) -> None:
    shown = [line.split()[0] for line in ran.out.splitlines()[2:]]
    assert {"readme.md", "train/"} <= set(shown)  # (and copy/, when the upload row ran)
    assert all(path.count("/") <= 1 and not path.startswith("train/a") for path in shown)


def check_data_delete(osmo: Osmo, ran: Ran) -> None:
    listed = osmo.ok("osmo data list {url}/scratch -r -t json").json()
    assert [r["path"] for r in listed] == ["keep.txt"]


def scratch(osmo: Osmo) -> dict[str, str]:
    folder = Path(osmo.values["url"].removeprefix("file://")) / "scratch"
    folder.mkdir(exist_ok=True)
    (folder / "keep.txt").write_text("k\n")
    (folder / "drop.log").write_text("d\n")
    return {}


def no_check(_osmo: Osmo, _ran: Ran) -> None:
    """What the row's exit 0 and output (in the line's own assertion) already show."""


def out_has(*texts: str) -> Callable[[Osmo, Ran], None]:
    def check(_osmo: Osmo, ran: Ran) -> None:
        for text in texts:
            assert text in ran.out, (text, ran.out)

    return check


def json_is(test: Callable[[Osmo, object], bool]) -> Callable[[Osmo, Ran], None]:
    def check(osmo: Osmo, ran: Ran) -> None:
        data = ran.json()
        assert test(osmo, data), data

    return check


# --------------------------------------------------------------------------------- rows

ROWS: list[Row] = [
    # osmo workflow submit
    Row("osmo workflow submit {spec}", check_submitted),
    Row("osmo workflow submit {spec} --pool local --priority LOW", check_submit_pool_priority),
    Row(
        "osmo workflow submit {high_spec} -p tiny --priority HIGH",
        check_high_first,
        queue_behind_a_blocker,
    ),
    Row(
        "osmo workflow submit {spec} -p local -t json",
        json_is(lambda o, d: d["id"].startswith("hello-osmo-")),
    ),
    Row(
        "osmo workflow submit {templated} --set workflow_name=greetings --set-string "
        "message='Custom message!'",
        check_set,
    ),
    Row(
        "osmo workflow submit {spec} --set-env A=1 B=2 --label team=robotics",
        lambda o, r: o.query(submitted_id(r))["labels"] == {"team": "robotics"},
    ),
    Row("osmo workflow submit {spec} --dry-run", out_has("name: hello-osmo")),
    Row("osmo workflow submit {done}", check_submitted),
    Row(
        "osmo workflow submit {rsync_spec} --rsync {rsync_dir}:/osmo/run/workspace",
        check_rsync,
        rsync_setup,
    ),  # a workflow id: its spec again
    # validate
    Row("osmo workflow validate {spec}", out_has("Workflow validation succeeded.")),
    Row("osmo workflow validate {spec} -p local --set a=1", no_check),
    # query
    Row("osmo workflow query {done}", out_has("COMPLETED", "Labels: team=vision")),
    Row(
        "osmo workflow query {failed} -v -t json",
        json_is(
            lambda o, d: (
                d["status"].startswith("FAILED") and "retries" in d["groups"][0]["tasks"][0]
            )
        ),
    ),
    # list
    Row("osmo workflow list", check_list_default),
    Row("osmo workflow list -c 2 -f 1 -t json", check_offset),
    Row("osmo workflow list -s COMPLETED FAILED -c 100 -t json", check_statuses),
    Row(
        "osmo workflow list --name broken -t json",
        json_is(lambda o, d: [w["name"] for w in d] == ["broken"]),
    ),
    Row(
        "osmo workflow list --submitted-after 2023-05-02 --submitted-before 2099-05-04 -a "
        "-c 100 -t json",
        json_is(lambda o, d: o.values["done"] in [w["id"] for w in d]),
    ),
    Row(
        "osmo workflow list -u root -p local -o desc -c 100 -t json",
        json_is(lambda o, d: all(w["submitted_by"] == "root" for w in d)),
    ),
    Row(
        "osmo workflow list --label team=vision -t json",  # {done}, and its resubmission
        json_is(
            lambda o, d: (
                o.values["done"] in [w["id"] for w in d]
                and {w["labels"]["team"] for w in d} == {"vision"}
            )
        ),
    ),
    Row(
        "osmo workflow list --no-label team -c 100 -t json",
        json_is(lambda o, d: o.values["done"] not in [w["id"] for w in d]),
    ),
    Row(
        "osmo workflow list --priority HIGH LOW -t json",
        json_is(
            lambda o, d: (
                all(o.query(w["id"])["priority"] in ("HIGH", "LOW") for w in d)
                and o.values["done"] not in [w["id"] for w in d]
            )
        ),
    ),
    Row("osmo workflow list -P {app} -t json", json_is(lambda o, d: isinstance(d, list))),
    # tag
    Row(
        "osmo workflow tag -w {done} --add nightly experiment --remove old experiment",
        check_tags,
        old_tag,
    ),
    Row("osmo workflow tag", out_has("nightly")),
    # logs, events, spec
    Row("osmo workflow logs {done}", out_has("[hello] Hello from OSMO!")),
    Row(
        "osmo workflow logs {failed} -t crash -r 0 -n 1",
        lambda o, r: len([line for line in r.out.splitlines() if "[crash]" in line]) == 1,
    ),
    Row("osmo workflow logs {failed} --error", out_has("about to fail")),
    Row("osmo workflow events {done}", out_has("RUNNING", "COMPLETED")),
    Row("osmo workflow events {failed} --task crash --retry-id 0", out_has("crash")),
    Row("osmo workflow spec {done}", out_has("name: hello-osmo")),
    Row("osmo workflow spec {done} --template", out_has("Hello from OSMO!")),
    # cancel, restart
    Row("osmo workflow cancel {wf} {wf2} -m 'no longer needed' -f", check_cancel, running),
    Row("osmo workflow restart {wf} -p local", check_restart, fresh("broken.yaml")),
    # apps
    Row("osmo app update {app} -f {spec}", check_app_update),
    Row("osmo app info {app} -c 5 -o desc", out_has("demo-app", "the hello app")),
    Row("osmo app show {app}", out_has("hello-osmo")),
    Row("osmo app spec {app}:1", out_has("name: hello-osmo")),
    Row(
        "osmo app list -n demo -c 5 -o desc -t json",
        json_is(lambda o, d: [a["name"] for a in d] == ["demo-app"]),
    ),
    Row("osmo app submit {app} -p local --set-env A=1", check_app_submit),
    Row("osmo app submit {lp_app} -l {lp_dir}", check_local_path, local_path_app),
    Row("osmo app rename {name} {name}-renamed -f", check_rename, new_app),
    Row("osmo app delete {name}:1 -f", check_delete_version, new_app),
    Row("osmo app delete {name} -f", check_delete_latest, new_app),
    Row("osmo app delete {name} --all --force", check_delete_all, new_app),
    # tasks, pools, resources
    Row(
        "osmo task list -s COMPLETED FAILED -w {failed} -t json",
        json_is(lambda o, d: [(t["name"], t["status"][:6]) for t in d] == [("crash", "FAILED")]),
    ),
    Row("osmo task list", out_has("")),
    Row("osmo task list -a -S -s COMPLETED", out_has("user", "pool")),
    Row("osmo pool list", out_has("local")),
    Row(
        "osmo pool list -p local -m free -t json",
        json_is(lambda o, d: [p["name"] for p in d] == ["local"] and d[0]["gpu"]["free"] >= 0),
    ),
    Row("osmo resource list -p local -m free", out_has("local-0")),
    Row(
        "osmo resource list --all -t json",
        json_is(lambda o, d: {r["pool"] for r in d} == {"local", "tiny"}),
    ),
    Row("osmo resource info local-0 -p local", out_has("Node local-0", "gpu")),
    # profile, version, tokens, users, login
    Row("osmo profile set pool local", check_profile),
    Row("osmo profile list", out_has("pool", "local")),
    Row("osmo version -t json", json_is(lambda o, d: d["server"]["url"] == o.values["server"])),
    Row("osmo token set ci-token -e 2099-12-31 -d 'for CI'", check_token_set),
    Row("osmo token list", out_has("ci-token")),
    Row(
        "osmo token delete gone-token",
        check_token_delete,
        lambda o: o.ok("osmo token set gone-token") and {},
    ),
    Row("osmo user create alice -r osmo-user", check_user_create),
    Row("osmo user list -p al -t json", json_is(lambda o, d: [u["id"] for u in d] == ["alice"])),
    Row(
        "osmo user update alice -a osmo-admin",
        lambda o, r: "osmo-admin" in o.ok("osmo user get alice -t json").json()["roles"],
    ),
    Row(
        "osmo user update alice --remove-roles osmo-admin",
        lambda o, r: o.ok("osmo user get alice -t json").json()["roles"] == ["osmo-user"],
    ),
    Row("osmo token roles ci-token", out_has("osmo-admin")),
    Row(
        "osmo user delete carol --force",
        lambda o, r: "carol" not in [u["id"] for u in o.ok("osmo user list -t json").json()],
        lambda o: o.ok("osmo user create carol") and {},
    ),
    Row("osmo login {server} --method token --token {token}", check_login, login_setup),
    # data
    Row(
        "osmo data upload {url}/copy {url_path}/train/",
        check_upload,
        lambda o: {"url_path": o.values["url"].removeprefix("file://")},
    ),
    Row("osmo data download {url}/train {dir}", check_download),
    Row(
        "osmo data download {url}/train {dir} --resume -p 2 -T 2 -b {dir}-bench.json",
        lambda o, r: json.loads(Path(o.values["dir"] + "-bench.json").read_text())["files"] == 0,
    ),  # both files there already, same sizes: none fetched again
    Row("osmo data check {url} -a READ", out_has("READ: ok")),
    Row("osmo data list {url}", check_data_list),
    Row(
        "osmo data list {url} --prefix train -r -t json",
        json_is(lambda o, d: sorted(r["path"] for r in d) == ["train/a.txt", "train/b.txt"]),
    ),
    Row("osmo data delete {url}/scratch -x '\\.log$'", check_data_delete, scratch),
    # global option
    Row(
        "osmo --log-level DEBUG workflow query {done} -t json",
        json_is(lambda o, d: d["id"] == o.values["done"]),
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=str)
def test_osmo_command_line(osmo: Osmo, row: Row) -> None:
    values = row.setup(osmo) if row.setup else {}
    osmo.values.update(values)
    ran = osmo.run(row.line)
    assert ran.code == 0, f"{ran.line}: exit {ran.code}\n{ran.out}\n{ran.err}"
    assert "Usage:" not in ran.err
    result = row.check(osmo, ran)
    assert result is None or result is True, f"{ran.line}: check failed\n{ran.out}"


def test_the_table_has_at_least_40_lines() -> None:
    assert len(ROWS) >= 40
    assert len({row.line for row in ROWS}) == len(ROWS)


def test_login_methods_other_than_a_token_are_refused_with_the_reason(osmo: Osmo) -> None:
    """OSMO's password, device-code and browser logins parse, and are refused: trainyard
    servers take tokens."""
    ran = osmo.run("osmo login {server} --password secret")
    assert ran.code == 2 and "takes a token" in " ".join(ran.err.split())


def test_usage_errors_name_osmo(osmo: Osmo) -> None:
    ran = osmo.run("osmo workflow list --sideways")
    assert ran.code == 2
    assert "Usage: osmo workflow list" in ran.err and "trainyard" not in ran.err
    missing = osmo.run("osmo app info no-such-app")
    assert missing.code == 3
    assert missing.err.strip() == "error: no app 'no-such-app'; `osmo app list` shows the apps"


def test_dash_f_is_never_the_format(osmo: Osmo) -> None:
    """OSMO's ``-f`` is --offset (list), --force (cancel, app delete), --file (app
    create): ``osmo workflow list -f 5`` pages (the issue's first report)."""
    assert osmo.ok("osmo workflow list -f 5").code == 0
    assert osmo.run("osmo workflow query {done} -f json").code == 2


# ------------------------------------------------------------------- the whole flag table

TABLE = Path(__file__).with_name("osmo-cli.txt")

NOT_YET: frozenset[str] = frozenset()
"""OSMO commands and flags ``osmo`` does not take yet (each a usage error today). A flag
that gets taken must leave this set (the test says which), so the set stays the truth."""


def _osmo_table() -> list[tuple[list[str], list[str]]]:
    rows = []
    for line in TABLE.read_text().splitlines():
        if line.startswith("#") or "|" not in line:
            continue
        command, flags = line.split("|", 1)
        names = [
            name for token in flags.split() if token.startswith("-") for name in token.split("/")
        ]
        rows.append((command.split()[1:], names))
    return rows


def _missing() -> set[str]:
    root = typer.main.get_command(build_app())
    missing: set[str] = set()
    for words, flags in _osmo_table():
        command = root
        for word in words:
            if not hasattr(command, "commands"):
                break  # a leaf that takes OSMO's sub-verb as its first argument (rsync)
            command = command.commands.get(word)
            if command is None:
                break
        if command is None:
            missing.add(" ".join(words))
            continue
        taken = {
            opt
            for param in command.params
            for opt in [*getattr(param, "opts", []), *getattr(param, "secondary_opts", [])]
        }
        missing |= {f"{' '.join(words)} {flag}" for flag in flags if flag not in taken}
    return missing


def test_every_osmo_flag_is_accepted() -> None:
    missing = _missing()
    assert missing - NOT_YET == set(), "OSMO flags osmo does not take"
    assert NOT_YET - missing == set(), "taken now: remove from NOT_YET"
