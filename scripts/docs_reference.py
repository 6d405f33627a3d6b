"""The two generated pages of the docs site, made at every `mkdocs build` from the code itself so they
cannot drift: the settings reference from the settings model (`fsdpctl.settings.Settings` and the
trainer's `fsdptrain.config.TrainConfig`) and the CLI reference from the typer app (`fsdpctl.cli.app`
as click sees it, `typer.main.get_command`: every command, its usage, help with the example, and each
option as `--help` prints it).

mkdocs.yml names this file under `hooks:`; MkDocs calls `on_files` with the site's files and the two
pages are added as generated files (`File.generated`, MkDocs 1.6: mkdocs/structure/files.py).
tests/test_docs.py calls `settings_markdown` and `cli_markdown` and checks that the built site holds
every key and every command.
"""

from __future__ import annotations

import dataclasses
import html
import re
import typing
from typing import Any

SETTINGS_PAGE = "reference/settings.md"
CLI_PAGE = "reference/cli.md"

# the groups the settings model declares (`_k(..., group, ...)`), in .env.example's order and words
GROUP_TITLES = {
    "aws": "AWS",
    "cluster": "Cluster (EKS)",
    "image": "Container image",
    "job": "Job",
    "secrets": "Secrets",
}


# --- text -----------------------------------------------------------------------------------------


def _md(text: str) -> str:
    """Plain help text as Markdown that shows it as written: `<job>` is no HTML tag, `*` and `_`
    no emphasis, `|` no table cell; backticked spans stay code."""
    out = []
    for i, part in enumerate(re.split(r"(`[^`]*`)", text)):
        if i % 2:  # a code span: Markdown shows it literally already (a | still ends a table cell)
            out.append(part.replace("|", "\\|"))
        else:
            part = html.escape(part, quote=False)
            out.append(re.sub(r"([*_|\[\]])", r"\\\1", part))
    return "".join(out)


def _code(text: str, *, cell: bool = True) -> str:
    """A value as an inline code span (empty: a word that says so); in a table cell a `|` is
    escaped, which Python-Markdown's tables take out again."""
    if text == "":
        return "*(empty)*"
    tick = "``" if "`" in text else "`"
    span = f"{tick}{text}{tick}"
    return span.replace("|", "\\|") if cell else span


# --- settings -------------------------------------------------------------------------------------


def _type_of(annotation: Any) -> tuple[str, tuple[str, ...]]:
    """(type name, choices) of a settings field's annotation."""
    if typing.get_origin(annotation) is typing.Literal:
        return "choice", tuple(str(a) for a in typing.get_args(annotation))
    name = getattr(annotation, "__name__", str(annotation))
    return {"SecretStr": "secret", "str": "text"}.get(name, name), ()


def _bounds(field: Any) -> str:
    """What the field's declaration bounds a value to: range, pattern."""
    parts = []
    for m in field.metadata:
        for attr, word in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            if getattr(m, attr, None) is not None:
                parts.append(f"{word} {getattr(m, attr)}")
        if getattr(m, "pattern", None):
            parts.append(f"matches `{m.pattern}`")
    return ", ".join(parts)


def _probe_value(value: Any, choices: tuple[str, ...]) -> Any:
    """Some value other than `value` (the default), of its kind, to ask a place whether it minds."""
    if isinstance(value, bool):
        return not value
    if choices:
        return next(c for c in choices if c != value)
    if isinstance(value, int | float):
        return value + 1
    return f"{value}x" if isinstance(value, str) else value


def refused_on(key: str) -> list[str]:
    """The places (fsdpctl.targets) whose `refusals` refuse this infrastructure key when set away
    from its default: asked of each place's own refusals with only that key changed, so the answer is
    what `config validate` and `job run` say there."""
    from fsdpctl.settings import Config, Settings
    from fsdpctl.targets import TARGETS, resolve
    from fsdptrain.config import TrainConfig

    field = Settings.model_fields[key.lower()]
    _, choices = _type_of(field.annotation)
    defaults = {name: f.default for name, f in Settings.model_fields.items()}
    changed = defaults | {key.lower(): _probe_value(field.default, choices)}
    places = []
    for name, target in TARGETS.items():
        if not target.refusals:
            continue
        cfg = Config.of(Settings.model_construct(**changed), TrainConfig())
        if any(line.startswith(f"{key}=") for line in resolve(target.refusals)(cfg)):
            places.append(name)
    return places


def infrastructure_rows() -> list[dict[str, str]]:
    """One row per infrastructure key of the settings model, in its declared order."""
    from fsdpctl.settings import DERIVED_KEYS, SHARED_ENV, Settings
    from fsdpctl.targets import NAMES

    rows = []
    for name, field in Settings.model_fields.items():
        key = name.upper()
        kind, choices = _type_of(field.annotation)
        default = field.default
        if kind == "secret":
            shown = ""
        elif isinstance(default, bool):
            shown = str(default).lower()
        else:
            shown = str(default)
        refused = refused_on(key) if kind != "secret" else []
        description = field.description or ""
        # a description that starts by naming one place ("Slurm: ...", "local backend: ...") is read
        # only there
        only = [n for n in NAMES if re.match(rf"{n}( backend)?:", description, re.I)]
        rows.append(
            {
                "key": key,
                "group": (field.json_schema_extra or {}).get("group", ""),  # type: ignore[union-attr]
                "type": kind,
                "values": ", ".join(choices) if choices else _bounds(field),
                "default": shown,
                "derived": "yes" if key in DERIVED_KEYS else "",
                "backends": ", ".join(only or [n for n in NAMES if n not in refused]),
                "env": f"FSDPCTL_{key}" + (f" or {key}" if key in SHARED_ENV else ""),
                "description": description,
            }
        )
    return rows


def training_rows() -> list[dict[str, str]]:
    """One row per training key: the trainer's own (fsdptrain.config.TrainConfig), which every
    place passes to the trainer as it is."""
    from fsdpctl.settings import TRAIN_KEYS_DERIVED
    from fsdpctl.targets import NAMES
    from fsdptrain.config import MODEL_DEFAULTS, TrainConfig

    rows = []
    for f in dataclasses.fields(TrainConfig):
        if f.name in TRAIN_KEYS_DERIVED:
            continue
        meta = f.metadata
        bounds = [f">= {meta['min']}"] if meta["min"] is not None else []
        bounds += [f"<= {meta['max']}"] if meta.get("max") is not None else []
        per_model = [
            f"{model}: {getattr(d, f.name)}"
            for model, d in MODEL_DEFAULTS.items()
            if hasattr(d, f.name)
        ]
        default = str(f.default).lower() if isinstance(f.default, bool) else str(f.default)
        rows.append(
            {
                "key": meta["env"],
                "group": "training",
                "type": f.type if isinstance(f.type, str) else f.type.__name__,
                "values": ", ".join(meta["choices"]) if meta["choices"] else ", ".join(bounds),
                "default": default,
                "per_model": "; ".join(per_model),
                "backends": ", ".join(NAMES),
                "env": f"FSDPCTL_{meta['env']}",
                "description": meta["help"],
            }
        )
    return rows


def _setting_section(row: dict[str, str]) -> str:
    lines = [f"### {row['key']}", "", _md(row["description"]), ""]
    facts = [
        ("type", row["type"]),
        ("values", _md(row["values"]) if row["values"] else ""),
        ("default", _code(row["default"])),
        ("per model", _md(row.get("per_model", ""))),
        ("derived when unset", "from the job (see the description)" if row.get("derived") else ""),
        ("backends", row["backends"]),
        ("environment", _code(row["env"])),
    ]
    lines += ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in facts if v]
    return "\n".join(lines) + "\n"


def settings_markdown() -> str:
    """The settings reference: every key, its type, default, description and the backends that
    take it."""
    infra, train = infrastructure_rows(), training_rows()
    out = [
        "# Settings reference",
        "",
        "Generated at every docs build from the settings model (`src/fsdpctl/settings/model.py`) and "
        "the trainer's settings (`trainer/fsdptrain/config.py`): every key fsdpctl reads, "
        f"{len(infra) + len(train)} in all. `.env` and `--set` take the key as written; the "
        "environment takes it as `FSDPCTL_<KEY>` (see [Settings](../settings.md)). **backends** are "
        "the places (`BACKEND`) that take a key: the one place its description starts with "
        "(`Slurm:`, `local backend:`), else every place but those where `config validate` and `job "
        "run` refuse it once it is set away from its default. Keys a place takes but has no use "
        "for (the cluster's on this machine) are ignored there.",
        "",
        "| key | group | default | backends |",
        "|---|---|---|---|",
    ]
    for row in infra + train:
        out.append(
            f"| [{row['key']}](#{row['key'].lower()}) | {row['group']} | {_code(row['default'])} "
            f"| {row['backends']} |"
        )
    out.append("")
    for group, title in GROUP_TITLES.items():
        out += [f"## {title}", ""]
        out += [_setting_section(r) for r in infra if r["group"] == group]
    others = sorted({r["group"] for r in infra} - set(GROUP_TITLES))
    for group in others:  # a group declared later: listed all the same
        out += [f"## {group}", ""]
        out += [_setting_section(r) for r in infra if r["group"] == group]
    out += [
        "## Training",
        "",
        "The trainer's own keys (`python -m fsdptrain --help`): the pods, the Slurm tasks and the "
        "local launchers get them as environment variables of these names. `MODEL=7b`, `13b` and "
        "`70b` bring their own defaults for the keys that list one per model, unless you set them "
        "(see [Defaults per model](../settings.md#defaults-per-model)).",
        "",
    ]
    out += [_setting_section(r) for r in train]
    return "\n".join(out)


# --- CLI ------------------------------------------------------------------------------------------


def commands() -> list[tuple[tuple[str, ...], Any, Any]]:
    """(path, click command, click context) of every visible command of the app, groups first,
    depth first in the order the app lists them."""
    import click
    import typer.main

    from fsdpctl.cli import app

    root = typer.main.get_command(app)
    found: list[tuple[tuple[str, ...], Any, Any]] = []

    def walk(cmd: Any, path: tuple[str, ...], parent: Any) -> None:
        ctx = click.Context(cmd, info_name=path[-1] if path else "fsdpctl", parent=parent)
        found.append((path, cmd, ctx))
        subs = getattr(cmd, "commands", None) or {}
        for name, sub in subs.items():
            if not sub.hidden:
                walk(sub, (*path, name), ctx)

    walk(root, (), None)
    return found


def _help_markdown(text: str) -> list[str]:
    """A command's help as paragraphs; its `Example:` lines as code, copied as they are."""
    out = []
    for para in text.strip().split("\n\n"):
        joined = " ".join(line.strip() for line in para.splitlines())
        if joined.startswith("Example"):
            head, _, rest = joined.partition(":")
            example, _, why = rest.strip().partition("   ")
            tail = f" {_md(why.strip())}" if why.strip() else ""
            out += [f"**{head}:** {_code(example.strip(), cell=False)}{tail}", ""]
        else:
            out += [_md(joined), ""]
    return out


def cli_markdown() -> str:
    """The CLI reference: every command with its usage, help, example and options."""
    out = [
        "# CLI reference",
        "",
        "Generated at every docs build from the typer app (`src/fsdpctl/cli/`), as `--help` prints it: "
        "every command, its usage, what it does with an example, and each option with its default. "
        "`--set KEY=VALUE` (or `-s`) and `--env-file` are the root's and may stand anywhere on the "
        "line (see [Settings](../settings.md)).",
        "",
    ]
    listing = [p for p, _, _ in commands() if p]
    out += [f"- [`fsdpctl {' '.join(p)}`](#{_anchor(p)})" for p in listing] + [""]
    for path, cmd, ctx in commands():
        name = " ".join(("fsdpctl", *path))
        level = "#" * min(2 + max(len(path) - 1, 0), 4)
        out += [f"{level} {name} {{ #{_anchor(path)} }}", ""]
        out += ["```text", cmd.get_usage(ctx), "```", ""]
        out += _help_markdown(cmd.help or "")
        subs = getattr(cmd, "commands", None)
        if subs:
            rows = [(n, s.get_short_help_str(limit=200)) for n, s in subs.items() if not s.hidden]
            out += ["| command | what it does |", "|---|---|"]
            out += [f"| [`{n}`](#{_anchor((*path, n))}) | {_md(short)} |" for n, short in rows] + [
                ""
            ]
        records = [r for p in cmd.get_params(ctx) if (r := p.get_help_record(ctx))]
        if records:
            out += ["| option | what it does |", "|---|---|"]
            out += [f"| {_code(opts)} | {_md(what)} |" for opts, what in records] + [""]
    return "\n".join(out)


def _anchor(path: tuple[str, ...]) -> str:
    return "-".join(("fsdpctl", *path))


# --- MkDocs ---------------------------------------------------------------------------------------


def on_files(files: Any, config: Any) -> Any:
    """MkDocs hook: add the two generated pages to the site's files."""
    from mkdocs.structure.files import File

    for path, text in ((SETTINGS_PAGE, settings_markdown()), (CLI_PAGE, cli_markdown())):
        files.append(File.generated(config, path, content=text))
    return files


# A page that shows a part of another file writes `<!-- include: FILE:SECTION -->`: invisible where the
# markdown itself is read (GitHub showed the raw `--8<--` line), and on the site the snippet of that
# section (pymdownx.snippets, which runs after this hook). The line after a `<!-- github-only -->` line
# is for those readers alone (a link to the file itself, outside the site) and is left out of the site.
INCLUDE = re.compile(r"^<!-- include: (\S+) -->$", re.M)
GITHUB_ONLY = re.compile(r"^<!-- github-only -->\n.*\n", re.M)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """MkDocs hook: the site's form of a page's includes (see INCLUDE)."""
    return GITHUB_ONLY.sub("", INCLUDE.sub(lambda m: f'--8<-- "{m.group(1)}"', markdown))
