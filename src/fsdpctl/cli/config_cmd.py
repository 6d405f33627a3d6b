"""fsdpctl config show|validate: the values and their sources are `fsdpctl.settings`'."""

from __future__ import annotations

import typer

from fsdpctl.cli.admission import admit
from fsdpctl.cli.common import ForceOpt, Output, OutputOpt, command_group, emit, ok, out, state
from fsdpctl.cli.tables import PlainTable, styled
from fsdpctl.redact import redact

app = command_group("Show and check the settings (.env, environment, --set).")


def _group(key: str) -> str:
    from fsdpctl.settings import Settings, setting_keys

    field = Settings.model_fields.get(setting_keys()[key])
    extra = field.json_schema_extra if field else None
    return (
        str(extra["group"]) if isinstance(extra, dict) else "training"
    )  # trainer keys have no field here


# where a value came from, as the table shows it: the plain defaults dimmed; a named model's own
# defaults (fsdptrain.config.MODEL_DEFAULTS) say so, since they differ from what .env.example lists
UNSET = ("default", "model default", "derived")


@app.command()
def show(ctx: typer.Context, output: Output = OutputOpt) -> None:
    """Every setting with its value and where it came from (default, model default, .env line N,
    environment FSDPCTL_<KEY>, --set or the command option); secrets are masked.

    Example: fsdpctl --set MODEL=7b config show -o yaml
    """
    from fsdpctl.settings import derived, redacted

    cfg = state(ctx).config()
    values = redacted(cfg)
    data = {
        "settings": values,
        "sources": {k: cfg.sources[k] for k in values},
        "derived": derived(cfg),
    }
    if emit(data, output):
        return
    table = PlainTable("group", "key", "value", "source", box=None, pad_edge=False)
    for key in sorted(values, key=lambda k: (_group(k), k)):
        source = cfg.sources[key]
        shown = {
            "default": styled("default", "dim"),
            "model default": f"model default ({cfg.training.model})",
            "derived": f"derived ({cfg.training.model})",
        }.get(source, source)
        table.add_row(_group(key), key, redact(str(values[key])), shown)
    for key, value in derived(cfg).items():
        table.add_row("derived", key, str(value), styled("computed", "dim"))
    out.print(table)


@app.command()
def validate(ctx: typer.Context, force: ForceOpt = False, output: Output = OutputOpt) -> None:
    """Check every value, and that the job fits and can be scheduled where BACKEND runs it (GPU
    memory on the cluster, JOB_NODES against NODE_COUNT; cores, RAM and paths locally); each problem
    is one line naming the key, the value and the fix (exit 2).

    With -o json/yaml stdout gets {ok, problems, warnings, ...} as data; the lines and the exit code
    stay.

    Example: fsdpctl --env-file prod.env config validate
    """
    from fsdpctl.errors import SettingsError

    warnings: tuple[str, ...] = ()
    try:
        cfg = state(ctx).config()
        warnings = cfg.warnings
        admit(cfg, force=force)
    except SettingsError as e:  # the lines go to stderr as without -o (fsdpctl.cli._Group), exit 2
        emit({"ok": False, "problems": e.lines, "warnings": [*warnings, *e.warnings]}, output)
        raise
    emit(
        {
            "ok": True,
            "problems": [],
            "warnings": list(cfg.warnings),
            "settings": len(cfg.sources),
            "set": sum(s not in UNSET for s in cfg.sources.values()),
            "world_size": cfg.world_size,
            "min_world_size": cfg.fewest_nodes * cfg.procs_per_node,
            "backend": cfg.backend,
        },
        output,
    )
    low = cfg.fewest_nodes
    elastic = (
        f", {low * cfg.procs_per_node} on the elastic range's {low} nodes (`fsdpctl plan`: its speed "
        "and cost)"
        if low < cfg.job_nodes
        else ""
    )
    ok(
        f"{len(cfg.sources)} settings valid ({sum(s not in UNSET for s in cfg.sources.values())} set); "
        f"world size {cfg.world_size}{elastic} on {cfg.backend}"
    )
