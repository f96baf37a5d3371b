"""The README's set-up is the truth: CI and the Dockerfile run the very same install and test commands."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _readme_setup_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    setup = readme.split("## Set up", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", setup, flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_readme_gives_install_serve_and_test_commands():
    commands = _readme_setup_commands()
    install, serve = commands[0], commands[1]
    assert install.startswith("python3 -m venv .venv && ")
    assert serve == ".venv/bin/structgen serve"
    assert commands[-1] == ".venv/bin/pytest"


def test_ci_runs_the_readme_install_and_test_commands():
    commands = _readme_setup_commands()
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert commands[0] in ci_lines
    assert commands[-1] in ci_lines


def test_dockerfile_installs_with_the_readme_command_and_serves():
    install = _readme_setup_commands()[0]
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f"RUN {install}\n" in dockerfile
    assert 'ENTRYPOINT ["/opt/structgen/.venv/bin/structgen", "serve"]' in dockerfile
    assert re.search(r"^USER (?!root)\w+", dockerfile, flags=re.M)
    assert "HEALTHCHECK" in dockerfile and "/health" in dockerfile
    assert re.search(r"^EXPOSE 8000$", dockerfile, flags=re.M)
    for package in ("service", "constrain", "engine", "schemas"):
        assert f"COPY {package} {package}" in dockerfile


def test_the_docker_build_context_leaves_out_the_venv_and_keeps_what_the_dockerfile_copies():
    """Without a .dockerignore, `docker build .` after the README's install sent its .venv (over 1 GB) and .git."""
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".venv", ".git"} <= ignored
    copied = [part for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("COPY ")
              for part in line.split()[1:-1]]
    assert copied and not set(copied) & ignored


def test_grammar_cache_defaults_to_the_user_cache_directory(monkeypatch, tmp_path):
    from service.config import ServerConfig

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert ServerConfig().grammar_cache_dir == tmp_path / "structgen"
    assert ServerConfig(cache_dir=tmp_path / "mine").grammar_cache_dir == tmp_path / "mine"
