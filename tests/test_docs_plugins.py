"""docs/plugins.md runs as written: its example files are the tested fixtures, its Python
blocks run, its `schedlab plugins --check` lines pass."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from schedlab import registry

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "plugins.md"
EXAMPLES = ROOT / "tests" / "fixtures" / "plugin_examples"
BLOCK = re.compile(r"(?:<!-- (?P<tag>run|file: (?P<path>\S+)) -->\n)?```(?P<lang>\w*)\n"
                   r"(?P<body>.*?)```", re.S)


def blocks(tag: str | None = None, lang: str | None = None) -> list[re.Match]:
    out = [m for m in BLOCK.finditer(DOC.read_text())]
    if tag is not None:
        out = [m for m in out if (m["tag"] or "").startswith(tag)]
    if lang is not None:
        out = [m for m in out if m["lang"] == lang]
    return out


@pytest.fixture
def in_examples(monkeypatch):
    monkeypatch.chdir(EXAMPLES)
    monkeypatch.syspath_prepend(str(EXAMPLES))
    yield
    registry.load.cache_clear()


def test_the_page_shows_each_example_file_exactly():
    shown = {m["path"]: m["body"] for m in blocks("file")}
    assert set(shown) == {f"tests/fixtures/plugin_examples/{n}.py"
                          for n in ("decode_first", "lpf_queue", "lfu_cache", "shortest_queue",
                                    "spf_queue")}
    for path, body in shown.items():
        assert body == (ROOT / path).read_text(), f"docs/plugins.md's copy of {path} is stale"


@pytest.mark.parametrize("i", range(len(blocks("run"))))
def test_python_blocks_run(i, in_examples):
    code = blocks("run")[i]["body"]
    exec(compile(code, f"docs/plugins.md[run {i}]", "exec"), {"__name__": "__docs__"})


def test_plugins_check_lines_pass(in_examples, capsys):
    from schedlab.cli import main

    lines = [ln.split("#")[0].strip() for m in blocks(lang="bash")
             for ln in m["body"].splitlines()]
    checks = [shlex.split(ln) for ln in lines if ln.startswith("schedlab plugins --check ")]
    assert len(checks) == 3
    for argv in checks:
        assert main(argv[1:]) == 0, capsys.readouterr().out


def test_the_readme_links_the_page():
    assert "docs/plugins.md" in (ROOT / "README.md").read_text()
