"""A task's credentials in the runner (issue 25): env vars for the mapping form, one 0600
file per key for the path form inside the task's private root only, OSMO's words for a
missing one, values never in the runner's log lines nor left in run.json."""

from __future__ import annotations

import os
from pathlib import Path

from runner_support import MakeRun, execute, log_text, write_run_json

from trainyard.runfile import load_run

SECRET = "s3cr3t-v4lue-XYZ"


def _creds(*uses: dict) -> list[dict]:
    return list(uses)


def test_mapping_form_sets_variables(make_run: MakeRun, tmp_path: Path) -> None:
    run = make_run(
        script=f'test "$HF_TOKEN" = "{SECRET}" && echo ok > {{{{output}}}}/seen\n',
        credentials=_creds(
            {"name": "hf", "env": {"HF_TOKEN": "token"}, "values": {"token": SECRET}}
        ),
    )
    assert execute(run) == 0, log_text(run)
    assert (run.output_path / "seen").read_text() == "ok\n"


def test_path_form_writes_one_0600_file_per_key_under_the_root_and_removes_them(
    make_run: MakeRun, tmp_path: Path
) -> None:
    run = make_run(
        script=(
            "stat -c %a /tmp/github/token > {{output}}/seen; "
            "cat /tmp/github/user >> {{output}}/seen\n"
        ),
        credentials=_creds(
            {"name": "github-pat", "path": "/tmp/github", "values": {"token": SECRET, "user": "me"}}
        ),
    )
    assert execute(run) == 0, log_text(run)
    assert (run.output_path / "seen").read_text() == "600\nme"
    root = Path(run.sandbox.root or "")
    assert not (root / "tmp" / "github" / "token").exists()  # removed at the end
    assert SECRET not in log_text(run)


def test_missing_credential_fails_with_osmos_words_before_the_command(
    make_run: MakeRun, tmp_path: Path
) -> None:
    run = make_run(
        script="touch {{output}}/ran\n",
        credentials=_creds({"name": "nope", "env": {"X": "k"}, "values": None}),
    )
    assert execute(run) == 256
    assert "Could not find the credential: nope" in log_text(run)
    assert not (run.output_path / "ran").exists()


def test_a_key_the_credential_lacks_is_named_without_values(make_run: MakeRun) -> None:
    run = make_run(
        script="true\n",
        credentials=_creds(
            {"name": "hf", "env": {"HF_TOKEN": "tokn"}, "values": {"token": SECRET}}
        ),
    )
    assert execute(run) == 256
    text = log_text(run)
    assert "credential hf: no key 'tokn' for HF_TOKEN (its keys: token)" in text
    assert SECRET not in text


def test_a_symlink_the_task_left_is_not_followed(make_run: MakeRun, tmp_path: Path) -> None:
    """RESTART keeps the root: a link the task made there to a host folder must not lead
    the runner's write out of the root."""
    outside = tmp_path / "outside"
    outside.mkdir()
    run = make_run(
        script="true\n",
        credentials=_creds({"name": "c", "path": "/creds", "values": {"token": SECRET}}),
    )
    root = Path(run.sandbox.root or "")
    root.mkdir(parents=True)
    os.symlink(outside, root / "creds")
    assert execute(run) == 256
    assert list(outside.iterdir()) == []
    assert "symlink" in log_text(run)


def test_dotdot_stays_inside_the_root(make_run: MakeRun, tmp_path: Path) -> None:
    run = make_run(
        script="true\n",
        credentials=_creds({"name": "c", "path": "/../../../../c", "values": {"token": SECRET}}),
    )
    assert execute(run) == 0, log_text(run)
    assert not (tmp_path.parent / "c").exists() and not Path("/c").exists()


def test_values_leave_run_json_once_read(make_run: MakeRun) -> None:
    run = make_run(
        script="true\n",
        credentials=_creds(
            {"name": "hf", "env": {"HF_TOKEN": "token"}, "values": {"token": SECRET}}
        ),
        data_credentials=[
            {"endpoint": "s3://b", "access_key_id": "AKIDXX", "access_key": "dataSecret77"}
        ],
    )
    path = write_run_json(run)
    loaded = load_run(path)
    assert loaded.credentials[0].values == {"token": SECRET}
    assert loaded.data_credentials[0]["access_key"] == "dataSecret77"
    assert SECRET not in path.read_text() and "dataSecret77" not in path.read_text()
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert SECRET not in repr(loaded)


def test_runner_lines_mask_values(make_run: MakeRun) -> None:
    run = make_run(
        script="true\n",
        credentials=_creds(
            {"name": "hf", "env": {"HF_TOKEN": "token"}, "values": {"token": SECRET}}
        ),
        inputs=[
            {
                "kind": "url",
                "name": f"file:///nonexistent/{SECRET}",
                "source": f"file:///nonexistent/{SECRET}",
            }
        ],
    )
    execute(run)
    assert SECRET not in log_text(run)


def test_a_folder_the_sandbox_mounts_from_the_host_is_refused(
    make_run: MakeRun, tmp_path: Path
) -> None:
    """The path form writes inside the task's private root only: never into a volume mount
    (a host folder), whatever the spec says."""
    volume = tmp_path / "volume"
    volume.mkdir()
    root = tmp_path / "sandboxroot"
    run = make_run(
        script="true\n",
        credentials=_creds({"name": "c", "path": "/data/creds", "values": {"token": SECRET}}),
        sandbox={"mounts": {"/": str(root), "/data": str(volume)}, "command_prefix": ["false"]},
    )
    assert execute(run) == 256
    assert "credential folder /data/creds: not in the task's own root" in log_text(run)
    assert list(volume.iterdir()) == []


def test_scrub_takes_values_out_of_a_run_json_no_runner_read(make_run: MakeRun) -> None:
    """A backend whose attempt ended before its runner started (cancelled while pending)
    scrubs its run.json: the names stay, the values go; a second scrub changes nothing."""
    from trainyard.runfile import scrub_credentials

    run = make_run(
        script="true\n",
        credentials=_creds(
            {"name": "hf", "env": {"HF_TOKEN": "token"}, "values": {"token": SECRET}}
        ),
        data_credentials=[
            {"endpoint": "s3://b", "access_key_id": "AKIDXX", "access_key": "dataSecret77"}
        ],
    )
    path = write_run_json(run)
    assert scrub_credentials(path) is True
    text = path.read_text()
    assert SECRET not in text and "dataSecret77" not in text and '"hf"' in text
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert scrub_credentials(path) is False
    assert scrub_credentials(path.parent / "missing.json") is False
