"""Numba's on-disk cache of numawb's compiled functions: the whole mechanism in one module.

Imported before any ``@njit(cache=True)`` function of the engine is defined (``kernels`` imports it
first), it changes four things in Numba's cache, for every cached function of the process:

1. **A key that is the same in every process.**  Numba keys a cached closure by pickling its closure
   cells; a cell holding another jitted function pickles with a per-process random id, so every
   start missed the cache and recompiled every kernel made by a factory (seconds each, and a new
   entry per run).  Here closure cells are described by what they are -- a jitted function by its
   module, name, bytecode and own cells, a constant by its repr -- the same in every process and
   different between factory instances.
2. **A key that covers every file a function depends on.**  Numba's own check is the source file of
   the function itself, so editing a helper module (the intrinsics, the IR helpers they are built
   with, a block-format helper, a family module whose inline functions a kernel calls) left stale
   machine code in the cache.  Here the key includes the content hash of every ``workbench`` source
   file reachable from the function: its own, and those of the functions, dispatchers, intrinsics
   and modules it names or closes over, transitively.
3. **A cache that works on a read-only install.**  Where the package folder cannot be written,
   Numba tries ``~/.cache/numba`` and otherwise refuses to define the function ("cannot cache
   function ...: no locator available"), which killed every command.  Here the cache falls back to
   ``$XDG_CACHE_HOME/numawb/numba`` (``~/.cache`` when unset), then to a folder in the temporary
   directory, then to compiling without a disk cache; one line on stderr says which.
4. **Symbol names unique across processes.**  Numba names a compiled function
   by its module, qualified name, argument types and a per-process counter; cached code keeps the
   name of the process that compiled it.  Two closures of one factory (same qualified name and
   argument types) compiled by two processes with the same compile history -- the compile helper
   beside the engine, two runs -- got the same symbol, and a process loading both had its JIT
   linker resolve one's calls to the other's code (numba/numba#10486): a later model's experts ran
   another type's product, a crew ran another build's stubs.  Here that counter starts at a random
   offset in every process (and again after a fork), so a symbol names one compilation.
5. **A cache that does not grow without bound.**  Numba never deletes a data file: code for a source
   that changed, for a dependency that changed (the key above), for an old release left in the
   package folder by an upgrade, stays on disk (a development tree had gathered 930 MB, a third of
   it unloadable, most of the rest superseded).  Here a save deletes the data files of the index it
   replaces when that index was for another version of the source (nothing can load them), drops
   entries whose data file is gone, and, at most once a day per folder, deletes the data files no
   process has loaded or written for ``MAX_AGE_DAYS`` (a load refreshes a file's time, at most
   daily) and the indexes left pointing at nothing.  A deleted file is a cache miss: a recompile.
"""
from __future__ import annotations

import hashlib
import itertools
import os
import pickle
import secrets
import sys
import tempfile
import time
import types as pytypes

from numba.core import caching
from numba.core.bytecode import FunctionIdentity
from numba.core.dispatcher import Dispatcher
from numba.core.extending import _Intrinsic

from . import llama_build  # its WIDE is a compile-time constant of the float orders: part of the key

#: The options of every compiled function of the engine. ``error_model="numpy"``: float division
#: by zero gives inf or nan as in C (ggml's semantics) instead of raising, so loops with a division
#: (SiLU's x / (1 + e^-x), the quantizers' scales) have no exit branch and vectorize: SwiGLU of 8 x
#: 768 went from 21.7 to 4.3 us, bit-identical.
JIT = dict(nogil=True, cache=True, error_model="numpy")

#: LLVM's optimization level for the process's compiles (Numba's NUMBA_OPT, default 3) unless the
#: user set one. The kernels spell out their vector instructions, so -O3's extra passes bought
#: nothing measurable and cost a quarter of the compile time (benchmarks/HISTORY.md, "LLVM -O2").
#: Numba re-reads NUMBA_* variables before each compile, and the compile helper inherits the
#: environment.
DEFAULT_OPT = "2"
os.environ.setdefault("NUMBA_OPT", DEFAULT_OPT)

#: only the project's own modules are followed and hashed (NumPy or Numba change with their version,
#: which Numba's magic tuple and the index's version stamp already cover)
_PROJECT = "workbench"


# ----------------------------------------------------------------------------- 1. stable closure description
def describe(value: object) -> str:
    """Process-independent digest of a function: its name, bytecode, constants and, recursively,
    the values of its closure cells (jitted functions by their code, constants by their repr)."""
    h = hashlib.sha256()

    def walk(x: object, depth: int) -> None:
        if depth > 16:
            h.update(b"...")
            return
        if isinstance(x, Dispatcher):
            x = x.py_func
        if isinstance(x, pytypes.FunctionType):
            c = x.__code__
            h.update(f"fn:{x.__module__}.{x.__qualname__}:".encode())
            h.update(c.co_code)
            h.update(repr(c.co_consts).encode())
            for cell in x.__closure__ or ():
                walk(cell.cell_contents, depth + 1)
        elif isinstance(x, (tuple, list)):
            h.update(b"(")
            for y in x:
                walk(y, depth + 1)
            h.update(b")")
        else:
            h.update(f"{type(x).__qualname__}:{x!r};".encode())

    walk(value, 0)
    return h.hexdigest()


# ----------------------------------------------------------------------------- 2. files a function depends on
def _project_file(module_name: str | None) -> str | None:
    if not module_name or not (module_name == _PROJECT or module_name.startswith(_PROJECT + ".")):
        return None
    mod = sys.modules.get(module_name)
    f = getattr(mod, "__file__", None)
    return os.path.abspath(f) if f else None


def _codes(code: pytypes.CodeType):
    yield code
    for c in code.co_consts:
        if isinstance(c, pytypes.CodeType):
            yield from _codes(c)


def dependency_files(func: pytypes.FunctionType) -> list[str]:
    """Sorted paths of the project source files ``func`` depends on: its own module's and, transitively,
    those of every function, dispatcher, intrinsic (its code generator's too) or module it names as a
    global or holds in a cell, and the modules of the project objects it names."""
    files: set[str] = set()
    seen: set[int] = set()

    def value(v: object) -> None:
        if isinstance(v, Dispatcher):
            function(v.py_func)
        elif isinstance(v, pytypes.FunctionType):
            function(v)
        elif isinstance(v, _Intrinsic):
            if isinstance(v._defn, pytypes.FunctionType):
                function(v._defn)  # its module, and the IR helpers (`llvm_ir`) its code generator names
        elif isinstance(v, pytypes.ModuleType):
            f = _project_file(v.__name__)
            if f:
                files.add(f)
        elif isinstance(v, (tuple, list)):
            for y in v:
                value(y)
        else:  # an object of a project class (`llvm_ir.ll`, a `VecType`): the class's module
            f = _project_file(type(v).__module__)
            if f:
                files.add(f)

    def function(fn: pytypes.FunctionType) -> None:
        if id(fn) in seen:
            return
        seen.add(id(fn))
        f = _project_file(fn.__module__)
        if f is None:
            return  # NumPy, Numba, the standard library: not followed
        files.add(f)
        g = fn.__globals__
        for code in _codes(fn.__code__):
            for name in code.co_names:
                if name in g:
                    value(g[name])
        for cell in fn.__closure__ or ():
            try:
                value(cell.cell_contents)
            except ValueError:  # empty cell
                pass

    function(func)
    return sorted(files)


def dependency_digest(func: pytypes.FunctionType) -> str:
    """sha256 over the names and contents of ``dependency_files(func)``."""
    h = hashlib.sha256()
    for path in dependency_files(func):
        st = os.stat(path)
        h.update(os.path.basename(path).encode())
        h.update(caching._hash_source_file(path, st.st_mtime, st.st_size))
    return h.hexdigest()


def _index_key(self, sig, codegen):
    func = self._py_func
    return (sig, codegen.magic_tuple(),
            (hashlib.sha256(func.__code__.co_code).hexdigest(), describe(func), dependency_digest(func)),
            _FORMAT, ("llama-simd", 512 if llama_build.WIDE else 256))


# Numba numbers a function's data files 1, 2, ... in the order specialisations are added, reading
# and rewriting the index around each save. Two processes adding different specialisations of one
# function at the same time (the compile helper beside the engine, two test runs in one tree) can
# take the same number, and an index entry then points at the other one's code. Here a data file is
# named by a digest of its key and written before the index that points to it, so a race only loses
# an index entry (a cache miss), never pairs a key with foreign code.
#
# _FORMAT in the key retires entries written the old ways: numbered data files, and code whose
# symbols came from Numba's plain per-process counter (which can clash with another process's, 4.)
_FORMAT = ("digest-named", "process-unique-symbols")


def _save(self, key, data) -> None:
    # the pattern numbers with {number:d}: a 60-bit integer from the digest
    name = self._data_name(int(hashlib.sha256(repr(key).encode()).hexdigest()[:15], 16))
    self._save_data(name, data)
    for path in [self._index_path] + _siblings(self._cache_path, self._index_name):
        on_disk = read_index(path)    # (the function at another line: indexes for other sources too)
        if on_disk is not None and on_disk[:2] != (self._version, self._source_stamp):
            _remove(self._data_path(n) for n in on_disk[2].values() if n != name)   # nothing can load them
            if path != self._index_path:
                _remove([path])
    overloads = {k: n for k, n in self._load_index().items() if os.path.exists(self._data_path(n))}
    overloads[key] = name
    self._save_index(overloads)
    prune_folder(self._cache_path)


# ----------------------------------------------------------------------------- 5. a bounded cache
#: a data file no process loaded or wrote for this long is deleted (the next compile into its folder)
MAX_AGE_DAYS = 14
_DAY = 86400.0
_PRUNE_MARK = ".numawb-pruned"   # a folder's last sweep: this file's time
_swept: set[str] = set()


def read_index(path: str):
    """(numba version, source stamp, {key: data file name}) of an index file, None if unreadable."""
    try:
        with open(path, "rb") as f:
            version = pickle.load(f)
            stamp, overloads = pickle.loads(f.read())
    except Exception:
        return None
    return version, stamp, overloads


def _siblings(folder: str, index_name: str) -> list[str]:
    """The other indexes of the function an index is for: the same module and qualified name at
    other lines (``mod.qual-LINE.pyXY.nbi``); some may be another function of that name in the
    current source, so only those for another source are removed."""
    head, _, tail = index_name[:-len(".nbi")].rpartition("-")
    suffix = tail.partition(".")[2] + ".nbi"
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return [os.path.join(folder, n) for n in names
            if n != index_name and n.startswith(head + "-") and n.endswith("." + suffix)
            and n[len(head) + 1:-len(suffix) - 1].isdigit()]


def _remove(paths) -> None:
    for p in paths:
        try:
            os.remove(p)
        except OSError:
            pass


def _load(self, key):
    """Numba's load, and the data file's time refreshed when it is a day old (what keeps a file
    in use from being pruned as unused)."""
    name = self._load_index().get(key)
    if name is None:
        return None
    path = self._data_path(name)
    try:
        data = self._load_data(name)
    except OSError:
        return None
    try:
        if time.time() - os.stat(path).st_mtime > _DAY:
            os.utime(path)
    except OSError:
        pass   # a cache this process cannot write: it ages, and is pruned by whoever can
    return data


def prune_folder(folder: str, now: float | None = None, force: bool = False) -> int:
    """Delete the data files in `folder` untouched for MAX_AGE_DAYS and the indexes left with no
    data file; at most once a day per folder (`force`: now). Returns the number of files deleted."""
    if folder in _swept and not force:
        return 0
    _swept.add(folder)
    now = time.time() if now is None else now
    mark = os.path.join(folder, _PRUNE_MARK)
    try:
        if not force and now - os.stat(mark).st_mtime < _DAY:
            return 0
    except OSError:
        pass
    try:
        with open(mark, "w"):
            pass
        names = os.listdir(folder)
    except OSError:
        return 0
    old = []
    for n in names:
        if n.endswith(".nbc"):
            try:
                if now - os.stat(os.path.join(folder, n)).st_mtime > MAX_AGE_DAYS * _DAY:
                    old.append(os.path.join(folder, n))
            except OSError:
                pass
    if not old:
        return 0
    _remove(old)
    gone = len(old)
    for n in names:       # indexes left pointing at nothing (read only after a deletion)
        if n.endswith(".nbi"):
            path = os.path.join(folder, n)
            idx = read_index(path)
            if idx is not None and not any(os.path.exists(os.path.join(folder, d)) for d in idx[2].values()):
                _remove([path])
                gone += 1
    return gone


# ----------------------------------------------------------------------------- 3. a writable place, or none
_said: set[str] = set()


def _say(key: str, line: str) -> None:
    """One line on stderr, once per process."""
    if not _said:
        print(f"numawb: {line}", file=sys.stderr, flush=True)
    _said.add(key)


def user_cache_root() -> str:
    """$XDG_CACHE_HOME/numawb/numba (XDG's default ~/.cache when the variable is unset or relative)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "numawb", "numba")


def temp_cache_root() -> str:
    """A per-user folder in the temporary directory."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return os.path.join(tempfile.gettempdir(), f"numawb-{uid}", "numba")


class _FallbackLocator(caching._SourceFileBackedLocatorMixin, caching._CacheLocator):
    """Caches next to a root folder of ours when the package's own __pycache__ is not writable."""

    where = "?"

    def __init__(self, py_func, py_file):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        self._cache_path = os.path.join(self.root(), self.get_suitable_cache_subpath(py_file))

    @staticmethod
    def root() -> str:
        raise NotImplementedError

    def get_cache_path(self) -> str:
        return self._cache_path

    @classmethod
    def from_function(cls, py_func, py_file):
        self = super().from_function(py_func, py_file)  # None unless the folder can be made and written
        if self is not None:
            _say("fallback", f"the package folder is not writable; compiled kernels are cached in "
                             f"{self.root()} ({cls.where})")
        return self


class UserCacheLocator(_FallbackLocator):
    where = "$XDG_CACHE_HOME"
    root = staticmethod(user_cache_root)


class TempCacheLocator(_FallbackLocator):
    where = "temporary folder"
    root = staticmethod(temp_cache_root)


def _enable_caching(self) -> None:
    try:
        self._cache = caching.FunctionCache(self.py_func)
    except RuntimeError as e:
        if "no locator available" not in str(e):
            raise
        _say("none", "no writable cache folder (package, $XDG_CACHE_HOME, temporary); "
                     "kernels are compiled at every start")
        self._cache = caching.NullCache()


# ----------------------------------------------------------------------------- 4. process-unique symbols
class ProcessUniqueIds:
    """Replaces Numba's ``FunctionIdentity._unique_ids`` counter (its only use is ``next()``): the
    uid that goes into every compiled function's symbol (an ABI tag ``v<uid>``) and its environment's.

    Why: cached machine code keeps the symbols of the process that compiled it, and the JIT links
    by symbol name, so a symbol must name one compilation in every process that may load it, not
    only in its own.  Counting on from a random 62-bit start per process keeps the uids distinct
    inside a process (like Numba's counter) and, between processes, apart unless two starts fall
    within one process's compile count of each other (about n / 2**61); a forked child, which
    inherits the counter, draws a new start."""

    def __init__(self) -> None:
        self._pid = -1
        self._count = itertools.count()

    def __iter__(self) -> "ProcessUniqueIds":
        return self

    def __next__(self) -> int:
        if self._pid != os.getpid():
            self._count = itertools.count(secrets.randbits(62) + 1)
            self._pid = os.getpid()
        return next(self._count)


def install() -> None:
    """Put the five changes into Numba (idempotent)."""
    if not isinstance(FunctionIdentity._unique_ids, ProcessUniqueIds):
        FunctionIdentity._unique_ids = ProcessUniqueIds()
    caching.Cache._index_key = _index_key
    caching.IndexDataCacheFile.save = _save
    caching.IndexDataCacheFile.load = _load
    classes = caching.CacheImpl._locator_classes
    if UserCacheLocator not in classes:
        at = classes.index(caching.InTreeCacheLocator) + 1 if caching.InTreeCacheLocator in classes else len(classes)
        classes[at:at] = [UserCacheLocator, TempCacheLocator]
    Dispatcher.enable_caching = _enable_caching


install()
