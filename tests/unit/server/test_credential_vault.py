"""The credential vault (issue 25): OSMO's types and keys, encrypted at rest with the
home's key (0600), per user, values never listed."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from trainyard.errors import ConfigError, NotFoundError, StoreError
from trainyard.store import Store
from trainyard.store.credentials import KEY_FILE, CredentialVault

SECRET = "hf_aVerySecretValue123"


@pytest.fixture
def vault(tmp_path: Path) -> CredentialVault:
    return CredentialVault(Store(f"sqlite:///{tmp_path / 'db.sqlite'}"), tmp_path)


def test_stored_encrypted_with_a_0600_key(vault: CredentialVault, tmp_path: Path) -> None:
    vault.set("ann", "hf", "GENERIC", {"token": SECRET})
    assert (tmp_path / KEY_FILE).stat().st_mode & 0o777 == 0o600
    raw = b"".join(p.read_bytes() for p in tmp_path.glob("db.sqlite*"))
    assert SECRET.encode() not in raw
    rows = (
        sqlite3.connect(tmp_path / "db.sqlite").execute("select token from credentials").fetchall()
    )
    assert SECRET not in str(rows)
    assert vault.payloads("ann", ["hf"]) == {"hf": ("GENERIC", {"token": SECRET})}


def test_per_user_and_list_shows_no_value(vault: CredentialVault) -> None:
    vault.set("ann", "hf", "GENERIC", {"token": SECRET})
    listed = vault.list_for_user("ann")
    assert [(r["name"], r["type"], r["keys"]) for r in listed] == [("hf", "GENERIC", ["token"])]
    assert SECRET not in str(listed)
    assert vault.list_for_user("bob") == []
    with pytest.raises(NotFoundError, match="^Could not find the credential: hf$"):
        vault.check_names("bob", ["hf"])
    assert vault.payloads("bob", ["hf"]) == {}


def test_set_replaces_and_delete_removes(vault: CredentialVault) -> None:
    vault.set("ann", "hf", "GENERIC", {"token": "one1"})
    vault.set("ann", "hf", "GENERIC", {"token": "two2"})
    assert vault.payloads("ann", ["hf"])["hf"][1] == {"token": "two2"}
    vault.delete("ann", "hf")
    with pytest.raises(NotFoundError, match="Could not find the credential: hf"):
        vault.delete("ann", "hf")


@pytest.mark.parametrize(
    ("kind", "payload", "message"),
    [
        ("REGISTRY", {"registry": "nvcr.io"}, "needs payload key(s) auth"),
        ("DATA", {"access_key_id": "a", "access_key": "b"}, "needs payload key(s) endpoint"),
        (
            "DATA",
            {"access_key_id": "a", "access_key": "b", "endpoint": "s3://x", "colour": "red"},
            "takes no payload key(s) colour",
        ),
        ("SECRET", {"a": "b"}, "one of REGISTRY, DATA, GENERIC"),
        ("GENERIC", {}, "at least one KEY=VALUE"),
        ("GENERIC", {"..": "x"}, "payload key '..'"),  # a key names a file of the path form
        ("GENERIC", {"a/b": "x"}, "payload key 'a/b'"),
    ],
)
def test_osmo_types_and_keys(
    vault: CredentialVault, kind: str, payload: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        vault.set("ann", "c", kind, payload)


def test_data_gets_osmos_default_region(vault: CredentialVault) -> None:
    got = vault.set(
        "ann", "s3", "DATA", {"access_key_id": "a", "access_key": "bbbb", "endpoint": "s3://bucket"}
    )
    assert got["keys"] == ["access_key", "access_key_id", "endpoint", "region"]
    assert vault.payloads("ann", ["s3"])["s3"][1]["region"] == "us-east-1"


def test_a_replaced_key_is_said_not_guessed(vault: CredentialVault, tmp_path: Path) -> None:
    vault.set("ann", "hf", "GENERIC", {"token": SECRET})
    (tmp_path / KEY_FILE).unlink()
    fresh = CredentialVault(vault.store, tmp_path)
    with pytest.raises(StoreError, match="cannot be decrypted"):
        fresh.payloads("ann", ["hf"])
