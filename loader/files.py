"""Which files make up a model, and the rule every one meets before anything opens it.

A model is a safetensors file, a list of them, or a directory: the files its
``model.safetensors.index.json`` names in ``weight_map`` (subfolders included), else every
``*.safetensors`` in it. ``load``, ``fxkit load``, ``fxkit bench load`` and the vLLM plugin's file
list all go through :func:`model_files`. The rule, checked with one ``stat`` per file:

- A model file is a regular file. A directory, FIFO, socket or device named ``*.safetensors`` is
  refused at once: opening a FIFO waits for a writer forever, opening a device can have effects.
- Symlinks are followed wherever they point, but must end at a regular file. Hugging Face caches
  link ``snapshots/<revision>/*.safetensors`` to ``../../blobs/<hash>``, outside the model
  directory; where a directory's links point is up to whoever can write the directory. A dangling
  link or a loop is refused, naming the link. Files keep the names they were found under.
- Names in ``weight_map`` are data from the checkpoint: they must be relative paths that stay
  inside the model directory (``shards/part.safetensors``; never ``../x``, ``/etc/passwd`` or an
  empty name). A symlink met on the way is followed as above.
- Each file is loaded once: one file reached under two names (a repeated list entry, a symlink or
  a hard link to another shard) is refused, naming both.

Readers open files with :func:`open_regular`, which checks the opened file again without waiting,
so a file swapped for a FIFO after discovery cannot hang a load either.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .errors import LoaderError

INDEX_NAME = "model.safetensors.index.json"
ModelPath = str | os.PathLike | list[str | os.PathLike]

_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}
NOT_REGULAR_HINT = (
    "a model file must be a regular file (a symlink to one is fine): write the data to a file, "
    "or move this out of the model's files"
)


@dataclass(frozen=True)
class ModelFiles:
    """A model's files in load order; with an index, its path and each tensor's file."""

    files: list[Path]
    index: Path | None = None
    weight_map: dict[str, Path] | None = None

    def shown(self, file: Path) -> str:
        """``file`` as the index names it (relative to the index's directory)."""
        return str(file.relative_to(self.index.parent)) if self.index else str(file)


def _kind(path: Path, mode: int) -> str:
    """What ``path`` is, when it is not a regular file: "is a FIFO, not a regular file"."""
    kind = _KINDS.get(stat.S_IFMT(mode), "something else")
    if os.path.islink(path):
        kind = f"a symlink to {os.path.realpath(path)}, which is {kind}"
    return f"is {kind}, not a regular file"


def _stat_failed(path: Path, exc: OSError | ValueError, named_by: Path | None) -> tuple[str, str]:
    """What is wrong with ``path``, whose ``stat`` failed, and what to do."""
    if isinstance(exc, ValueError):  # os.stat refuses a NUL byte in a name
        return "has a NUL byte in its name", "check the path"
    code = exc.errno
    if code == errno.ELOOP:
        return f"is a symlink loop ({exc.strerror})", "point the link at the real file"
    if code in (errno.ENOENT, errno.ENOTDIR) and os.path.islink(path):
        return (
            f"is a dangling symlink (to {os.readlink(path)}, which does not exist)",
            "restore the file it points to (for a Hugging Face cache, download the model "
            "again), or remove the link",
        )
    if code in (errno.ENOENT, errno.ENOTDIR) and named_by is not None:
        return f"does not exist in {named_by.parent}", "add the file, or fix the index"
    if code in (errno.ENOENT, errno.ENOTDIR):
        return "no such file or directory", "check the path"
    return f"cannot be read: {exc.strerror or exc}", "check the file's permissions"


def _named(path: Path, named_by: Path) -> str:
    return repr(str(path.relative_to(named_by.parent)))


def check_file(path: Path, named_by: Path | None = None) -> os.stat_result:
    """The rule for one file, with one ``stat``: a regular file, or a symlink that ends at one.

    ``named_by`` is the index that names ``path``: errors then name the index first.
    """
    try:
        info = os.stat(path)
    except (OSError, ValueError) as exc:
        problem, hint = _stat_failed(path, exc, named_by)
    else:
        if stat.S_ISREG(info.st_mode):
            return info
        problem, hint = _kind(path, info.st_mode), NOT_REGULAR_HINT
    if named_by is None:
        raise LoaderError(f"{path}: {problem}", hint=hint)
    raise LoaderError(f"{named_by}: names {_named(path, named_by)}, which {problem}", hint=hint)


def open_regular(path: Path, flags: int = 0) -> int:
    """Open ``path`` read-only (with ``flags``) and return the descriptor, if it is a regular file.

    ``O_NONBLOCK`` makes the open of a FIFO return at once instead of waiting for a writer; it is
    cleared once ``fstat`` has shown a regular file (for which it means nothing). ``OSError`` from
    the open itself is left to the caller (O_DIRECT's EINVAL is a case for a fallback).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | flags)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise LoaderError(f"{path}: {_kind(path, mode)}", hint=NOT_REGULAR_HINT)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _once(files: list[Path], named_by: Path | None = None) -> list[Path]:
    """``files`` checked by the rule, each a different file (device and inode)."""
    seen: dict[tuple[int, int], Path] = {}
    for file in files:
        info = check_file(file, named_by)
        first = seen.setdefault((info.st_dev, info.st_ino), file)
        if first is not file:
            if named_by is None:
                what = f"{file}: is the same file as {first}"
            else:
                what = f"{named_by}: names {_named(file, named_by)}, which is the same file as "
                what += _named(first, named_by)
            raise LoaderError(
                f"{what} (each file is loaded once)",
                hint="name each file once: remove the repeated entry or the extra link",
            )
    return files


def _member(directory: Path, index: Path, name: str) -> Path:
    """The file an index's ``weight_map`` names: a relative path inside ``directory``."""
    pure = PurePosixPath(name)
    if not pure.parts or "\0" in name or pure.is_absolute() or ".." in pure.parts:
        raise LoaderError(
            f"{index}: file {name!r} must be a relative path inside {directory}",
            hint="weight_map names files relative to the index's directory, without '..': "
            "fix the index",
        )
    return directory.joinpath(*pure.parts)


def _read_index(index: Path) -> object:
    check_file(index)
    try:
        with open(open_regular(index), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise LoaderError(
            f"{index}: cannot read the index: {exc}", hint="fix or remove the index"
        ) from None


def _indexed(directory: Path, index: Path) -> ModelFiles:
    doc = _read_index(index)
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise LoaderError(
            f"{index}: weight_map must be an object of tensor names to file names",
            hint="fix the index",
        )
    if not weight_map:
        raise LoaderError(
            f"{index}: weight_map is empty: the index names no tensors",
            hint="fix the index, or remove it to load every *.safetensors",
        )
    files: dict[Path, Path] = {}  # one Path object per file, however often and however named
    paths = {}
    for name in dict.fromkeys(weight_map.values()):
        path = _member(directory, index, name)
        paths[name] = files.setdefault(path, path)
    return ModelFiles(
        _once(list(files), index), index, {t: paths[name] for t, name in weight_map.items()}
    )


def model_files(path: ModelPath) -> ModelFiles:
    """The files of a model (a file, a list of files, or a directory), checked by the rule."""
    if isinstance(path, (list, tuple)):
        if not path:
            raise LoaderError("no files given", hint="give a model directory or its files")
        return ModelFiles(_once([Path(p) for p in path]))
    path = Path(path)
    if not os.path.isdir(path):
        return ModelFiles(_once([path]))
    index = path / INDEX_NAME
    if os.path.lexists(index):  # an index that is a link, a FIFO... is checked, never skipped
        return _indexed(path, index)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise LoaderError(
            f"{path}: no *.safetensors files and no {INDEX_NAME}",
            hint="give the directory that holds the model's safetensors files",
        )
    return ModelFiles(_once(files))
