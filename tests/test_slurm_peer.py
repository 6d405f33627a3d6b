"""The Slurm peer itself (tests/slurm_peer.py): real slurmctld, slurmd and munged of Debian's
slurm-wlm 22.05, one slurmd per simulated node in its own network and UTS namespace. What the Slurm
backend will rely on is checked here once against Slurm's documentation and source (SchedMD/slurm,
tag slurm-22-05-8-1: man pages under doc/man, C under src), so its tests can take the peer as given.

One 3-node cluster serves the module (started once, ~2 s), so that a 2-node job requeued after a
node failure has two healthy nodes to run on again; the killed-node test brings its node back."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import slurm_peer
from fsdpctl.adapters import netns
from slurm_peer import slurm_clusters  # noqa: F401 - the factory fixture (containers, issue 36)

# One task per node: the task whose host is the rendezvous endpoint serves on it, the others
# connect and say who they are. Hosting is decided as torchrun's c10d backend does
# (torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py:_create_tcp_store ->
# utils.py:_matches_machine_hostname: the endpoint is this machine's host name or an address that
# name resolves to), so exactly the first node must decide it hosts, and the others reach it there.
PAIR = r"""
import json, os, socket, sys, time
head, port, peers = sys.argv[1], int(sys.argv[2]), int(os.environ["SLURM_NTASKS"]) - 1
def addresses(host):
    return {info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
me = socket.gethostname()
said = {"node": os.environ["SLURMD_NODENAME"], "rank": int(os.environ["SLURM_PROCID"]),
        "hostname": me, "addresses": sorted(addresses(me)),
        "hosts": head == me or bool(addresses(me) & addresses(head))}
if said["hosts"]:
    server = socket.create_server((head, port))
    server.settimeout(60)
    said["heard"] = []
    for _ in range(peers):
        conn, (addr, _port) = server.accept()
        said["heard"].append(json.loads(conn.makefile().readline()) | {"from": addr})
        conn.close()
else:
    deadline = time.monotonic() + 60
    while True:
        try:
            conn = socket.create_connection((head, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    conn.sendall((json.dumps(said) + "\n").encode())
    conn.close()
print(json.dumps(said), flush=True)
"""
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with slurm_peer.running(tmp_path_factory.mktemp("slurm"), nodes=3) as running:
        yield running


def _script(cluster, name: str, body: str) -> str:
    path = cluster.root / name
    path.write_text("#!/bin/sh\n" + body)
    return str(path)


def _until(cluster, job_id: int, *states: str, timeout: float = 180) -> dict[str, str]:
    """The job's `scontrol show job` record once its JobState is one of `states`."""

    def reached() -> dict[str, str] | None:
        job = cluster.job(job_id)
        return job if job["JobState"] in states else None

    return cluster.wait_for(reached, f"job {job_id} {'/'.join(states)}", timeout)


@pytest.mark.slow
def test_sinfo_lists_every_node_idle_with_its_own_host_name_address_and_munged(cluster):
    """Peer: the real cluster. sinfo(1) `-N` prints a line per node: `%N` its NodeName, `%o` its
    NodeAddr, `%T` the extended state (doc/man/man1/sinfo.1). slurmd gets no `-N`: it registers as
    the NodeName of its host name (src/slurmd/slurmd/slurmd.c:_read_config, fatal when none
    matches). Each slurmd, entered through its pid file, has that host name, its node's address and
    no other (`hostname`, `hostname -I`), and at the socket slurm.conf names its node's own munged
    (slurm_peer.NODE_BOOT says why): a credential made there carries the node's address as its
    origin (ENCODE_HOST; munged 0.5.15 logs `Set origin address to <address> (eth0)`)."""
    out = cluster.command("sinfo", "-h", "-N", "-o", "%N %o %T").stdout.split("\n")
    rows = [line.split() for line in out if line.strip()]
    assert rows == [[name, cluster.net.address(n), "idle"] for n, name in enumerate(cluster.names)]
    sock = cluster.munge_dir / "run" / "munge.socket"
    for n, name in enumerate(cluster.names):
        pid = slurm_peer.daemon_pid(cluster.pid_file(f"slurmd-{name}"), "slurmd")
        enter = ["nsenter", f"--target={pid}", "--uts", "--net", "--mount"]
        look = f"hostname; hostname -I; munge -n --socket={sock} | unmunge --socket={sock}"
        argv = [*enter, "sh", "-c", look]
        seen = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        lines = seen.stdout.splitlines()
        assert [lines[0], lines[1].strip()] == [name, cluster.net.address(n)], seen.stderr
        origin = next(line for line in lines if line.startswith("ENCODE_HOST:"))
        assert origin.endswith(f"({cluster.net.address(n)})"), seen.stdout


@pytest.mark.slow
def test_sbatch_runs_a_task_per_node_that_reach_the_first_node_over_tcp(cluster):
    """Peer: the real cluster. sbatch(1): "Slurm runs a single copy of the batch script on the first
    node in the set of allocated nodes", so the script's `$(hostname)`, the rendezvous endpoint of
    awsome-distributed-training's FSDP sbatch (3.test_cases/pytorch/FSDP/slurm/*-training.sbatch:
    `--rdzv_endpoint=$(hostname)`), is the first of `scontrol show hostnames $SLURM_JOB_NODELIST`
    (scontrol(1) "hostnames") and the job's BatchHost. `srun --ntasks-per-node=1` starts one task
    per node (srun(1)) with SLURM_PROCID and SLURMD_NODENAME (srun(1) OUTPUT ENVIRONMENT
    VARIABLES). Each task sees its node's host name and only its address, exactly the first node
    decides it hosts the store as torchrun's c10d would, and the other reaches it over TCP from its
    own address."""
    script = _script(
        cluster,
        "pair.sh",
        'first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)\n'
        'echo "batch $(hostname) first $first"\n'
        f"srun --ntasks-per-node=1 {sys.executable} -c '{PAIR}' \"$(hostname)\" 29500\n",
    )
    job_id = cluster.sbatch(script, "-N2", f"--output={cluster.root}/pair-%j.out")
    job = _until(cluster, job_id, *ENDED)
    text = (cluster.root / f"pair-{job_id}.out").read_text()
    assert (job["JobState"], job["ExitCode"]) == ("COMPLETED", "0:0"), text
    nodes = cluster.hostnames(job["NodeList"])
    assert len(nodes) == 2 and job["BatchHost"] == nodes[0]
    assert f"batch {nodes[0]} first {nodes[0]}" in text
    said = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    said.sort(key=lambda s: s["rank"])
    address = {name: cluster.net.address(cluster.names.index(name)) for name in nodes}
    seen = [(s["node"], s["hostname"], s["addresses"], s["hosts"]) for s in said]
    assert seen == [(n, n, [address[n]], n == nodes[0]) for n in nodes]
    assert [(h["node"], h["from"]) for h in said[0]["heard"]] == [(nodes[1], address[nodes[1]])]


@pytest.mark.slow
def test_scancel_ends_a_running_job_and_its_steps(cluster):
    """Peer: the real cluster. scancel(1) of a running job: slurmstepd writes `*** JOB n ON node
    CANCELLED AT ... ***` into its output (src/slurmd/slurmstepd/req.c:_handle_signal_container),
    the tasks get SIGTERM (then SIGKILL, KillWait later), and the job ends CANCELLED ("explicitly
    cancelled by the user", squeue(1) JOB STATE CODES) with ExitCode 0:15, exit code and the signal
    that ended it (doc/html/job_exit_code.shtml); none of its tasks is left on any node."""
    script = _script(cluster, "sleep.sh", "srun --ntasks-per-node=1 sleep 300\n")
    job_id = cluster.sbatch(script, "-N2", f"--output={cluster.root}/sleep-%j.out")
    _until(cluster, job_id, "RUNNING")
    cluster.wait_for(
        lambda: f"StepId={job_id}.0 " in cluster.command("scontrol", "-o", "show", "step").stdout,
        f"job {job_id}'s srun step",
    )
    cluster.command("scancel", str(job_id))
    job = _until(cluster, job_id, "CANCELLED")
    assert job["ExitCode"] == "0:15"
    text = (cluster.root / f"sleep-{job_id}.out").read_text()
    assert f"*** JOB {job_id} ON {job['BatchHost']} CANCELLED AT" in text
    cluster.wait_for(
        lambda: not any(_sleeping(cluster, n) for n in range(cluster.net.nodes)),
        "every `sleep 300` gone",
        timeout=30,
    )


def _sleeping(cluster, node: int) -> bool:
    for pid in cluster.pids_in(node):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if cmdline.read().startswith(b"sleep\0300"):
                    return True
        except OSError:
            pass
    return False


@pytest.mark.slow
def test_a_killed_node_goes_down_its_requeue_job_runs_again_and_the_other_fails(cluster):
    """Peer: the real cluster; a node failure as Slurm 22.05 handles it (src/slurmctld/job_mgr.c:
    kill_running_job_by_node_name). Two 2-node jobs share a node, one `--requeue`, one
    `--no-requeue`; every process in that node's namespace is killed (a power loss).
    - the node: NOT_RESPONDING once a ping fails, `DOWN+NOT_RESPONDING` with Reason `Not responding`
      once its last answer is SlurmdTimeout old (ping_nodes.c:ping_nodes; slurm.conf(5));
    - the --requeue job: PENDING, Restarts=1, Reason BeginTime ("earliest start time has not yet
      been reached", squeue(1) JOB REASON CODES) for cred_expire + 1 s (slurm.conf(5) AuthInfo: it
      "also controls how long a requeued job must wait before starting again"; job_mgr.c:
      batch_requeue_fini), then RUNNING again, same job id, on healthy nodes, its script "initiated
      from its beginning" (sbatch(1) --requeue) with SLURM_RESTART_COUNT=1 (sbatch(1) OUTPUT
      ENVIRONMENT VARIABLES);
    - the --no-requeue job: NODE_FAIL ("terminated due to failure of one or more allocated nodes",
      squeue(1) JOB STATE CODES), Reason NodeDown (FAIL_DOWN_NODE, slurm_protocol_defs.c:
      job_reason_string);
    - the node, its slurmd started again: IDLE (ReturnToService=1 returns a node that was DOWN for
      not responding, slurm.conf(5))."""
    lines = [
        'echo "start restart=${SLURM_RESTART_COUNT:-0} on $(hostname)"',
        "srun --ntasks-per-node=1 sleep 300",
    ]
    script = _script(cluster, "long.sh", "\n".join(lines) + "\n")
    output = f"--output={cluster.root}/long-%j.out"
    # one after the other: two jobs' steps launched in the same instant on the same nodes sometimes
    # lost one (its step cancelled at launch, the script ended 141) on this loaded 2-core machine
    requeue = cluster.sbatch(script, "-N2", "--requeue", "--open-mode=append", output)
    jobs = [_until(cluster, requeue, "RUNNING")]
    log = cluster.root / f"long-{requeue}.out"
    cluster.wait_for(lambda: log.exists() and "start restart=0" in log.read_text(), "its script")
    fail = cluster.sbatch(script, "-N2", "--no-requeue", output)
    jobs.append(_until(cluster, fail, "RUNNING"))
    lists = [cluster.hostnames(job["NodeList"]) for job in jobs]
    victim = [name for name in lists[0] if name in lists[1]][-1]
    cluster.kill_node(cluster.names.index(victim))

    def down() -> dict[str, str] | None:
        node = cluster.node(victim)
        return node if "DOWN" in node["State"] else None

    node = cluster.wait_for(down, f"{victim} DOWN")
    assert node["State"] == "DOWN+NOT_RESPONDING" and node["Reason"].startswith("Not responding")
    pending = _until(cluster, requeue, "PENDING")
    assert (pending["Reason"], pending["Restarts"], pending["Requeue"]) == ("BeginTime", "1", "1")
    assert _until(cluster, fail, "NODE_FAIL")["Reason"] == "NodeDown"

    again = _until(cluster, requeue, "RUNNING")
    assert again["Restarts"] == "1" and victim not in cluster.hostnames(again["NodeList"])
    cluster.wait_for(lambda: "start restart=1 on" in log.read_text(), "the script started again")
    assert "DUE TO NODE FAILURE" in log.read_text().split("start restart=1")[0]

    cluster.start_node(cluster.names.index(victim))
    cluster.wait_for(lambda: cluster.node(victim)["State"] == "IDLE", f"{victim} back IDLE")
    cluster.command("scancel", str(requeue))
    _until(cluster, requeue, "CANCELLED")


@pytest.mark.slow
def test_teardown_leaves_no_daemon_namespace_or_link(tmp_path):
    """Peer: a cluster of its own, of 2 nodes (the least the Slurm backend needs), left through
    `running()`'s exit: the daemons named by its pid files (a slurmd and a munged per node, the
    controller's slurmctld and munged) are gone, and `ip netns` / `ip link` list none of its
    namespaces, veths or bridge (the local backend's netns.destroy)."""
    nodes = [f"{daemon}-node{n}" for n in (0, 1) for daemon in ("slurmd", "munged")]
    daemons = ["munged", "slurmctld", *nodes]
    with slurm_peer.running(tmp_path, nodes=2) as cluster:
        pids = [slurm_peer.daemon_pid(cluster.pid_file(d), d.split("-")[0]) for d in daemons]
        assert all(pids), pids
        assert cluster.idle() == ["node0", "node1"]
    assert not any(slurm_peer.alive(pid) for pid in pids if pid)
    assert not netns.exists(cluster.net)
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert cluster.net.bridge not in links and cluster.net.veth(0) not in links
    assert not cluster.munge_dir.exists()


def test_without_the_packages_the_peer_says_what_is_missing(monkeypatch):
    """No peer: `available()` names the missing programs and where they come from in one line, so
    every Slurm test skips with that reason rather than failing."""
    real = shutil.which
    monkeypatch.setattr(slurm_peer.netns, "available", lambda: (True, ""))
    monkeypatch.setattr(
        slurm_peer.shutil, "which", lambda p: None if p in ("slurmd", "munged") else real(p) or p
    )
    usable, why = slurm_peer.available()
    assert not usable and "\n" not in why
    assert "munged, slurmd missing" in why and "scripts/system-deps" in why


_KEY = st.from_regex(r"[A-Z][A-Za-z0-9_:/]{0,12}", fullmatch=True)
_CHARS = st.characters(codec="ascii", exclude_characters="=\n\r\t\x0b\x0c")
_VALUE = st.text(_CHARS, max_size=20).map(str.strip)


@settings(max_examples=100, derandomize=True)
@given(st.dictionaries(_KEY, _VALUE, min_size=1, max_size=8))
def test_parse_record_reads_back_any_one_line_scontrol_record(fields):
    """No peer: `scontrol -o` writes a record as `Key=value` fields joined by single spaces, and a
    value may hold spaces (a node's `Reason=Not responding [root@...]`; src/api/node_info.c,
    job_info.c one_liner); whatever the values (no `=`), parse_record gives every field back."""
    line = " ".join(f"{k}={v}" for k, v in fields.items())
    assert slurm_peer.parse_record(line) == fields


# ---- containers: pyxis + enroot (issue 36) -------------------------------------------------------

SHOW_ENV = "import os, socket; print(socket.gethostname(), os.environ.get('HF_HOME'))"


@pytest.mark.slow
def test_pyxis_runs_each_task_in_the_image_whose_env_wins_unless_named(slurm_clusters, tmp_path):  # noqa: F811
    """The containers=True peer as NVIDIA documents pyxis v0.24.0 and enroot v4.1.2: `srun
    --container-image=<squashfs>` runs each task of the step in the image on its own node (slurmd's
    log: "pyxis: starting container" once per node), with the image's python and the tests'
    environment mounted by the nodes' enroot mounts.d; an exported HF_HOME loses to the image's
    /etc/environment one (pyxis_slurmstepd.c spank_import_container_env: `overwrite = 1`) unless
    --container-env names it (then the job's wins: args.c --help). ~25 s here, the first time on a
    machine ~20 s more for the build."""
    cluster = slurm_clusters(2, containers=True)
    image = cluster.image
    assert image is not None
    steps = [
        f'srun -N2 --ntasks-per-node=1 --container-image={image} {sys.executable} -c "{SHOW_ENV}"',
        f"srun -N1 --container-image={image} --container-env=HF_HOME {sys.executable} "
        f'-c "{SHOW_ENV}"',
    ]
    job_script = tmp_path / "job.sh"
    job_script.write_text("#!/bin/bash\nset -e\nexport HF_HOME=/job/hf\n" + "\n".join(steps) + "\n")
    out = tmp_path / "out.log"
    job = cluster.sbatch(job_script, "-N2", f"--output={out}")
    cluster.wait_for(lambda: cluster.job(job)["JobState"] in ENDED, "the job's end")
    assert cluster.job(job)["JobState"] == "COMPLETED", out.read_text()
    image_home = slurm_peer.pyxis_peer.IMAGE_HF_HOME
    text = out.read_text().splitlines()
    assert sorted(text) == sorted([f"node0 {image_home}", f"node1 {image_home}", "node0 /job/hf"])
    logs = "".join(p.read_text() for p in (cluster.root / "log").glob("slurmd-node*.log"))
    assert logs.count(f"[{job}.0] pyxis: starting container") == 2


def test_the_vendored_sources_are_built_only_when_their_sha256_is_the_pinned_one(
    tmp_path, monkeypatch
):
    """tests/pyxis_peer.py checks each tarball against ../shared/vendor/SHA256SUMS before it
    builds: the pinned files pass; a copy with one byte changed is refused naming both digests."""
    import pyxis_peer

    if not (pyxis_peer.VENDOR / pyxis_peer.PYXIS_TARBALL).is_file():
        pytest.skip(f"no pinned sources in {pyxis_peer.VENDOR}")
    for name in (pyxis_peer.PYXIS_TARBALL, pyxis_peer.ENROOT_TARBALL):
        assert pyxis_peer.verified(name).is_file()
    fake = tmp_path / "vendor"
    shutil.copytree(pyxis_peer.VENDOR / "pyxis-v0.24.0", fake / "pyxis-v0.24.0")
    shutil.copy2(pyxis_peer.VENDOR / "SHA256SUMS", fake / "SHA256SUMS")
    tarball = fake / pyxis_peer.PYXIS_TARBALL
    tarball.chmod(0o644)
    data = bytearray(tarball.read_bytes())
    data[-1] ^= 1
    tarball.write_bytes(bytes(data))
    monkeypatch.setattr(pyxis_peer, "VENDOR", fake)
    with pytest.raises(AssertionError, match="pinned 063653ba"):
        pyxis_peer.verified(pyxis_peer.PYXIS_TARBALL)
