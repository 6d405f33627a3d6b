"""fsdpctl command line. Thin commands over the pure core (settings, plan, the job core) and the
adapters; `plots` draws a run's curves for `job plot`.

Imports: every domain package (settings, plan, job, cluster, backends, adapters); nothing imports
the CLI but `fsdpctl.entry` (contracts in pyproject.toml), and its command modules do not import
each other.

Nothing heavy is imported here: a command's module is imported when that command runs (COMMANDS,
built by `cli.lazy`), so `fsdpctl version` and `--help` load no settings, pydantic or backend, and
torch, transformers, boto3 and kubernetes load only inside the commands that need them
(docs/code-layout.md, "How commands load"; tests/test_cli_imports.py).
"""

from __future__ import annotations

import io
import os
import signal
import sys
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from typer._click.exceptions import ClickException, UsageError

from fsdpctl import __version__
from fsdpctl.cli import completion, lazy, streams
from fsdpctl.cli.common import DRY_RUN_SPELLINGS, AppState, WholeHelp, err, parse_sets, warn
from fsdpctl.cli.streams import escape_controls
from fsdpctl.errors import ExitCode, FsdpctlError, SettingsError
from fsdpctl.redact import redact

# pydantic scans every installed package's entry points for plugins at import (~40 ms); a CLI wants
# none
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")


# an OSError that reaches the CLI with a path: a read-only or full file system, permissions, a file
# where a directory should be (FSDPCTL_HOME's, an output path's)
OS_HINT = (
    "check that path (free space, permissions, a read-only file system), "
    "or point FSDPCTL_HOME elsewhere"
)


class _Group(WholeHelp):
    """Turns fsdpctl's own errors into one line (plus a hint) and an exit code; tracebacks only with
    --debug."""

    # the commands in the order a user meets them: train here, settings and sizing, a job's verbs,
    # the cluster's life, then the helpers
    ORDER = (
        *("quickstart", "config", "plan", "doctor", "job", "manifest", "cleanup"),
        *("sandbox", "cluster", "deploy", "image", "monitor", "model", "data", "version"),
    )

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self.commands = lazy.LazyCommands(self.commands, {n: partial(_build, n) for n in COMMANDS})

    def get_params(self, ctx: Any) -> list[Any]:
        """With typer's completion options (added after __init__) and click's --help."""
        return lazy.plainly(super().get_params(ctx))

    def short_help_of(self, name: str) -> str | None:
        """A command's line in the root's help, from COMMANDS: no module imported for --help."""
        return COMMANDS[name][2] if name in COMMANDS else None

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **kw):
        """`--dry-run=server` and `--dry-run=client` are spelled as flags click can parse. click's
        own usage errors quote the value they refused (`Invalid value for '--nodes': 'hf_...'`):
        they are shown masked, as every other line."""
        argv = [DRY_RUN_SPELLINGS.get(arg, arg) for arg in (sys.argv[1:] if args is None else args)]
        if not standalone_mode:
            return super().main(
                _sets_first(self, argv), prog_name, complete_var, standalone_mode, **kw
            )
        streams.reset()
        streams.closed_streams()
        try:
            rv = super().main(_sets_first(self, argv), prog_name, complete_var, False, **kw)
        except ClickException as e:
            shown = io.StringIO()
            e.show(file=shown)  # click says "Error:"; fsdpctl's lines say "error:", as git's
            said = "\n".join(
                "error:" + x[len("Error:") :] if x.startswith("Error:") else x
                for x in shown.getvalue().split("\n")
            )
            streams.write("stderr", escape_controls(redact(said)))
            sys.exit(streams.finish(e.exit_code))
        except typer.Abort as e:  # click's: Ctrl-C or end of input while it parsed or prompted
            if isinstance(e.__cause__ or e.__context__, KeyboardInterrupt):
                streams.write("stderr", "interrupted\n")
                sys.exit(ExitCode.INTERRUPTED)
            streams.write("stderr", "error: aborted: no answer (end of input)\n")
            sys.exit(ExitCode.BAD_INPUT)
        except streams.OutputLost as e:
            streams.say_lost(e.why)
            sys.exit(streams.finish(ExitCode.FAILURE))
        except SystemExit:  # click's own help met EPIPE: it exits 1 and says nothing
            if (why := streams.unpacified()) is None:
                raise
            streams.say_lost(why)
            sys.exit(streams.finish(ExitCode.FAILURE))
        except (OSError, UnicodeEncodeError) as e:  # click's own writing: --help, --version
            why = streams.output_error(e)
            if why is None:
                raise
            streams.say_lost(why)
            sys.exit(streams.finish(ExitCode.FAILURE))
        sys.exit(streams.finish(rv if isinstance(rv, int) else ExitCode.OK))

    def _main_shell_completion(self, ctx_args, prog_name, complete_var=None):
        """Completion (`_FSDPCTL_COMPLETE` set): `--set` values complete wherever --set stands."""
        from fsdpctl.cli import completion

        completion.hook_set_anywhere()
        return super()._main_shell_completion(ctx_args, prog_name, complete_var)

    def invoke(self, ctx):  # click's Context (typer vendors its own click)
        _build_the_chain(self, ctx)  # its modules imported under the starting one-line handler
        signal.signal(signal.SIGINT, signal.default_int_handler)  # now commands take Ctrl-C
        try:
            return super().invoke(ctx)
        except SettingsError as e:
            _traceback_if_debug(ctx)
            for line in e.warnings:
                err.print("[yellow]warning:[/] " + escape(redact(line)))
            for line in e.lines:
                err.print("[red]error:[/] " + escape(redact(line)))
            ctx.exit(ExitCode.BAD_INPUT)
        except FsdpctlError as e:
            _traceback_if_debug(ctx)
            err.print("[red]error:[/] " + escape(redact(str(e))))
            if e.hint:
                err.print("  hint: " + escape(redact(e.hint)))
            ctx.exit(e.code)
        except KeyboardInterrupt as e:
            err.print("interrupted")
            # SIGTERM or SIGHUP turned into an interrupt (job_view.follow): 128 + its number, as a
            # shell reports a process that signal ended
            ctx.exit(128 + e.signum if isinstance(getattr(e, "signum", None), int) else 130)
        except streams.OutputLost:
            raise  # said once, by main, after everything else
        except (
            _overdue()
        ) as e:  # a helper process past its deadline that no adapter turned into a line
            _traceback_if_debug(ctx)
            err.print("[red]error:[/] " + escape(redact(f"{e} (REQUEST_TIMEOUT)")))
            ctx.exit(ExitCode.FAILURE)
        except (typer.Exit, typer.Abort, ClickException):
            raise
        except (
            Exception
        ) as e:  # a defect: still one masked line, and the traceback only with --debug
            if (why := streams.broken_stdout(e)) is not None:  # click's help met a lost stdout
                raise streams.OutputLost(why) from None
            _traceback_if_debug(ctx)
            if isinstance(e, OSError) and e.filename:
                ctx.exit(_os_error(e))
            err.print(
                "[red]error:[/] " + escape(redact(f"internal error: {type(e).__name__}: {e}"))
            )
            err.print("  hint: rerun with --debug for the traceback and report it")
            ctx.exit(ExitCode.FAILURE)


def _os_error(e: OSError) -> int:
    """The file system said no: the path and what is wrong, one line; its exit code. A thing at
    one of fsdpctl's paths that is not what fsdpctl made there (a link, a FIFO: files.NotOurs) is
    refused as bad input."""
    from fsdpctl import files

    if isinstance(e, files.NotOurs):
        err.print("[red]error:[/] " + escape(redact(f"{e.filename} {e.why}")))
        err.print("  hint: fsdpctl makes no links there: remove it (or move it back) and rerun")
        return ExitCode.BAD_INPUT
    said = files.fs_error(e, e.filename) or e.strerror
    err.print("[red]error:[/] " + escape(redact(f"cannot write or read {e.filename}: {said}")))
    err.print("  hint: " + OS_HINT)
    return ExitCode.FAILURE


def _overdue() -> type[BaseException]:
    """fsdpctl.adapters.shell.Overdue, imported only when an exception is being matched."""
    from fsdpctl.adapters.shell import Overdue

    return Overdue


SET_OPTS = ("--set", "-s")


def _takes_value(cmd: Any, arg: str) -> bool:
    """Whether `arg` is an option of `cmd` that consumes the next argument (`--nodes 2`, not
    `--dry-run`)."""
    for param in getattr(cmd, "params", []):
        if arg in getattr(param, "opts", ()) and not (param.is_flag or param.count):
            return True
    return False


def _sets_first(root: Any, argv: list[str]) -> list[str]:
    """`--set KEY=VALUE` (or `-s`) anywhere on the line, moved before the first subcommand where the
    root group parses it: `fsdpctl plan --set SEQ_LEN=2048` is `fsdpctl --set SEQ_LEN=2048 plan`,
    one parser and one validation for every command. Order among the --set is kept (the last of a
    key wins, as before). The walk follows click's own reading: a value of another option (`--run-id
    --set`) and everything after `--` stay where they are; no subcommand has a `--set` or `-s` of
    its own (tests/test_set_anywhere.py)."""
    cmd, at, i = root, None, 0
    head, moved = list(argv), []
    while i < len(head):
        arg = head[i]
        if arg == "--":
            break
        if at is not None and (arg in SET_OPTS or arg.startswith("--set=")):
            take = 1 if "=" in arg else 2
            if i + take > len(head):  # as click says of a --set before the subcommand
                raise UsageError(f"Option '{arg}' requires an argument.")
            moved += head[i : i + take]
            del head[i : i + take]
            continue
        if at is not None and arg.startswith("-s") and not arg.startswith("--") and len(arg) > 2:
            moved += ["-s", arg[2:]]  # -sKEY=VALUE: click's attached short-option value
            del head[i]
            continue
        if arg.startswith("-"):
            i += 2 if "=" not in arg and _takes_value(cmd, arg) else 1
            continue
        sub = getattr(cmd, "commands", {}).get(arg)  # the root's: imported here, as it runs next
        if sub is None:  # a positional argument of a command: keep walking its options
            i += 1
            continue
        at = i if at is None else at
        cmd, i = sub, i + 1
    if at is None or not moved:
        return argv
    return [*head[:at], *moved, *head[at:]]


def _debug(ctx: typer.Context) -> bool:
    obj = ctx.find_root().obj
    return bool(obj and obj.debug)


def _traceback_if_debug(ctx: typer.Context) -> None:
    """--debug: the traceback of the error being handled, masked like every other line (Python's own
    hook would print a token that reached a message); the one-line error and its exit code follow as
    without.
    """
    if _debug(ctx):
        import traceback

        streams.write("stderr", escape_controls(redact(traceback.format_exc())))


app = typer.Typer(
    cls=_Group,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="From nothing to a running, observed, resumable PyTorch FSDP job on EKS, or on this machine."
    "\n\nEvery request to AWS, the Kubernetes API or the Hugging Face Hub, and an AWS profile's "
    "credential_process or a kubeconfig's exec plugin, ends within REQUEST_TIMEOUT seconds (default 30 s "
    "per request), naming what did not answer.",
)


def _version(value: bool) -> None:
    if value:
        streams.write("stdout", f"fsdpctl {__version__}\n")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    env_file: Annotated[
        list[Path] | None,
        typer.Option(
            "--env-file",
            envvar="FSDPCTL_ENV_FILE",
            metavar="PATH",
            help="settings file (KEY=VALUE lines); repeatable: read in order, a later file's key "
            "wins over an earlier one's [default: .env]",
        ),
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            "-s",
            metavar="KEY=VALUE",
            help="override a setting (repeatable, before or after the subcommand); beats env and .env",
            autocompletion=completion.settings,
        ),
    ] = None,
    debug: Annotated[bool, typer.Option("--debug", help="show tracebacks")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True)] = False,
) -> None:
    """Settings come from flags > environment > .env > defaults; `fsdpctl config show` says which
    won."""
    given = ctx.get_parameter_source("env_file")
    from fsdpctl.files import old_home_notice, on_skipped

    on_skipped(warn)  # a damaged file a reader went on without: one warning line naming it
    if notice := old_home_notice():
        warn(notice)
    files = env_file or [Path(".env")]
    ctx.obj = AppState(
        env_file=files[-1],
        env_files=files,
        env_file_given=given is not None and given.name != "DEFAULT" and bool(env_file),
        flags=parse_sets(set_ or []),
        debug=debug,
    )


# Every command of the root, in the order they were added: its module, the attribute there (a
# typer.Typer group or a command function) and the first sentence of its help, which the root's
# --help lists without importing the module (tests/test_cli_imports.py holds the sentences equal to
# the commands'). A command's module is imported when the command runs, so `fsdpctl version` pays
# for no settings, pydantic or backend (docs/code-layout.md, "How commands load").
COMMANDS: dict[str, tuple[str, str, str]] = {
    "config": (
        "fsdpctl.cli.config_cmd",
        "app",
        "Show and check the settings (.env, environment, --set).",
    ),
    "job": (
        "fsdpctl.cli.job_cmd",
        "app",
        "Run and watch training jobs: on this machine (BACKEND=local), an EKS cluster (eks: the "
        "kubeconfig's, KUBE_CONTEXT) or a Slurm cluster (slurm).",
    ),
    "cluster": (
        "fsdpctl.cli.cluster_cmd",
        "app",
        "The EKS cluster: preflight, status, create and delete (eksctl or terraform).",
    ),
    "image": (
        "fsdpctl.cli.image_cmd",
        "app",
        "The trainer image: build it from docker/Dockerfile, push it to ECR.",
    ),
    "deploy": (
        "fsdpctl.cli.deploy_cmd",
        "app",
        "Install etcd, the job operator (PyTorchJob v1 or TrainJob v2), the device plugins, the FSx "
        "CSI driver and monitoring on the cluster.",
    ),
    "monitor": ("fsdpctl.cli.monitor_cmd", "app", "Watch GPUs and training from the terminal."),
    "model": (
        "fsdpctl.cli.hub_cmd",
        "model_app",
        "Models on the Hugging Face Hub: pre-stage one where jobs read it.",
    ),
    "data": (
        "fsdpctl.cli.hub_cmd",
        "data_app",
        "Data sets on the Hugging Face Hub: pre-stage one where jobs read it.",
    ),
    "sandbox": (
        "fsdpctl.cli.sandbox_cmd",
        "app",
        "A place on this machine to try a backend: fsdpctl sandbox slurm up.",
    ),
    "cleanup": (
        "fsdpctl.cli.cleanup_cmd",
        "cleanup",
        "Remove ended jobs and what they left; checkpoints only with --checkpoints.",
    ),
    "manifest": (
        "fsdpctl.cli.manifest_cmd",
        "manifest",
        "Render the job's Kubernetes objects (Namespace, etcd if used, PyTorchJob) from the settings.",
    ),
    "quickstart": (
        "fsdpctl.cli.quickstart_cmd",
        "quickstart",
        "Train a tiny Llama with FSDP on this machine: 2 simulated nodes, real torchrun rendezvous, "
        "checkpoints.",
    ),
    "plan": ("fsdpctl.cli.plan_cmd", "plan", "A job's memory, speed and cost before it runs."),
    "doctor": (
        "fsdpctl.cli.doctor_cmd",
        "doctor",
        "Preflight: GPU, driver vs CUDA, a forward/backward on cuda, bf16, NCCL bandwidth, EFA, "
        "/dev/shm, disk, data.",
    ),
    "version": ("fsdpctl.cli", "version", "The fsdpctl version (as --version)."),
}


def _build(name: str) -> Any:
    """The click command of COMMANDS[name], built as typer's add_typer/command would have built it
    at the root (its markup and exception settings): its module imported now."""
    module, attr, _ = COMMANDS[name]
    return lazy.build(module, attr, name, app)


def version() -> None:
    """The fsdpctl version (as --version)."""
    streams.write("stdout", f"fsdpctl {__version__}\n")


def _build_the_chain(group: Any, ctx: Any) -> None:
    """The commands the words name (`job`, then `list`), built now: their modules are imported on
    first use (cli/lazy.py), and a Ctrl-C meanwhile is the starting handler's one line and 130
    (fsdpctl.entry), never a traceback from inside an import. A word that names no command ends
    the walk (click then says what is wrong)."""
    cmd = group
    for word in [*getattr(ctx, "_protected_args", []), *ctx.args]:
        get = getattr(cmd, "get_command", None)
        if get is None or word.startswith("-") or (cmd := get(ctx, word)) is None:
            return


def main() -> None:
    """The executable: the root command is built, then each command as it is dispatched
    (cli/lazy.py), under the starting one-line Ctrl-C handler of fsdpctl.entry when it runs there;
    once built, Ctrl-C is Python's KeyboardInterrupt again, which every command turns into one line
    and 130 (_Group.invoke)."""
    import typer.main

    streams.guard_std_descriptors()  # `python -m fsdpctl.cli`: not through fsdpctl.entry
    command = typer.main.get_command(app)
    try:
        code = command(prog_name="fsdpctl")
    except SystemExit as e:  # _Group.main's, its code already settled with streams.finish
        code = e.code
    sys.exit(streams.finish(code if isinstance(code, int) else 1 if code else 0))
