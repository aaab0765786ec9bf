"""A submitted spec is stored once (issue 12 M2): the rendered text in the record's
``spec_text``; the request without a second copy of it or of its ``localpath`` files; no
parsed copy. The workflow is rebuilt from that text after a restart (resume, ``restart``),
``submit ID`` gets its request back, and records stored the old way still load."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from trainyard.backends.fake import FakeBackend, Outcome
from trainyard.engine.reconciler import Engine, _spec_from_source
from trainyard.pools import Pool, default_local_pool
from trainyard.server.auth import User
from trainyard.server.schema import SpecRequest
from trainyard.server.service import Service
from trainyard.store import Store

MARK = "only-once-7d1f"
PLAIN = f"""workflow:
  name: plain
  tasks:
  - name: t
    command: [sh, /tmp/run.sh, {MARK}]
    files:
    - localpath: run.sh
      path: /tmp/run.sh
    outputs:
    - url: file:///srv/data/out
"""
TEMPLATE = """workflow:
  name: {{ name }}
  tasks:
  - name: t
    command: [echo, '{{ msg }}']
    environment: {A: '1'}
default-values:
  name: tpl
  msg: hi
"""
ADMIN = User("admin", True)


def _pool() -> Pool:
    """The rehearsal pool with a data root for the spec's ``file://`` output (the default
    roots are the home's storage folder only)."""
    return default_local_pool().model_copy(
        update={"options": {"allowed_data_roots": ["/srv/data"]}}
    )


def _service(tmp_path: Path, backend: FakeBackend) -> Service:
    engine = Engine(
        Store(f"sqlite:///{tmp_path / 'db'}"),
        tmp_path,
        pools={"local": _pool()},
        backend_factory=lambda p, h: backend,
    )
    return Service(engine)


def _row_text(tmp_path: Path, workflow_id: str) -> str:
    with sqlite3.connect(tmp_path / "db") as db:
        row = db.execute(
            "select spec_text, source, state from workflows where id = ?", (workflow_id,)
        ).fetchone()
    return "\n".join(row)


def test_a_spec_and_its_files_are_stored_once_and_rebuilt_exactly(tmp_path: Path) -> None:
    service = _service(tmp_path, FakeBackend(lambda launch: Outcome(0, polls=2)))
    req = SpecRequest(
        spec_text=PLAIN,
        files={"run.sh": f"echo file-{MARK}\n"},
        set_env=["B=2"],
        labels={"team": "x"},
    )
    loaded = service.submissions.load(req)
    wid = service.submissions.submit(req, ADMIN)["id"]
    stored = _row_text(tmp_path, wid)
    assert stored.count(MARK) == 1 + 1  # the spec text once, the file once
    assert stored.count(f"file-{MARK}") == 1
    record = service.engine.store.get_workflow(wid)
    assert record.spec_text == PLAIN and "spec" not in record.source
    rebuilt = _spec_from_source(record)
    assert rebuilt == loaded.workflow  # files read in, --set-env and labels applied
    assert rebuilt.groups[0].tasks[0].environment == {"B": "2"}
    assert service.reads.query(wid, ADMIN)["groups"][0]["tasks"][0]["outputs"] == [
        "file:///srv/data/out"
    ]


def test_a_restarted_engine_resumes_from_the_text_and_submit_id_gets_the_request_back(
    tmp_path: Path,
) -> None:
    backend = FakeBackend(lambda launch: Outcome(1 if launch.key.retry_id == 0 else 0, polls=3))
    service = _service(tmp_path, backend)
    wid = service.submissions.submit(SpecRequest(spec_text=TEMPLATE, set=["msg=yo"]), ADMIN)["id"]
    service.engine.step()
    service.engine.close()
    again = _service(tmp_path, backend)  # the same backend: its tasks "kept running"
    assert again.engine.wait(wid, 10).status == "FAILED"
    again.control.restart(wid, ADMIN)  # an ended workflow's spec is rebuilt from its text too
    assert again.engine.wait(wid, 10).status == "COMPLETED"
    assert [launch.run["command"] for launch in backend.launches][-1][:2] == ["echo", "yo"]
    record = again.engine.store.get_workflow(wid)
    assert record.source["request"]["spec_text"] == TEMPLATE  # a template is kept: --set
    resubmitted = again.submissions.resubmit(
        wid, ADMIN, SpecRequest(spec_text="", set=["msg=again"])
    )
    assert again.engine.store.get_workflow(resubmitted["id"]).spec_text == TEMPLATE.replace(
        "{{ name }}", "tpl"
    ).replace("{{ msg }}", "again")
    plain = again.submissions.submit(SpecRequest(spec_text=PLAIN, files={"run.sh": "x"}), ADMIN)[
        "id"
    ]
    copy = again.submissions.resubmit(plain, ADMIN, None)
    copied = again.engine.store.get_workflow(copy["id"])
    assert copied.spec_text == PLAIN and copied.source["reparse"]["files"] == {"run.sh": "x"}


def test_a_record_stored_with_its_spec_json_still_loads(tmp_path: Path) -> None:
    service = _service(tmp_path, FakeBackend())
    loaded = service.submissions.load(SpecRequest(spec_text=PLAIN, files={"run.sh": "x"}))
    record = service.engine.store.create_workflow(
        name="old",
        pool="local",
        submitted_by="admin",
        labels={},
        spec_text="not parsed",
        source={"spec": loaded.workflow.model_dump(mode="json", by_alias=True)},
        make_state=lambda wid: ("COMPLETED", {}),
    )
    assert _spec_from_source(record) == loaded.workflow


def test_the_stored_spec_of_a_workflow_rendered_or_as_written(tmp_path: Path) -> None:
    service = _service(tmp_path, FakeBackend())
    plain = service.submissions.submit(SpecRequest(spec_text=PLAIN, files={"run.sh": "x"}), ADMIN)[
        "id"
    ]
    assert (
        service.submissions.stored_spec(plain, ADMIN)
        == service.submissions.stored_spec(plain, ADMIN, template=True)
        == PLAIN
    )
    tpl = service.submissions.submit(SpecRequest(spec_text=TEMPLATE, set=["msg=yo"]), ADMIN)["id"]
    assert "command: [echo, 'yo']" in service.submissions.stored_spec(tpl, ADMIN)
    assert service.submissions.stored_spec(tpl, ADMIN, template=True) == TEMPLATE
