"""`config validate` is every refusal of `job run`, all at once (issue 38 item 3): CI gates on validate,
so a settings file validate passes must not be refused by `job run`, and one error must never hide
another (`JOB_NODES=0` hid `IMAGE_TAG=latest`; EKS with no registry was "96 settings valid", then
refused by `job run --dry-run`).

Generated settings files over every backend mix problems of each layer: a value's own (JOB_NODES=0),
across values (IMAGE_TAG=latest, GANG_SCHEDULING without SCHEDULER_NAME), a setting that means
nothing where the job runs (NODE_SELECTOR on Slurm), what the place refuses (an image with no
registry on EKS, a SHARED_VOLUME_PATH not mounted here on Slurm), a job that does not fit (7B on
this machine). Invariants: validate and `job run --dry-run` exit alike; every line `job run` refuses
with is among validate's; with settings that pass, validate names each of the generated problems.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import invoke

PROBLEMS = {
    "JOB_NODES=0": "JOB_NODES",
    "IMAGE_TAG=latest": "IMAGE_TAG",
    "GANG_SCHEDULING=true": "GANG_SCHEDULING",
}
PLACE_PROBLEMS = {
    "local": {"MODEL=7b": "does not fit"},
    "eks": {"IMAGE_REGISTRY=": "has no registry"},
    "slurm": {
        "NODE_SELECTOR=team=a": "NODE_SELECTOR",
        "SHARED_VOLUME_PATH=/no/such/mount": "SHARED_VOLUME_PATH",
    },
}


def _errors(text: str) -> list[str]:
    return [x for x in text.splitlines() if x.startswith("error:")]


@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_validate_refuses_all_that_job_run_refuses_at_once(data, tmp_path_factory):
    import pytest

    from conftest import isolate

    backend = data.draw(st.sampled_from(["local", "eks", "slurm"]), label="backend")
    chosen = data.draw(st.lists(st.sampled_from(sorted(PROBLEMS)), unique=True), label="values")
    place = data.draw(
        st.lists(st.sampled_from(sorted(PLACE_PROBLEMS[backend])), unique=True), label="place"
    )
    root = tmp_path_factory.mktemp("v")
    with pytest.MonkeyPatch.context() as mp:
        isolate(mp, root)
        mp.setenv("FSDPCTL_LOCAL_NETNS", "0")
        shared = root / "fsx"
        shared.mkdir()
        base = {"BACKEND": backend, "MODEL": "tiny", "SHARED_VOLUME_PATH": str(shared)}
        if backend == "eks":
            base["IMAGE_REGISTRY"] = "registry.example.com:5000"
        for item in [*chosen, *place]:
            key, _, value = item.partition("=")
            base[key] = value
        (root / ".env").write_text("".join(f"{k}={v}\n" for k, v in base.items()))
        validate = invoke("config", "validate")
        run = invoke("job", "run", "--dry-run")
        assert validate.exit_code == run.exit_code, (base, validate.stderr, run.stderr)
        if run.exit_code == 2:
            missing = [x for x in _errors(run.stderr) if x not in _errors(validate.stderr)]
            assert not missing, (base, missing, validate.stderr)
        said = " ".join(_errors(validate.stderr))
        if not chosen:  # settings that pass: the place's problems, each of them, at once
            for item in place:
                assert PLACE_PROBLEMS[backend][item] in said, (base, said)
        for item in chosen:
            assert PROBLEMS[item] in said, (base, said)
