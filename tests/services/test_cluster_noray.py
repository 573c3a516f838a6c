"""Without Ray installed, every command works and --ray says in one line how to install it
(Ray is hidden from a child process; runs whether or not Ray is installed here)."""
from __future__ import annotations

import subprocess
import sys

HIDE_RAY = "import sys; sys.modules['ray'] = None; from workbench.cli import main; sys.exit(main(sys.argv[1:]))"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", HIDE_RAY, *args], capture_output=True, text=True, timeout=300)


def test_ray_option_without_ray_says_how_to_install():
    for cmd in (["generate", "-p", "hi"], ["placement"], ["bench", "-p", "8", "-n", "0"], ["serve"], []):
        p = run(*cmd, "--ray", "127.0.0.1:6379")
        assert p.returncode == 2, p.stderr
        lines = p.stderr.strip().splitlines()
        assert lines == ["numawb: error: --ray needs Ray: pip install -e '.[cluster]' (or pip install 'ray>=2.40')"]


def test_other_commands_work_without_ray():
    p = run("topo", "--root", "epyc-2socket")
    assert p.returncode == 0, p.stderr
    assert "node 1" in p.stdout
    for cmd in ("generate", "serve"):
        p = run(cmd, "--help")
        assert p.returncode == 0 and "--ray ADDRESS" in p.stdout
