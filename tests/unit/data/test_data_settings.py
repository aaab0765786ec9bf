"""Settings, credential scrubbing and retry classification."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from trainyard.data.config import load_config
from trainyard.data.retry import ChecksumMismatch, RetryPolicy, is_transient, with_retry
from trainyard.data.scrub import scrub, secret_values
from trainyard.errors import ConfigError


def test_defaults_put_datasets_under_the_home(home: Path) -> None:
    config = load_config(env={})
    assert config.dataset_url == (home / "datasets").as_uri()
    assert (config.s3_endpoint_url, config.retries, config.workers) == (None, 5, 8)


def test_environment_wins_over_the_settings_file(tmp_path: Path) -> None:
    path = tmp_path / "data.yaml"
    path.write_text(
        "dataset_url: s3://from-file/ds\nworkers: 2\nretries: 7\n"
        "storage_options: {s3: {region_name: eu-west-1}}\n"
    )
    config = load_config(
        env={
            "TRAINYARD_DATASET_URL": "s3://from-env/ds",
            "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:1",
        },
        path=path,
    )
    assert config.dataset_url == "s3://from-env/ds"
    assert (config.workers, config.retries) == (2, 7)
    assert config.s3_endpoint_url == "http://127.0.0.1:1"
    assert config.storage_options == {"s3": {"region_name": "eu-west-1"}}


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("workers: many\n", "workers"),
        ("retries: 0\n", "retries"),
        ("colour: blue\n", "colour"),
        ("- a list\n", "mapping"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "data.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        load_config(env={}, path=path)


def test_scrub_masks_userinfo_query_secrets_and_credential_values() -> None:
    text = (
        "https://bob:pw1234@host/x?X-Amz-Signature=abc123&part=1 failed; "
        "key AKIAEXAMPLEKEY; s3://bucket/a"
    )
    out = scrub(text, secrets=["AKIAEXAMPLEKEY"])
    assert "pw1234" not in out and "bob" not in out and "abc123" not in out
    assert "AKIAEXAMPLEKEY" not in out
    assert "https://***@host/x?X-Amz-Signature=***&part=1" in out and "s3://bucket/a" in out


def test_secret_values_come_from_env_and_storage_options() -> None:
    found = secret_values(
        {"AWS_SECRET_ACCESS_KEY": "envsecret", "HOME": "/root"},
        {"s3": {"secret": "optsecret", "region_name": "us-east-1"}},
    )
    assert set(found) == {"envsecret", "optsecret"}


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionResetError(),
        TimeoutError(),
        ChecksumMismatch("x"),
        OSError(errno.ECONNREFUSED, "refused"),
        OSError(errno.EIO, "SlowDown: reduce your rate"),
    ],
)
def test_transient_errors(exc: BaseException) -> None:
    assert is_transient(exc)


@pytest.mark.parametrize(
    "exc",
    [
        FileNotFoundError("x"),
        PermissionError("x"),
        FileExistsError("x"),
        ValueError("x"),
        OSError(errno.EIO, "AccessDenied"),
    ],
)
def test_permanent_errors(exc: BaseException) -> None:
    assert not is_transient(exc)


def test_with_retry_retries_transient_errors_with_backoff_and_logs() -> None:
    calls, lines = [], []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("reset by peer")
        return "ok"

    assert (
        with_retry(flaky, "f.txt", RetryPolicy(attempts=4, backoff_s=0.001), lines.append) == "ok"
    )
    assert len(calls) == 3 and len(lines) == 2
    assert "f.txt" in lines[0] and "attempt 1 of 4" in lines[0] and "reset by peer" in lines[0]


def test_with_retry_gives_up_at_once_on_a_permanent_error() -> None:
    calls: list[int] = []

    def missing() -> None:
        calls.append(1)
        raise FileNotFoundError("gone")

    with pytest.raises(FileNotFoundError):
        with_retry(missing, "f", RetryPolicy(attempts=5, backoff_s=0.001), lambda _l: None)
    assert calls == [1]


def test_backoff_doubles_and_is_capped() -> None:
    policy = RetryPolicy(attempts=10, backoff_s=0.5)
    assert [policy.delay_s(n) for n in (1, 2, 3)] == [0.5, 1.0, 2.0]
    assert policy.delay_s(20) == 30.0
