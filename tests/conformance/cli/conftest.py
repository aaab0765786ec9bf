"""A real trainyard server for OSMO's command lines, driven only through the ``osmo`` program.

One server per module, in a home of its own (started by the first ``osmo`` command, as the
CLI starts one by itself), with what OSMO's examples refer to already made: a COMPLETED
workflow, a FAILED one, an app, and files in a storage folder.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from cli_process import TERMINAL
from osmo_lines_support import FAILING, HELLO, TEMPLATED, Osmo


@pytest.fixture(scope="module")
def osmo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Osmo]:
    """The server, and the things OSMO's examples name: ``{spec}`` (a hello-world spec),
    ``{done}`` (a COMPLETED workflow of it, label team=vision), ``{failed}`` (a FAILED one),
    ``{app}`` (an app), ``{url}`` (a storage folder with files), ``{dir}`` (a local folder)."""
    root = tmp_path_factory.mktemp("osmo-lines")
    home = root / "home"
    home.mkdir(mode=0o700)
    (home / "pools.yaml").write_text(  # one GPU in all: gangs of it queue (priority rows)
        "pools:\n  tiny:\n    backend: local\n    nodes:\n"
        "    - {name: tiny-0, gpu: 1, cpu: 4, memory: 8Gi, storage: 10Gi}\n"
    )
    (root / "hello.yaml").write_text(HELLO)
    (root / "broken.yaml").write_text(FAILING)
    (root / "templated.yaml").write_text(TEMPLATED)
    data = root / "bucket"
    (data / "train").mkdir(parents=True)
    (data / "train" / "a.txt").write_text("a\n")
    (data / "train" / "b.txt").write_text("bb\n")
    (data / "readme.md").write_text("hello\n")
    made = Osmo(
        home,
        root,
        {
            "spec": str(root / "hello.yaml"),
            "url": f"file://{data}",
            "dir": str(root / "local"),
            "templated": str(root / "templated.yaml"),
        },
    )
    done = made.submit("hello.yaml", "--label", "team=vision")
    failed = made.submit("broken.yaml")
    assert made.wait(done)["status"] == "COMPLETED"
    assert made.wait(failed)["status"].startswith("FAILED")
    made.ok(f"osmo app create demo-app -d 'the hello app' -f {root / 'hello.yaml'}")
    made.values.update(
        done=done,
        failed=failed,
        app="demo-app",
        server=json.loads((home / "server.json").read_text())["url"],
    )
    yield made
    for row in made.run("osmo workflow list -a -c 1000 -t json").json():
        if not row["status"].startswith(TERMINAL):
            made.run(f"osmo workflow cancel {row['id']}")
    stopped = made.run("osmo server stop")
    assert stopped.code == 0, stopped.err
