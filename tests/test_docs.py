"""The README and the pages under docs/ cannot rot: the quick start runs and fails as it
says, every Python snippet parses, every TOML snippet of `[tool.gpuprof]` loads through the
plugin's own checks, every YAML workflow parses, every option and `gpuprof` command they
name exists, and every file they link to is there."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

from pytest_gpuprof import cli
from pytest_gpuprof.harness import config
from pytest_gpuprof.settings.options import TABLE

ROOT = Path(__file__).resolve().parents[1]
# the user's pages; the log of what was measured is the record, not a page to copy from
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.stem != "performance-log")]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def fences(page: Path, kind: str) -> list[str]:
    return [body for lang, body in FENCE.findall(page.read_text()) if lang == kind]


def test_the_readme_is_short_and_starts_with_its_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    first = FENCE.search(text)
    assert first is not None and first.group(1) == "bash"
    commands = [line for line in first.group(2).splitlines() if line and not line.startswith("#")]
    assert commands == [
        "python3 -m pip install '.[hypothesis]' && python3 -m pytest examples --gpu-budget",
        "python3 -m pip install -e '.[test]' && python3 -m pytest -n auto",
    ]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "run_pytest examples --gpu-budget" in ci and "run_pytest -n auto" in ci


def quick_start() -> tuple[str, str, str, str]:
    """The README's quick start: its test module, its command, the exit code the command
    says, and the output it shows."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Quick start") : text.index("## Using it")]
    blocks = FENCE.findall(section)
    (_, module), (_, command), (_, shown) = blocks
    exits = re.search(r"# exits (\d)", command)
    assert exits is not None
    return module, command.split("#")[0].strip(), exits.group(1), shown


def test_the_quick_start_fails_as_the_readme_shows(pytester):
    module, command, exits, shown = quick_start()
    name = module.splitlines()[0].removeprefix("# ").strip()
    pytester.path.joinpath(name).write_text(module)
    args = command.split()
    assert args[:3] == ["python3", "-m", "pytest"]
    result = pytester.runpytest(*args[3:])
    assert int(result.ret) == int(exits)
    for line in shown.strip().splitlines():
        assert line in result.stdout.lines, line
    # and the fix the README names passes
    pytester.path.joinpath(name).write_text(module.replace('"single-lock"', '"two-lock"'))
    fixed = pytester.runpytest(*args[3:])
    assert fixed.ret == 0
    fixed.stdout.fnmatch_lines(["*test_pipeline*94.1%*ok"])


def snippets(kind: str) -> list[tuple[str, str]]:
    """Every ``kind`` snippet of the pages, as (its id, its text): a test a snippet, so that
    no case passes on a page that holds none."""
    return [(f"{page.name}-{i + 1}", body) for page in PAGES for i, body in enumerate(fences(page, kind))]


def _ids(found: list[tuple[str, str]]) -> list[str]:
    return [name for name, _ in found]


@pytest.mark.parametrize(("name", "body"), snippets("python"), ids=_ids(snippets("python")))
def test_every_python_snippet_parses(name, body):
    ast.parse(body, f"{name} snippet")


@pytest.mark.parametrize(("name", "body"), snippets("toml"), ids=_ids(snippets("toml")))
def test_every_toml_snippet_loads_through_the_plugins_checks(name, body, tmp_path):
    tomllib.loads(body)
    if "[tool.gpuprof" in body:
        path = tmp_path / "pyproject.toml"
        path.write_text(body)
        config.read_pyproject(path, config.FILE_KEYS)  # raises ConfigError naming the key


@pytest.mark.parametrize(("name", "body"), snippets("yaml"), ids=_ids(snippets("yaml")))
def test_every_yaml_snippet_parses(name, body):
    import yaml

    assert isinstance(yaml.safe_load(body), dict)


def test_the_pages_hold_snippets_of_each_kind_tested():
    """The parametrized tests above run: each kind is found somewhere."""
    assert all(snippets(kind) for kind in ("python", "toml", "yaml", "bash"))


def test_every_option_the_pages_name_exists():
    known = {o.flag for o in TABLE}
    for page in [*PAGES, ROOT / "docs" / "performance-log.md"]:
        named = set(re.findall(r"--gpu-[a-z]+(?:-[a-z]+)*", page.read_text()))
        assert named <= known, (page.name, sorted(named - known))


def test_every_gpuprof_command_the_pages_name_exists(capsys):
    commands = set(cli._parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    for page in PAGES:
        for found in re.findall(r"`gpuprof (\w+)", page.read_text()):
            assert found in commands, (page.name, found)
            with pytest.raises(SystemExit) as done:
                cli.main([found, "--help"])
            assert done.value.code == 0
    capsys.readouterr()


def links() -> list[tuple[Path, str]]:
    """Every link of the pages to a file of the repository."""
    found = [(page, t) for page in PAGES for t in re.findall(r"\]\(([^)#]+)\)", page.read_text())]
    return [(page, target) for page, target in found if "://" not in target]


@pytest.mark.parametrize(("page", "target"), links(), ids=[f"{p.name}:{t}" for p, t in links()])
def test_every_link_to_a_file_of_the_repository_is_there(page, target):
    assert (page.parent / target).exists(), (page.name, target)


def test_every_page_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    for page in (ROOT / "docs").glob("*.md"):
        assert f"(docs/{page.name})" in readme, page.name


# a project as a user has it: a utilization floor for every test (the README's configuration
# names one), the host backend's real clock where there is no GPU
PROJECT = "[tool.gpuprof.budget]\nmin_utilization = 0.6\n"
# the examples the pages introduce as failing: checked by their own tests
FAILING = ("test_first_budget.py",)


def _user_names(body: str) -> set[str]:
    """The names a snippet uses that neither Python, its imports, its definitions nor its
    functions' arguments give: the user's own code (``run_kernels``, ``batch``), which makes
    it a fragment, not a module to run."""
    import builtins

    tree = ast.parse(body)
    given = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            given |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            given.add(node.name)
        elif isinstance(node, ast.arg):
            given.add(node.arg)
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            given.add(node.id)
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return used - given


def examples() -> list[tuple[str, str]]:
    """Every snippet of the user's pages that is a test module to copy as it is: it defines
    a test and uses nothing of the user's own."""
    found = []
    for page in PAGES:
        for i, body in enumerate(fences(page, "python")):
            if "def test_" in body and not _user_names(body) and not body.startswith(tuple(f"# {f}" for f in FAILING)):
                found.append((f"{page.stem}-{i}", body))
    return found


def test_the_runnable_examples_are_found_and_the_fragments_name_the_users_code():
    """The split below cannot hide an example: the hypothesis page's is one to run, and the
    README's pipeline sketch is a fragment because it calls the user's ``run_kernels``."""
    assert "hypothesis-0" in dict(examples())
    readme = fences(ROOT / "README.md", "python")
    assert {"run_kernels", "upload", "batch"} <= _user_names(readme[1])


@pytest.mark.parametrize(("name", "body"), examples(), ids=[n for n, _ in examples()])
def test_every_example_passes_where_a_user_copies_it(pytester, name, body):
    """Copied as printed into a project with a project-wide utilization floor, run on the
    clock a user without a GPU has (the host backend's real clock)."""
    pytest.importorskip("hypothesis")
    pytester.makefile(".toml", pyproject=PROJECT)
    pytester.makepyfile(**{f"test_{name.replace('-', '_')}": body})
    result = pytester.runpytest("--gpu-budget", "--gpu-host-clock=real", "-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str()
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) >= 1 and not outcomes.get("skipped"), outcomes


def test_the_current_figures_are_a_page_and_each_names_its_date_and_command():
    """docs/performance.md answers "what does it cost, how accurate is it" in a page; the
    dated log is linked, not inlined."""
    text = (ROOT / "docs" / "performance.md").read_text()
    assert len(text.splitlines()) <= 250
    assert "(performance-log.md)" in text
    sections = text.split("\n## ")[1:]
    assert len(sections) >= 6
    for section in sections:
        title = section.splitlines()[0]
        assert re.search(r"20\d\d-\d\d-\d\d", section), f"{title}: no date"
        assert re.search(r"`(python3? |cd |tests/|/usr/bin/time)", section), f"{title}: no command"
