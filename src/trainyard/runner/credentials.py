"""A task's credentials as OSMO hands them over (OSMO docs, "Secrets"):

- mapping form ``credentials: {NAME: {ENV_VAR: key}}``: each variable gets that key's value;
- path form ``credentials: {NAME: /some/dir}``: one file per key in that folder (mode 0600,
  the task's own), written inside the task's private root only, never through a symlink, and
  removed again when the attempt ends.

Pure helpers here; the runner (``runner.main``) calls them, writes and removes the files.
"""

from __future__ import annotations

import posixpath

from trainyard.runfile import RunCredential, TaskRun

__all__ = [
    "CredentialProblem",
    "credential_env",
    "credential_files",
    "secrets_of",
    "missing_message",
]


class CredentialProblem(Exception):
    """A credential the task names cannot be handed over; the message says why (no value)."""


def missing_message(name: str) -> str:
    """OSMO's words for a credential the submitter does not have."""
    return f"Could not find the credential: {name}"


def _values(cred: RunCredential) -> dict[str, str]:
    if cred.values is None:
        raise CredentialProblem(missing_message(cred.name))
    return cred.values


def credential_env(run: TaskRun) -> dict[str, str]:
    """The variables of every mapping-form credential: ``{ENV_VAR: value}``.

    Raises:
        CredentialProblem: a credential is missing, or has no key a variable names (the
            message lists the keys it has, never a value).
    """
    env: dict[str, str] = {}
    for cred in run.credentials:
        if cred.path is not None:
            continue
        values = _values(cred)
        for var, key in cred.env.items():
            if key not in values:
                raise CredentialProblem(
                    f"credential {cred.name}: no key {key!r} for {var} (its keys: "
                    f"{', '.join(sorted(values))})"
                )
            env[var] = values[key]
    return env


def credential_files(run: TaskRun) -> list[tuple[str, str, str]]:
    """``(credential name, absolute path inside the task, value)`` of every file of the
    path-form credentials, the folder normalised (``/a/../b`` is ``/b``).

    Raises:
        CredentialProblem: a credential is missing.
    """
    files = []
    for cred in run.credentials:
        if cred.path is None:
            continue
        folder = posixpath.normpath(cred.path)
        for key, value in sorted(_values(cred).items()):
            files.append((cred.name, f"{folder.rstrip('/')}/{key}", value))
    return files


def secrets_of(run: TaskRun) -> tuple[str, ...]:
    """Every credential value of ``run`` worth masking (4 characters or more), longest
    first (so that a value containing another is masked whole)."""
    found = {v for c in run.credentials for v in (c.values or {}).values() if len(v) >= 4}
    found |= {
        d[k]
        for d in run.data_credentials
        for k in ("access_key_id", "access_key")
        if len(d.get(k, "")) >= 4
    }
    return tuple(sorted(found, key=len, reverse=True))
