"""Writing files into an output folder without following the links already in it.

A results folder may come from someone else (a tarball), so any name in it may be a
symlink to a file the user can write. Every command that writes into a folder writes its
files into a temporary folder inside it and renames them over the old names at the end: a
rename replaces a link, it never writes through it. A subfolder (``plots/``) is swapped in
whole: what held its name (an earlier run's folder, or a link) is moved aside and removed
(a link is removed, never what it points to), so no file of an earlier run stays in it.
The output folder itself is the one name the user gave, and is used even if it is a link.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tokenyard.errors import ConfigError

__all__ = ["staged_output", "write_text"]


@contextlib.contextmanager
def staged_output(directory: str | os.PathLike[str]) -> Iterator[Path]:
    """Yields an empty folder to write into. When the block ends, each of its entries is
    renamed into ``directory`` (created if needed) over what has that name there; the
    entries appear together. When the block raises, nothing is moved, and ``directory`` is
    removed again if this call created it.

    Raises:
        ConfigError: ``directory`` exists and is not a folder (``field`` "output").
        OSError: a file or folder could not be written or renamed.
    """
    target = Path(directory)
    if target.exists() and not target.is_dir():
        raise ConfigError(
            f"--output {target}: exists and is not a directory",
            field="output",
            value=str(target),
        )
    created = not target.exists()
    target.mkdir(parents=True, exist_ok=True)
    # Inside the folder, not beside it: the renames stay on one file system even when the
    # folder is a link to another one.
    staging = Path(tempfile.mkdtemp(prefix=".tokenyard-", dir=target))
    done = False
    try:
        new, old = staging / "new", staging / "old"
        new.mkdir()
        old.mkdir()
        yield new
        for item in sorted(new.iterdir()):
            dest = target / item.name
            if item.is_dir() and os.path.lexists(dest):
                os.replace(dest, old / item.name)  # removed with the staging folder
            os.replace(item, dest)
        done = True
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if created and not done:
            with contextlib.suppress(OSError):
                target.rmdir()


def write_text(directory: str | os.PathLike[str], name: str, text: str) -> Path:
    """Writes ``directory/name`` as ``staged_output`` does (a link there is replaced).

    Raises:
        ConfigError: ``directory`` exists and is not a folder.
        OSError: the file could not be written.
    """
    with staged_output(directory) as staging:
        (staging / name).write_text(text)
    return Path(directory) / name
