"""What every command shares: the loaded config, the consoles (messages to stderr, results to
stdout) and the -o json/yaml output."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any, cast

import typer
from rich.console import Console
from rich.markup import escape
from rich.segment import Segment
from typer.core import TyperGroup

from fsdpctl.cli import completion, streams
from fsdpctl.cli.options import DRY_RUN_SPELLINGS as DRY_RUN_SPELLINGS
from fsdpctl.cli.options import SERVER_DRY_RUN_FLAG as SERVER_DRY_RUN_FLAG
from fsdpctl.cli.options import DryRunOpt as DryRunOpt
from fsdpctl.cli.options import ForceOpt as ForceOpt
from fsdpctl.cli.options import ServerDryRunOpt as ServerDryRunOpt
from fsdpctl.cli.options import dry_run_mode as dry_run_mode
from fsdpctl.cli.options import finite as finite
from fsdpctl.cli.streams import escape_controls
from fsdpctl.errors import BadInput, SettingsError
from fsdpctl.redact import add_secrets, redact, redact_obj
from fsdpctl.targets import NAMES

if TYPE_CHECKING:
    from collections.abc import Mapping

    from fsdpctl.backends import Backend
    from fsdpctl.settings import Config, Dotenv


class _MaskingConsole(Console):
    """A console that masks secrets (fsdpctl.redact) in everything it writes: strings before rich
    wraps them (so a token is never split across lines out of the mask's reach), and the rendered
    text again (tables, panels, anything built from parts). Control characters in the text (an
    escape sequence in a value) are shown escaped, never sent raw (streams.escape_controls): in
    strings before layout, and in every rendered segment but rich's own cursor controls. It writes
    through fsdpctl.cli.streams, where a stream that cannot take the text is met."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        super().print(
            *(escape_controls(redact(o)) if isinstance(o, str) else o for o in objects), **kwargs
        )

    def _render_buffer(self, buffer: Any) -> str:
        shown = (s if s.control else Segment(escape_controls(s.text), s.style) for s in buffer)
        return redact(super()._render_buffer(shown))

    def _check_buffer(self) -> None:
        try:
            super()._check_buffer()
        except streams.OutputLost:
            del self._buffer[:]  # never written, and never to be written by a later print
            raise


err = _MaskingConsole(file=cast(IO[str], streams.Sink("stderr")), highlight=False)


out = _MaskingConsole(file=cast(IO[str], streams.Sink("stdout")), highlight=False, soft_wrap=True)


# Off a terminal rich would wrap at 80 columns (or COLUMNS) and fit tables to that: an error, a path
# or an id would break over lines that grep and log readers cannot join, or be cut with an ellipsis.
# There nothing wraps and a table takes the width its cells need; on a terminal rich fits the
# terminal.
OFF_TERMINAL_WIDTH = 100_000


def _unwrapped_off_a_terminal(console: Console) -> None:
    if not console.is_terminal:
        console.soft_wrap = True
        console.size = (OFF_TERMINAL_WIDTH, console.height)


_unwrapped_off_a_terminal(err)


_unwrapped_off_a_terminal(out)


class Output(str, Enum):
    table = "table"
    json = "json"
    yaml = "yaml"


class ViewOutput(str, Enum):
    """-o of the views of jobs (`job list`, `job status`): kubectl's `wide` (more columns) and
    `name` (one job name per line, what the job verbs take) besides Output's."""

    table = "table"
    wide = "wide"
    name = "name"
    json = "json"
    yaml = "yaml"


def command_group(help: str) -> typer.Typer:
    """A group of subcommands (`fsdpctl job ...`): bare `fsdpctl job` shows its help; plain-text
    help; options of a subcommand that exclude each other (EXCLUSIVE) refused before it runs."""
    return typer.Typer(cls=_SubGroup, no_args_is_help=True, rich_markup_mode=None, help=help)


# Options of one subcommand that contradict each other: at most one of each group may be given. `job
# logs --all --node 0` would show one node's log or all of them; which is a guess (kubectl refuses
# a pod name with --selector, or --all-containers with -c, the same way: one line, exit 2).
EXCLUSIVE: dict[tuple[str, str], tuple[tuple[str, ...], ...]] = {
    ("job", "logs"): (("--all", "--node", "--pod"),),
}


def first_sentence(text: str) -> str:
    """A command's line in its group's help: the first sentence of its help, whole (click cut it at
    45 characters with "...")."""
    words = text.split("\n\n", 1)[0].split()
    for i, word in enumerate(words):
        if word.endswith(".") and not word.endswith("..."):
            return " ".join(words[: i + 1])
    return " ".join(words)


class WholeHelp(TyperGroup):
    """A group whose help lists its commands in the order a user meets them (`ORDER`, then the
    order they were added), each with its first sentence whole; aliases (hidden commands) are not
    listed."""

    ORDER: tuple[str, ...] = ()

    def short_help_of(self, name: str) -> str | None:
        """A command's line known without building the command (the root's lazy commands); None:
        ask the command."""
        return None

    def list_commands(self, ctx: Any) -> list[str]:
        names = list(self.commands)
        ranked = {n: i for i, n in enumerate(self.ORDER)}
        return sorted(names, key=lambda n: (ranked.get(n, len(ranked)), names.index(n)))

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = []
        for name in self.list_commands(ctx):
            if (known := self.short_help_of(name)) is not None:
                rows.append((name, known))
                continue
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, first_sentence(cmd.help or cmd.short_help or "")))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


class _SubGroup(WholeHelp):
    """A subcommand group that refuses EXCLUSIVE options given together, from the words of the
    command line (before the subcommand parses them, so nothing of it runs)."""

    ORDER = (
        # job: start and watch, change, then the record's verbs and the pictures
        *("run", "status", "logs", "list", "wait", "stop", "resume", "rerun"),
        *("history", "describe", "diff", "plot", "tensorboard"),
    )

    def get_params(self, ctx: Any) -> list[Any]:
        from fsdpctl.cli import lazy  # its --help converted without pydantic, as the root's

        return lazy.plainly(super().get_params(ctx))

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        name, cmd, rest = super().resolve_command(ctx, args)
        for group in EXCLUSIVE.get((str(ctx.info_name), str(name)), ()):
            given = [flag for flag in group if _given(cmd, rest, flag)]
            if len(given) > 1:
                raise BadInput(
                    f"{ctx.info_name} {name}: {' and '.join(given)} exclude each other",
                    hint=f"give one of {', '.join(group)}",
                )
        return name, cmd, rest


def _given(cmd: Any, args: list[str], flag: str) -> bool:
    """Whether `flag` is among a subcommand's words (`--node 0`, `--node=0`), not as another
    option's value, nor after `--`."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return False
        if arg == flag or arg.startswith(flag + "="):
            return True
        takes = any(
            arg in getattr(p, "opts", ())
            and not (getattr(p, "is_flag", False) or getattr(p, "count", False))
            for p in getattr(cmd, "params", [])
        )
        i += 2 if takes and "=" not in arg else 1
    return False


OutputOpt = typer.Option("table", "--output", "-o", help="table, json or yaml")
ViewOutputOpt = typer.Option(
    "table", "--output", "-o", help="table, wide (more columns), name (job names), json or yaml"
)


# The options and the name resolution every job verb shares (job_cmd, job_plot_cmd, job_record_cmd)
BackendOpt = Annotated[
    str | None,
    typer.Option(
        "--backend", help=f"{' or '.join(NAMES)} (default: where the job was started, else BACKEND)"
    ),
]


NameArg = typer.Argument(
    None, help="job name (default: JOB_NAME)", autocompletion=completion.job_names
)


DetachOpt = Annotated[
    bool, typer.Option("--detach", "-d", help="start and return; watch with `job status`")
]


ReplaceOpt = Annotated[
    bool, typer.Option("--replace", help="stop a running job of the same name first")
]


def resolve_job(
    ctx: typer.Context,
    name: str | None,
    backend: str | None,
    *,
    acts: bool = False,
    reads: bool = False,
) -> tuple[Backend, str]:
    """The backend holding job NAME: --backend, else the one it was started on, else BACKEND.
    `acts`: the verb changes the job: a --backend that is not the job's own is refused. `reads`:
    the verb only reads (`job status`): BACKEND and JOB_NAME are read alone (AppState.reads) and
    the whole settings loaded only for a backend that needs them (backends.reader)."""
    from fsdpctl import backends, files

    st = state(ctx)
    if reads:
        known = st.reads("BACKEND", "JOB_NAME")
    else:
        cfg = st.config()
        known = {"BACKEND": cfg.backend, "JOB_NAME": cfg.job_name}
    # before any path is built from it
    name = files.job_name(name) if name is not None else known["JOB_NAME"]
    update = backends.placement_update(name, backend, acts=acts)
    where = backends.placement_of(name) if backend is not None else None
    if where is not None and where["backend"] != backend:  # a reading verb: it looks where asked
        warn(
            f"job {name} was started here on {where['backend']}; --backend {backend} looks for a "
            f"job of that name there instead (leave --backend out for this one)"
        )

    def placed() -> Config:
        cfg = st.config()
        return cfg.model_copy(update=update) if update else cfg

    if reads:
        return backends.reader(update.get("backend", known["BACKEND"]), placed), name
    return backends.create(placed()), name


@dataclass
class AppState:
    env_file: Path  # the last settings file (the one whose keys win)
    # named by --env-file or FSDPCTL_ENV_FILE: it must exist; the default ./.env may be absent
    env_file_given: bool = False
    # every --env-file, in the order given: a later one's keys win over an earlier one's
    env_files: list[Path] = field(default_factory=list)
    flags: dict[str, str] = field(default_factory=dict)
    debug: bool = False
    _config: Config | None = None
    _dotenv: Dotenv | None = None  # the settings files, read once
    # each warning once per command, however often the settings are loaded (with overrides)
    _warned: set[str] = field(default_factory=set)

    def config(self, *, set_by: Mapping[str, str] | None = None, **overrides: Any) -> Config:
        """Load once: flags (--set and command options) > environment > .env > defaults. `set_by`:
        the command option that set each override (`--model`), which errors and `config show` name.
        """
        from fsdpctl.settings import load, secrets_by_place  # the model (pydantic): only here

        given = {k: str(v) for k, v in overrides.items() if v is not None}
        flags = {**self.flags, **given}
        if self._config is None or overrides:
            dotenv = self.dotenv()
            add_secrets(*secrets_by_place(dotenv, os.environ, flags))
            cfg = load(
                dotenv=dotenv,
                environ=os.environ,
                flags=flags,
                dotenv_name=str(self.env_file),
                set_by={k: (set_by or {}).get(k, "flag") for k in given},
            )
            add_secrets(
                cfg.hf_token.get_secret_value()
            )  # masked wherever it shows, whatever its shape
            for w in cfg.warnings:
                if w not in self._warned:
                    self._warned.add(w)
                    warn(w)
            if overrides:
                return cfg
            self._config = cfg
        return self._config

    def dotenv(self) -> Dotenv:
        """The settings files (--env-file, FSDPCTL_ENV_FILE, else ./.env), read once."""
        from fsdpctl.cli.envfile import read_env_files

        if self._dotenv is None:
            self._dotenv = read_env_files(
                self.env_files or [self.env_file], given=self.env_file_given
            )
        return self._dotenv

    def reads(self, *keys: str) -> dict[str, str]:
        """KEY -> value of a few keys (fsdpctl.settings.reading.KEYS), read and checked as
        config() reads and checks them but without the model: what a verb that only reads needs.
        The whole settings are loaded instead once they are (their values), or when --set names a
        key not among `keys` (checked there, as every --set is)."""
        from fsdpctl.settings import reading, secrets_by_place

        if self._config is not None or set(self.flags) - set(keys):
            cfg = self.config()
            return {key: str(getattr(cfg, key.lower())) for key in keys}
        dotenv = self.dotenv()
        add_secrets(*secrets_by_place(dotenv, os.environ, self.flags))
        return reading.read(
            keys,
            dotenv=dotenv,
            environ=os.environ,
            flags=self.flags,
            dotenv_name=str(self.env_file),
        )


def parse_sets(items: list[str], flag: str = "--set", example: str = "MODEL=7b") -> dict[str, str]:
    flags = {}
    for item in items:
        key, sep, value = item.partition("=")
        if (
            not sep or not key
        ):  # quoted masked: `HF_TOKEN value` or `HF_TOKEN:value` holds a secret by place
            # the settings (pydantic) only to say what is wrong
            from fsdpctl.settings import masked_line

            raise BadInput(
                f"{flag} {masked_line(item)!r} is not KEY=VALUE", hint=f"e.g. {flag} {example}"
            )
        flags[key.strip()] = value
    return flags


def state(ctx: typer.Context) -> AppState:
    return ctx.find_root().obj


def warn(msg: str) -> None:
    err.print("[yellow]warning:[/] " + escape(redact(msg)))


def note(msg: str) -> None:
    """A line of progress on stderr, as it is (no markup, no colour)."""
    err.print(msg, markup=False, highlight=False)


def ok(msg: str) -> None:
    err.print(f"[green]{_mark('✓', 'ok:')}[/] " + escape(msg))


def _mark(symbol: str, ascii_word: str) -> str:
    """A symbol the stream's encoding has, else its word (PYTHONIOENCODING=ascii, LANG=C)."""
    try:
        symbol.encode(err.encoding)
    except (UnicodeEncodeError, LookupError):
        return ascii_word
    return symbol


def end_wait(name: str, phase: str) -> None:
    """`job wait`'s last line and exit code from the phase it ended in; anything not final is a
    timeout."""
    from fsdpctl.errors import ExitCode

    codes = {
        "Succeeded": ExitCode.OK,
        "Failed": ExitCode.JOB_FAILED,
        "Stopped": ExitCode.JOB_STOPPED,
    }
    code = codes.get(phase, ExitCode.JOB_TIMED_OUT)
    (ok if code == ExitCode.OK else warn)(
        f"job {name}: {'timed out' if code == ExitCode.JOB_TIMED_OUT else phase}"
    )
    raise typer.Exit(code)


def plain(data: Any) -> Any:
    """`data` masked (redact_obj), with NaN and inf as null: jq and JSON.parse refuse Python's NaN.
    RFC 8259 section 6: "Infinity and NaN are not permitted"."""
    return _finite(redact_obj(data))


def _finite(data: Any) -> Any:
    if isinstance(data, Enum):  # a Phase: its text (YAML's safe dumper knows no str subclass)
        return data.value
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: _finite(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(v) for v in data]
    return data


def emit(data: Any, output: Output | ViewOutput) -> bool:
    """Print data as json/yaml to stdout and return True; False means the caller prints its table.
    The document is masked (its values, then its text) and written as it is: rich would lay out a
    deploy's 1.5 MB of CRDs line by line for seconds, and has nothing to wrap or colour in it."""
    if output == Output.json:
        text = json.dumps(plain(data), default=str, indent=2, allow_nan=False) + "\n"
    elif output == Output.yaml:
        import yaml

        text = yaml.safe_dump(plain(data), sort_keys=False, default_flow_style=False)
    elif output == ViewOutput.name:  # reports: one job name per line
        rows = data if isinstance(data, list) else [data]
        text = "".join(f"{r['job']}\n" for r in rows)
    else:
        return False
    streams.write_data(redact(text))
    return True


def emit_text(text: str) -> None:
    """A data document already written out (`job describe -o env`'s .env): masked, then to stdout
    byte for byte (streams.write_data), never through the console, which would turn a TAB into
    spaces and drop a CR."""
    streams.write_data(redact(text))


__all__ = [
    "AppState",
    "Output",
    "OutputOpt",
    "SettingsError",
    "emit",
    "err",
    "ok",
    "out",
    "state",
    "warn",
]
