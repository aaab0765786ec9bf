"""The data layer against a real S3 API (moto's server on loopback): URLs, datasets,
concurrent writers, exclusive creates, failures midway, retries, credentials kept out."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from data_support import make_tree, run_after_puts, tree

from trainyard.data import DatasetStore, Mover, download, list_url, load_config, storage, upload
from trainyard.data.testing import MotoS3, TcpProxy
from trainyard.data.transfer import plan_uploads
from trainyard.errors import DataError

pytestmark = pytest.mark.usefixtures("s3_env")

SECRET = "s3cr3t-Value-For-Scrubbing"


def _mover_via(proxy: TcpProxy, lines: list[str]) -> Mover:
    config = load_config(env={**_environ(), "TRAINYARD_S3_ENDPOINT_URL": proxy.url})
    return Mover(config, lines.append)


def _environ() -> dict[str, str]:
    import os

    return dict(os.environ)


def test_url_upload_list_and_download_with_regex(
    tmp_path: Path, prefix: str, moto_s3: MotoS3
) -> None:
    src = make_tree(tmp_path / "src", {"a.txt": "a", "b.json": "b", "sub/c.txt": "c"})
    url = f"s3://my-bucket/{prefix}/data"
    assert upload(url, [f"{src}/"], r"\.txt$").files == 2
    assert moto_s3.keys("my-bucket", prefix) == [f"{prefix}/data/a.txt", f"{prefix}/data/sub/c.txt"]
    assert [f.rel for f in list_url(url + "/")] == ["a.txt", "sub/c.txt"]
    assert download(url + "/", tmp_path / "out", r"^sub/") == 1
    assert tree(tmp_path / "out") == {"sub/c.txt": "c"}


def test_dataset_versions_tags_and_checked_downloads_on_s3(
    tmp_path: Path, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINYARD_DATASET_URL", f"s3://my-bucket/{prefix}/datasets")
    store = DatasetStore()
    one = make_tree(tmp_path / "one", {"x.txt": "1"})
    two = make_tree(tmp_path / "two", {"x.txt": "2", "y/z.txt": "z"})
    assert store.upload("ds", plan_uploads([f"{one}/"], None), tag="first").version == 1
    assert store.upload("ds", plan_uploads([f"{two}/"], None)).version == 2
    info = store.info("ds")
    assert info.tags == {"first": 1, "latest": 2}
    store.download("ds:first", tmp_path / "d1")
    store.download("ds", tmp_path / "d2", path="y")
    assert tree(tmp_path / "d1") == {"x.txt": "1"} and tree(tmp_path / "d2") == {"z.txt": "z"}
    assert store.delete("ds", "1") == [1]
    assert store.upload("ds", plan_uploads([f"{one}/"], None)).version == 3  # 1 is never reused


def test_conditional_create_is_exclusive_on_s3(prefix: str) -> None:
    loc = Mover().location(f"s3://my-bucket/{prefix}")
    path = loc.join("claim.json")
    assert storage.create_exclusive(loc, path, b"first") is True
    assert storage.create_exclusive(loc, path, b"second") is False
    assert storage.read_bytes(loc, path) == b"first"


def test_concurrent_writers_get_distinct_complete_versions(
    tmp_path: Path, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINYARD_DATASET_URL", f"s3://my-bucket/{prefix}/datasets")
    trees = {
        w: make_tree(tmp_path / w, {f"{w}-{i}.txt": f"{w}{i}" for i in range(6)})
        for w in ("alpha", "beta", "gamma")
    }
    barrier = threading.Barrier(len(trees))
    errors: list[BaseException] = []

    def write(name: str) -> None:
        try:
            barrier.wait()
            DatasetStore().upload("shared", plan_uploads([f"{trees[name]}/"], None))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in trees]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    versions = DatasetStore().versions("shared")
    assert [v.version for v in versions] == [1, 2, 3]
    owners = sorted(",".join(sorted({f.path.split("-")[0] for f in v.files})) for v in versions)
    assert owners == ["alpha", "beta", "gamma"]  # each version is one writer's ...
    assert all(len(v.files) == 6 for v in versions)  # ... and whole


def test_upload_that_fails_midway_raises_and_leaves_no_version(
    tmp_path: Path, prefix: str, proxy: TcpProxy, moto_s3: MotoS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    lines: list[str] = []
    store_url = f"s3://my-bucket/{prefix}/datasets"
    store = DatasetStore(store_url, _mover_via(proxy, lines))
    src = make_tree(tmp_path / "src", {f"f{i:02}.bin": "x" * 1000 for i in range(20)})
    run_after_puts(monkeypatch, 3, proxy.stop)  # the server goes away after 3 files
    with pytest.raises(DataError) as caught:
        store.upload("big", plan_uploads([f"{src}/"], None))
    message = str(caught.value)
    assert "f" in message and ".bin" in message and "failed" in message  # names file and cause
    assert "Error" in message
    assert any("transient error" in line for line in lines)  # retried, and logged
    assert SECRET not in message and not any(SECRET in line for line in lines)
    assert DatasetStore(store_url).versions("big") == []
    assert [k for k in moto_s3.keys("my-bucket", prefix) if "/versions/" in k] == []


def test_a_file_that_vanishes_mid_upload_fails_it_naming_the_file(
    tmp_path: Path, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINYARD_DATA_WORKERS", "1")
    src = make_tree(tmp_path / "src", {f"f{i}.txt": str(i) for i in range(5)})
    monkeypatch.setenv("TRAINYARD_DATASET_URL", f"s3://my-bucket/{prefix}/datasets")
    store = DatasetStore()
    files = plan_uploads([f"{src}/"], None)
    run_after_puts(monkeypatch, 2, lambda: (src / "f3.txt").unlink())
    with pytest.raises(DataError, match=r"f3\.txt.*FileNotFoundError"):
        store.upload("vanish", files)
    assert store.versions("vanish") == []


def test_transient_errors_are_retried_and_logged(
    tmp_path: Path, prefix: str, proxy: TcpProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines: list[str] = []
    monkeypatch.setenv("TRAINYARD_DATA_RETRIES", "6")
    monkeypatch.setenv("TRAINYARD_DATA_RETRY_BACKOFF_S", "0.1")  # waits 0.1+0.2+0.4+0.8 s
    mover = _mover_via(proxy, lines)
    src = make_tree(tmp_path / "src", {f"f{i}.txt": str(i) for i in range(6)})

    def drop_connections() -> None:  # the server is unreachable for 0.4 s
        proxy.refuse_for(0.4)
        proxy.cut()

    run_after_puts(monkeypatch, 1, drop_connections)
    stats = upload(f"s3://my-bucket/{prefix}/retry", [f"{src}/"], None, mover)
    assert stats.files == 6
    assert proxy.refused >= 1
    assert any("transient error" in line and "retrying" in line for line in lines), lines


def test_s3_checkpoint_rounds_read_back_whole(tmp_path: Path, prefix: str) -> None:
    from trainyard.data.checkpoints import CheckpointWriter

    url = f"s3://my-bucket/{prefix}/ckpt"
    src = make_tree(tmp_path / "ckpt", {"model.pt": "v1", "opt.pt": "o1", "log.txt": "l"})
    writer, state = CheckpointWriter(url, Mover()), {}
    assert writer.upload_round(src, r"\.pt$", state) == 2
    (src / "model.pt").write_text("v2-longer")
    assert writer.upload_round(src, r"\.pt$", state) == 1
    assert download(url, tmp_path / "back") == 2
    assert tree(tmp_path / "back") == {"model.pt": "v2-longer", "opt.pt": "o1"}
