"""The docs site (mkdocs.yml, docs/) and the README, held to the code.

- Every shell block (```bash, sh, shell, console) of README.md and docs/ is run by a test or says why not:
  an HTML comment on the lines right above its fence, `<!-- docs-test: skip: REASON -->` (it needs a
  cluster, AWS, the Hub, GPUs), or `<!-- docs-test: first-hour: ... -->` for the README's two blocks, which
  tests/test_first_hour.py types in a fresh clone. Every other block runs here (slow lane: each fsdpctl
  command that loads the settings takes 2-4 s on 2 busy cores, the trainer's block trains): the blocks of one
  page one after another in bash (`-e -o pipefail`, as a reader pasting them would see a failure), in a
  fresh directory holding `.env.example`, with an FSDPCTL_HOME of its own, the venv's bin first on PATH and
  the settings' defaults (the tiny model, BACKEND=local). A block that fails is a failing test.
- The two generated references (scripts/docs_reference.py, a MkDocs hook) hold every setting key of the
  settings model and every command and option of the typer app: fast, from the generator; slow, from the
  site `mkdocs build --strict` builds (MkDocs 1.6's validation: a broken link or anchor is a warning, which
  strict mode makes an error; mkdocs/structure/pages.py, `_RelativePathTreeprocessor`).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

SHELL = {"bash", "sh", "shell", "console"}
MARK = re.compile(r"<!-- docs-test: (skip|first-hour): (\S.*?) -->")
VENV_BIN = Path(sys.executable).parent


@dataclasses.dataclass(frozen=True)
class Block:
    page: str  # relative to the repository
    line: int  # of the opening fence
    text: str
    kind: str  # "run", "skip" or "first-hour"
    reason: str


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def shell_blocks(page: Path, root: Path = ROOT) -> list[Block]:
    """The page's fenced shell blocks, each with the docs-test mark of the comment lines just above
    (`root`: the checkout the page is in)."""
    lines, found, i = page.read_text().splitlines(), [], 0
    while i < len(lines):
        fence = re.match(r"^(`{3,})\s*([\w-]*)", lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith(fence.group(1)))
        if fence.group(2) in SHELL:
            above, k = [], i - 1
            while k >= 0 and lines[k].startswith("<!--"):
                above.append(lines[k])
                k -= 1
            marks = [m for line in above if (m := MARK.match(line))]
            kind, reason = (marks[0].group(1), marks[0].group(2)) if marks else ("run", "")
            text = "\n".join(lines[i + 1 : end]) + "\n"
            found.append(Block(str(page.relative_to(root)), i + 1, text, kind, reason))
        i = end + 1
    return found


ALL_BLOCKS = [b for p in pages() for b in shell_blocks(p)]
RUN_PAGES = sorted({b.page for b in ALL_BLOCKS if b.kind == "run"})


def test_every_shell_block_runs_or_says_why_not():
    """Each block is run here, or marked with its reason; the README's two (the install and the first
    job) are the first-hour test's; a docs-test comment that names no kind it knows is an error, not a
    silent pass; and every block is bash as written (`bash -n`)."""
    readme = [b for b in ALL_BLOCKS if b.page == "README.md"]
    assert [b.kind for b in readme] == ["first-hour", "first-hour"], readme
    assert "make quickstart" in readme[0].text and "make test" in readme[0].text
    assert all(b.kind != "first-hour" for b in ALL_BLOCKS if b.page != "README.md")
    assert {b.kind for b in ALL_BLOCKS} <= {"run", "skip", "first-hour"}
    assert len(RUN_PAGES) >= 4, RUN_PAGES  # settings, manifests, plan, slurm, doctor, the trainer
    for page in pages():
        for n, line in enumerate(page.read_text().splitlines(), 1):
            if "docs-test:" in line:
                assert MARK.match(line.strip()), f"{page.relative_to(ROOT)}:{n}: {line}"
    for b in ALL_BLOCKS:
        p = subprocess.run(["bash", "-n"], input=b.text, capture_output=True, text=True)
        assert p.returncode == 0, f"{b.page}:{b.line}: {p.stderr}"


def _reference():
    """scripts/docs_reference.py, the generator the site's build runs."""
    spec = importlib.util.spec_from_file_location(
        "docs_reference", ROOT / "scripts" / "docs_reference.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _options(cmd, ctx) -> list[str]:
    """Every option string a command shows in --help (hidden ones left out, as --help leaves them)."""
    return [
        opt
        for p in cmd.get_params(ctx)
        if p.get_help_record(ctx) and p.param_type_name == "option"
        for opt in (*p.opts, *p.secondary_opts)
    ]


def test_the_generated_references_name_every_setting_and_command():
    """From the generator: a section per setting key fsdpctl reads (fsdpctl.settings.setting_keys), with
    its type, default and backends; a section per visible command with its usage line and every option
    --help shows; and where a place refuses a key (Slurm's refusals), that place is not among its
    backends."""
    from fsdpctl.settings import setting_keys

    ref = _reference()
    settings = ref.settings_markdown()
    for key in setting_keys():
        section = settings.split(f"\n### {key}\n", 1)
        assert len(section) == 2, key
        body = section[1].split("\n### ", 1)[0]
        assert "| type |" in body and "| default |" in body and "| backends |" in body, key
    for row in ref.infrastructure_rows():
        for place in ref.refused_on(row["key"]):
            assert place not in row["backends"].split(", "), row
    assert ref.refused_on("NODE_SELECTOR") == ["slurm"]  # one known refusal, so the probe is alive

    cli = ref.cli_markdown()
    for path, cmd, ctx in ref.commands():
        name = " ".join(("fsdpctl", *path))
        body = cli.split(f" {name} {{ #{ref._anchor(path)} }}\n", 1)
        assert len(body) == 2, name
        section = body[1].split("\n#", 1)[0]
        assert cmd.get_usage(ctx) in section, name
        for opt in _options(cmd, ctx):
            assert opt in section, (name, opt)


@pytest.mark.slow
def test_the_site_builds_strictly_with_every_setting_and_command(tmp_path):
    """`mkdocs build --strict` (what `make docs` and `make lint` run) succeeds, and the built pages
    hold every setting key's section and every command's, with each option."""
    from fsdpctl.settings import setting_keys

    site = tmp_path / "site"
    p = subprocess.run(
        [str(VENV_BIN / "mkdocs"), "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    settings = (site / "reference" / "settings.html").read_text()
    for key in setting_keys():
        assert f'id="{key.lower()}"' in settings, key
    cli = (site / "reference" / "cli.html").read_text()
    ref = _reference()
    for path, cmd, ctx in ref.commands():
        assert f'id="{ref._anchor(path)}"' in cli, path
        for opt in _options(cmd, ctx):
            assert opt in cli, (path, opt)
    for page in (ROOT / "docs").rglob("*.md"):
        built = site / page.relative_to(ROOT / "docs").with_suffix(".html")
        assert built.exists(), page
        # an include is the included text on the site, and an invisible comment where the markdown
        # is read as it is (GitHub): no raw `--8<--` line either way
        assert "--8<--" not in page.read_text() and "--8&lt;--" not in built.read_text(), page
        assert "include: " not in built.read_text() and "github-only" not in built.read_text(), page
    assert "make quickstart" in (site / "getting-started.html").read_text()
    # opened from the disk (`open site/index.html`, no web server): every link between pages names a
    # file that is there, never a folder (a browser shows a folder's listing)
    for html in site.rglob("*.html"):
        if html.name == "404.html":  # served by a web server for any path: it links from the root
            continue
        for href in re.findall(r'href="([^"#:?]+)(?:#[^"]*)?"', html.read_text()):
            target = (html.parent / href).resolve()
            if href.endswith((".css", ".js", ".png", ".svg", ".ico", ".xml", ".json")):
                continue
            assert target.is_file(), (html.relative_to(site), href)


def _reader_env(root: Path) -> dict[str, str]:
    """A reader's shell: no fsdpctl setting or FSDPCTL_ variable of this machine, an FSDPCTL_HOME of
    its own, the venv first on PATH, no cluster reachable."""
    from fsdpctl.settings import setting_keys

    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("FSDPCTL_") and k not in setting_keys()
    }
    env.update(
        FSDPCTL_HOME=str(root / "home"),
        XDG_STATE_HOME=str(root / "state"),
        KUBECONFIG=str(root / "no-kubeconfig"),
        PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
        COLUMNS="100",
        NO_COLOR="1",
    )
    return env


@pytest.mark.slow
@pytest.mark.parametrize("page", RUN_PAGES)
def test_the_docs_shell_blocks_run(page, tmp_path):
    """The page's runnable blocks, in order, as a reader pastes them into a shell in a fresh
    directory (the settings' defaults: the tiny model on this machine)."""
    shutil.copy(ROOT / ".env.example", tmp_path / ".env.example")
    env = _reader_env(tmp_path)
    for b in (b for b in ALL_BLOCKS if b.page == page and b.kind == "run"):
        p = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", b.text],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            stdin=subprocess.DEVNULL,
            timeout=600,
        )
        assert p.returncode == 0, (
            f"{b.page}:{b.line} exit {p.returncode}\n{b.text}\n{p.stdout}\n{p.stderr}"
        )
        assert "Traceback" not in p.stderr, f"{b.page}:{b.line}\n{p.stderr}"


# what a code block shows whole in the docs site at a 1280-pixel-wide window (mkdocs-material's content
# column, its code font): a longer line scrolls, and its comment is what is cut off
CODE_COLUMNS = 88


def test_the_readme_blocks_the_docs_include_fit_the_site_column():
    """The README's first screen and walkthrough are included in the docs' getting-started page; their
    explanations are trailing comments, which a 1280-pixel window cut off (issue 44)."""
    long = [
        line
        for block in shell_blocks(ROOT / "README.md", ROOT)[:2]
        for line in block.text.splitlines()
        if len(line) > CODE_COLUMNS
    ]
    assert long == [], long
