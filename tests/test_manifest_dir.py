"""`manifest --out-dir`: what a render leaves in the directory is exactly what it produced for its
job, plus what other jobs and other people put there, untouched.

Renders are generated (hypothesis, fixed seed): a run of renders into one directory, each with its
own job name (two jobs share one namespace, so one Namespace file), JOB_NODES, RDZV_BACKEND (etcd
brings a Deployment, Service and NetworkPolicy that c10d does not), DATASET (a hub data set brings
the pre-step Job) and format (yaml or json: the files of the other format are stale too). After each
render the directory is compared to what `fsdpctl.job.render` produces for each job's last render, file
by file, and to the index fsdpctl keeps (`sha256sum` lines, checked here with hashlib as `sha256sum
-c` would). A file fsdpctl did not write in the way of a render is refused with one line, exit 2,
and nothing in the directory changes; a stale file changed since fsdpctl wrote it is kept.

kubectl reads a directory by suffix only (k8s.io/cli-runtime pkg/resource/visitor.go, ignoreFile
with FileExtensions .json .yaml .yml; hidden names are not skipped), so the index must not end in
one of them.
"""

from __future__ import annotations

import hashlib
import os

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conftest import invoke
from fsdpctl.cluster import manifests
from fsdpctl.errors import ExitCode
from fsdpctl.job import render
from fsdpctl.settings import load
from invariants import check_outcome, error_lines, snapshot

KUBECTL_SUFFIXES = (".json", ".yaml", ".yml")

RENDERS = st.fixed_dictionaries(
    {
        "JOB_NAME": st.sampled_from(["fsdp", "other"]),
        "JOB_NODES": st.sampled_from(["1", "2", "4"]),
        "RDZV_BACKEND": st.sampled_from(["c10d", "etcd", "etcd-v2"]),
        "DATASET": st.sampled_from(["builtin", "org/data"]),
        "fmt": st.sampled_from(["yaml", "json"]),
    }
)


def _expected(render_settings: dict[str, str]) -> dict[str, bytes]:
    """What one render writes, from the pure core: file name -> bytes."""
    sets = {k: v for k, v in render_settings.items() if k != "fmt"}
    flags = {"BACKEND": "eks", "JOB_NAMESPACE": "fsdp", "NODE_COUNT": "4", **sets}
    cfg = load(dotenv={}, environ={}, flags=flags)
    fmt = render_settings["fmt"]
    objs = render.render_job(cfg, "r1")
    return {manifests.file_name(o, fmt): manifests._body(o, fmt).encode() for o in objs}


def _render(out, r: dict[str, str]):
    sets = [a for k, v in r.items() if k != "fmt" for a in ("--set", f"{k}={v}")]
    base = ["--set", "BACKEND=eks", "--set", "JOB_NAMESPACE=fsdp", "--set", "NODE_COUNT=4"]
    return invoke(*base, *sets, "manifest", "--run-id", "r1", "-o", r["fmt"], "--out-dir", str(out))


ETCD = {
    "JOB_NAME": "fsdp",
    "JOB_NODES": "2",
    "RDZV_BACKEND": "etcd",
    "DATASET": "org/data",
    "fmt": "yaml",
}


@settings(
    max_examples=4,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(renders=st.lists(RENDERS, min_size=2, max_size=3))
@example(renders=[ETCD, {**ETCD, "RDZV_BACKEND": "c10d", "DATASET": "builtin", "fmt": "json"}])
@example(renders=[ETCD, {**ETCD, "JOB_NAME": "other"}, {**ETCD, "RDZV_BACKEND": "c10d"}])
def test_the_directory_holds_each_jobs_last_render_and_nothing_stale(
    renders, cli, tmp_path_factory
):
    out = tmp_path_factory.mktemp("out")
    (out / "README.md").write_text("someone else's\n")  # foreign, never in the way: left alone
    (out / "service-other.yaml").write_text("kind: Service\n")
    last: dict[str, dict[str, bytes]] = {}
    for r in renders:
        done = _render(out, r)
        assert done.exit_code == ExitCode.OK, done.output
        assert done.stdout == ""
        last.pop(r["JOB_NAME"], None)  # the latest render last: its bytes win a file two jobs share
        last[r["JOB_NAME"]] = _expected(r)
        kept = {name: body for files in last.values() for name, body in files.items()}
        on_disk = {
            p.name: p.read_bytes() for p in out.iterdir() if p.name.endswith(KUBECTL_SUFFIXES)
        }
        foreign = {"service-other.yaml": b"kind: Service\n"}
        assert on_disk == {**kept, **foreign}, (sorted(on_disk), sorted(kept))
        assert (out / "README.md").read_text() == "someone else's\n"
        for job, files in last.items():
            index = out / manifests.index_name(job)
            assert not index.name.endswith(KUBECTL_SUFFIXES)
            lines = index.read_text().splitlines()
            assert sorted(lines) == sorted(
                f"{hashlib.sha256(b).hexdigest()}  {n}" for n, b in files.items()
            )
        assert not [p for p in out.iterdir() if p.name.startswith(".manifest-")]  # no temp dir left


def test_a_foreign_file_in_the_way_is_refused_and_nothing_changes(cli, tmp_path):
    """Whether it was never fsdpctl's or was changed since fsdpctl wrote it: one line naming it,
    exit 2, the directory as it was (nothing written, nothing stale removed). The same bytes fsdpctl
    would write are not in the way (a directory written before the index existed)."""
    out = tmp_path / "out"
    etcd = {
        "JOB_NAME": "fsdp",
        "JOB_NODES": "2",
        "RDZV_BACKEND": "etcd",
        "DATASET": "builtin",
        "fmt": "yaml",
    }
    c10d = {**etcd, "RDZV_BACKEND": "c10d"}
    assert _render(out, etcd).exit_code == 0
    (out / "pytorchjob-fsdp.yaml").write_text("edited by hand\n")
    for again in (c10d, etcd):
        before = snapshot(out)
        refused = _render(out, again)
        check_outcome(
            refused,
            written_before=before,
            written_after=snapshot(out),
            allowed_codes={ExitCode.BAD_INPUT},
            names=("pytorchjob-fsdp.yaml",),
        )
        assert "--out-dir" in error_lines(refused.stderr)[0]
    spot = out / "pytorchjob-fsdp.yaml"
    makers = {
        "fifo": os.mkfifo,  # never opened: open(2) of a FIFO waits for a writer (fifo(7))
        "link": lambda p: p.symlink_to(
            out / "namespace-fsdp.yaml"
        ),  # to fsdpctl's bytes, still a link
        "dir": os.mkdir,
    }
    for make in makers.values():
        if spot.is_dir() and not spot.is_symlink():
            spot.rmdir()
        else:
            spot.unlink()
        make(spot)
        before = snapshot(out)
        refused = _render(out, etcd)
        assert refused.exit_code == ExitCode.BAD_INPUT, refused.output
        assert "pytorchjob-fsdp.yaml is in the way" in refused.stderr
        assert snapshot(out) == before
    spot.rmdir()
    (out / manifests.index_name("fsdp")).unlink()  # as before the index: same bytes are fsdpctl's
    assert _render(out, etcd).exit_code == 0


def test_a_stale_file_changed_since_is_kept_with_a_warning(cli, tmp_path):
    out = tmp_path / "out"
    etcd = {
        "JOB_NAME": "fsdp",
        "JOB_NODES": "2",
        "RDZV_BACKEND": "etcd",
        "DATASET": "builtin",
        "fmt": "yaml",
    }
    assert _render(out, etcd).exit_code == 0
    (out / "service-etcd.yaml").write_text("edited by hand\n")
    r = _render(out, {**etcd, "RDZV_BACKEND": "c10d"})
    assert r.exit_code == 0, r.output
    assert (out / "service-etcd.yaml").read_text() == "edited by hand\n"
    assert not (out / "deployment-etcd.yaml").exists()
    assert "warning: kept" in r.stderr and "service-etcd.yaml" in r.stderr
