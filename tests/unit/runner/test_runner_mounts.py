"""The runner outside a sandbox (``SandboxSettings.mounts``): files land where the command's
view shows them, read-only places are refused, and a missing program is 127 as in a shell."""

from __future__ import annotations

from pathlib import Path

from runner_support import MakeRun, event_kinds, execute, log_text


def view(tmp_path: Path) -> dict[str, object]:
    """A command's view: its own ``/`` under tmp_path, the host's /usr, /bin, /etc read-only
    and a same-path folder for outputs."""
    shared = tmp_path / "shared"
    shared.mkdir(exist_ok=True)
    mounts = {
        "/": str(tmp_path / "root"),
        "/usr": "/usr",
        "/bin": "/bin",
        "/etc": "/etc",
        str(shared): str(shared),
    }
    return {"root": None, "mounts": mounts, "readonly": ["/usr", "/bin", "/etc"]}


def test_files_land_under_the_view_and_the_command_reads_them(
    make_run: MakeRun, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    run = make_run(
        command=["sh", "-c", f"cat {tmp_path}/root/app/conf.txt; echo out > {shared}/o.txt"],
        files=[
            {"path": "/app/conf.txt", "contents": "wf={{workflow_id}}\n"},
            {"path": "tmp/rel.txt", "contents": "relative to /\n"},
            {"path": f"{shared}/in.txt", "contents": "same path\n"},
        ],
        sandbox=view(tmp_path),
    )
    assert execute(run) == 0
    assert (tmp_path / "root" / "app" / "conf.txt").read_text() == "wf=wf-7\n"
    assert (tmp_path / "root" / "tmp" / "rel.txt").read_text() == "relative to /\n"
    assert (shared / "in.txt").read_text() == "same path\n"
    assert "[t1] wf=wf-7" in log_text(run)  # text is not rewritten: the sandbox maps paths
    assert not Path("/app/conf.txt").exists()


def test_a_file_in_a_read_only_place_fails_the_task(make_run: MakeRun, tmp_path: Path) -> None:
    run = make_run(
        command=["true"],
        sandbox=view(tmp_path),
        files=[{"path": "/etc/trainyard-should-not-exist", "contents": "x"}],
    )
    assert execute(run) == 256
    assert not Path("/etc/trainyard-should-not-exist").exists()
    assert "read-only in the task's sandbox" in log_text(run)


def test_missing_and_unexecutable_programs_are_127_and_126(
    make_run: MakeRun, tmp_path: Path
) -> None:
    missing = make_run(task="m", command=["no-such-program-trainyard"], sandbox=view(tmp_path))
    assert execute(missing) == 127
    assert event_kinds(missing)[-1] == ("EXITED", 127)
    assert "cannot start 'no-such-program-trainyard'" in log_text(missing)
    plain_file = tmp_path / "shared" / "plain.txt"
    plain_file.write_text("not a program")
    plain_file.chmod(0o644)
    plain = make_run(task="p", command=[str(plain_file)], sandbox=view(tmp_path))
    assert execute(plain) == 126
    assert "not executable" in log_text(plain)
