"""Revisions: everything that defines a deployment's instances, as one content-addressed id.

A serving role that keeps revisions (roles/vllm_lmcache) gives, from its variables alone, a
:class:`RevisionPlan`: the folder on the host that keeps the deployment's revision records, the
model's stage manifest (``fxkit stage``'s ``.fxkit-stage.json``) and the inputs: the venv's
pins, the model, the flags, the environment and the unit's text. The revision id is the sha256
of those inputs and of the model's digest read from the manifest (:func:`model_digest`): the
same inputs give the same id, on every host. The id reaches each instance as
``FXKIT_REVISION`` in its environment, so that an instance restarts when any input changes,
a change to the unit file alone included.

Each host keeps a record per revision (``<folder>/<id>.json``, 0600: environment values are
kept as digests only) and its last ``keep`` revisions; an older one is removed only when no
instance's environment file names it any more (:func:`prune_command`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from shlex import quote
from typing import Any

#: The environment variable that names an instance's revision.
ENV_VAR = "FXKIT_REVISION"
#: Where revision records live on a host: ``<this>/<deployment>/<id>.json``.
REVISIONS_DIR = "/var/lib/fxkit/revisions"
#: Characters of the sha256 an id keeps (48 bits: no collision among a host's few revisions).
ID_LENGTH = 12


@dataclass(frozen=True)
class RevisionPlan:
    """What a serving role says of its revisions, from its variables (no host touched)."""

    #: The folder on the host that keeps the deployment's revision records.
    folder: str
    #: The model's stage manifest on the host ("" when the model is not staged by fxkit).
    manifest: str
    #: Everything else that defines the instances (JSON values; ``env``'s values are recorded
    #: as digests only, as they may be secrets).
    inputs: Mapping[str, Any]
    #: How many revisions the host keeps (more while instances still use them).
    keep: int = 2
    #: Folders of environment files whose ``FXKIT_REVISION=`` lines name revisions in use.
    env_dirs: tuple[str, ...] = field(default_factory=tuple)


def model_digest(manifest: bytes | None) -> str:
    """The model's digest: a sha256 over its stage manifest's files (name, algorithm, digest),
    in name order; "" when there is no manifest or it cannot be read (the model is then known
    by its path only)."""
    if not manifest:
        return ""
    try:
        files = json.loads(manifest.decode()).get("files")
    except (ValueError, AttributeError):
        return ""
    if not isinstance(files, dict):
        return ""
    entries = []
    for name in sorted(files):
        record = files[name] if isinstance(files[name], dict) else {}
        algorithm = record.get("algorithm", "sha256")
        entries.append([name, algorithm, record.get("digest", record.get("sha256", ""))])
    blob = json.dumps(entries, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def revision_id(inputs: Mapping[str, Any], digest: str) -> str:
    """The revision of ``inputs`` with the model's ``digest``: ``r-`` and 12 hex digits."""
    blob = json.dumps({**inputs, "model_digest": digest}, sort_keys=True, separators=(",", ":"))
    return "r-" + hashlib.sha256(blob.encode()).hexdigest()[:ID_LENGTH]


def _masked(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """``inputs`` with each environment value replaced by its sha256 (it may be a secret)."""
    env = inputs.get("env", {})
    hidden = {
        k: "sha256:" + hashlib.sha256(str(v).encode()).hexdigest()[:16] for k, v in env.items()
    }
    return {**inputs, "env": hidden} if env else dict(inputs)


def record_json(revision: str, inputs: Mapping[str, Any], digest: str) -> str:
    """A revision's record as the host keeps it (its creation time is the file's mtime)."""
    body = {"revision": revision, "model_digest": digest, "inputs": _masked(inputs)}
    return json.dumps(body, sort_keys=True, indent=1) + "\n"


def write_command(folder: str, revision: str) -> str:
    """Writes the record on stdin as ``<folder>/<revision>.json`` (0600, whole)."""
    path = quote(f"{folder}/{revision}.json")
    made = f"(umask 077 && cat > {path}.tmp) && mv -f -- {path}.tmp {path}"
    return f"mkdir -p -- {quote(folder)} && {made}"


def prune_command(folder: str, keep: int, env_dirs: tuple[str, ...]) -> str:
    """Removes the records of ``folder`` beyond the newest ``keep`` (with their kept runs and
    prepared environment files), except those that an environment file in ``env_dirs`` still
    names; prints each removed id."""
    files = " ".join(f"{quote(d)}/*.env" for d in env_dirs)
    return (
        f"cd -- {quote(folder)} 2>/dev/null || exit 0; "
        f"used=$(cat -- {files} </dev/null 2>/dev/null | grep -E '^(export )?{ENV_VAR}=' "
        "| grep -o 'r-[0-9a-f]*'); "
        f"ls -t -- *.json 2>/dev/null | tail -n +{keep + 1} | while read -r f; do "
        'r=${f%.json}; case " $(echo $used) " in *" $r "*) ;; '
        '*) rm -rf -- "$f" "$r.run" "$r.env" && echo "$r";; '
        "esac; done"
    )


@dataclass(frozen=True)
class Kept:
    """A revision record as a host keeps it."""

    revision: str
    created: float  # the host's clock: when the record was written
    inputs: Mapping[str, Any]
    #: The host keeps runs of it (instances ran it): ``fxkit rollout undo`` can return to it.
    runs: bool = False


def list_command(folder: str) -> str:
    """Prints every record of ``folder``, newest first: its mtime, whether runs of it are kept
    (1 or 0), its JSON on one line; tab-separated."""
    return (
        f"cd -- {quote(folder)} 2>/dev/null || exit 0; for f in $(ls -t -- *.json 2>/dev/null); "
        'do r=${f%.json}; printf \'%s\\t%s\\t\' "$(stat -c %Y -- "$f")" '
        '"$(ls -A -- "$r.run" 2>/dev/null | grep -c .)"; tr -d \'\\n\' < "$f"; echo; done'
    )


def parse_list(text: str) -> list[Kept]:
    """:func:`list_command`'s output; lines that are not records are skipped."""
    kept = []
    for line in text.splitlines():
        stamp, _, rest = line.partition("\t")
        runs, _, raw = rest.partition("\t")
        try:
            body = json.loads(raw)
            kept.append(Kept(body["revision"], float(stamp), body.get("inputs", {}), runs != "0"))
        except (ValueError, KeyError, TypeError):
            continue
    return kept


def running_command(pid: int) -> str:
    """Prints the ``FXKIT_REVISION`` of process ``pid``'s environment (nothing: none)."""
    return f"tr '\\0' '\\n' < /proc/{int(pid)}/environ 2>/dev/null | sed -n 's/^{ENV_VAR}=//p'"
