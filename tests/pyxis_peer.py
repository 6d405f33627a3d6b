"""Containers on the Slurm peer, as on HyperPod and ParallelCluster: NVIDIA's pyxis (the SPANK plugin
behind `srun --container-image/--container-mounts/--container-env`) and enroot (the runtime pyxis
drives), built here from the pinned sources in ../shared/vendor, and a container image that runs the
trainer.

    build()        pyxis v0.24.0 and enroot v4.1.2, each tarball's sha256 checked against
                   ../shared/vendor/SHA256SUMS first; built once and kept in the test cache
                   (CACHE below), keyed by both tarballs' sha256 and the Slurm headers it was
                   compiled against: every later test session on the machine reuses it
    trainer_image()  a squashfs of a minimal root file system with this machine's Python (the one
                   the tests' virtual environment was made from) and the shared libraries the
                   environment's extension modules need; the virtual environment and the checkout
                   come from the host by an enroot mount (`mounts_fstab`), as a cluster's
                   administrator mounts the shared file system into every container. Its
                   /etc/environment sets HF_HOME and PATH, as a Dockerfile's ENV does for an image
                   enroot imports (enroot src/docker.sh writes the image config's Env there)

How each was built here is what ../shared/vendor/README.md records: pyxis with Debian's
`libslurm-dev` (the Slurm 22.05 headers: pyxis must be compiled against the Slurm release it runs
in, pyxis README "Installation") and `make`; enroot's five C helpers with glibc (the tag's Makefile
`FORCE_GLIBC=1`: its default links them statically against the musl git submodule, which the tarball
does not carry) and Debian's static libbsd (`-l:libbsd.a` from libbsd-dev), Debian's `makeself`
standing in for the submodule's, then `make install prefix=DIR` (`-o deps`: nothing to fetch).
Measured here (2 cores): the first build 2-9 s and the image 5-11 s (idle to loaded machine; the
image is 137 MB, uncompressed), both once per machine and cache key; a cached lookup ~0.2 s.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from conftest import SHARED

VENDOR = SHARED / "vendor"
PYXIS_TARBALL = "pyxis-v0.24.0/pyxis-0.24.0.tar.gz"
ENROOT_TARBALL = "enroot-v4.1.2/enroot-4.1.2.tar.gz"
# the build needs these (scripts/system-deps installs their packages); enroot at run time needs
# unsquashfs (it extracts a .sqsh image into the container's root: `enroot create`), jq, parallel
# and pigz (enroot's README "Requirements"; src/common.sh, runtime.sh)
BUILD_TOOLS = ("make", "gcc", "strip", "mksquashfs", "unsquashfs", "makeself", "jq", "parallel")
SLURM_HEADER = Path("/usr/include/slurm/spank.h")  # libslurm-dev
LIBBSD = "libbsd.a"  # libbsd-dev: enroot's helpers link it statically (`-l:libbsd.a`)
# the image: what a trainer image's ENV would set; a test checks the job's own HF_HOME wins
IMAGE_HF_HOME = "/opt/image-hf-home"
IMAGE_PATH = "/usr/local/bin:/usr/bin:/bin"
# the image's python for the trainer (SLURM_PYTHON), a path that exists in the image only, as a
# trainer image's own interpreter does: it runs the mounted virtual environment's
IMAGE_PYTHON = "/opt/fsdptrain/bin/python"
# what the image leaves out of the interpreter's standard library: tests, IDLE, Tk, pip's wheels
STDLIB_SKIP = {"site-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3"}
IMAGE_RECIPE = "3"  # bump when trainer_image() changes what it puts in
# mksquashfs without compression and duplicate search: 100x faster here (gzip took a minute of CPU
# for the ~110 MB root on a busy 2-core machine); the image stays on this disk
UNCOMPRESSED = ("-noI", "-noD", "-noF", "-noX", "-no-duplicates")


def cache_root() -> Path:
    """Where builds are kept between test sessions: FSDPCTL_TEST_CACHE, else ~/.cache/fsdpctl-tests
    (a CI machine starts empty: it builds once per session, each later test reuses it)."""
    if os.environ.get("FSDPCTL_TEST_CACHE"):
        return Path(os.environ["FSDPCTL_TEST_CACHE"])
    return Path.home() / ".cache" / "fsdpctl-tests"


def pinned_sums() -> dict[str, str]:
    """SHA256SUMS of the vendor folder: `<sha256>  ./<path>` per line."""
    sums = {}
    for line in (VENDOR / "SHA256SUMS").read_text().splitlines():
        digest, _, path = line.partition("  ")
        if digest:
            sums[path.strip().removeprefix("./")] = digest.strip()
    return sums


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verified(name: str) -> Path:
    """A vendored tarball whose sha256 is the pinned one; AssertionError naming both otherwise."""
    path, want = VENDOR / name, pinned_sums().get(name)
    assert want, f"{name} is not pinned in {VENDOR / 'SHA256SUMS'}"
    got = sha256(path)
    assert got == want, f"{path}: sha256 {got}, pinned {want}: not building from it"
    return path


def available() -> tuple[bool, str]:
    """(usable, why not): the vendored sources and the build tools (scripts/system-deps)."""
    if not (VENDOR / PYXIS_TARBALL).is_file() or not (VENDOR / ENROOT_TARBALL).is_file():
        return False, f"no pyxis/enroot sources in {VENDOR}"
    missing = [t for t in BUILD_TOOLS if shutil.which(t) is None]
    if not SLURM_HEADER.is_file():
        missing.append("libslurm-dev")
    if not _libbsd():
        missing.append("libbsd-dev")
    if missing:
        return (
            False,
            f"cannot build pyxis/enroot: {', '.join(missing)} missing (scripts/system-deps)",
        )
    return True, ""


def _libbsd() -> Path | None:
    got = subprocess.run(["gcc", "-print-file-name=" + LIBBSD], capture_output=True, text=True)
    found = Path(got.stdout.strip())
    return found if found.is_absolute() and found.is_file() else None


@dataclass(frozen=True)
class Build:
    """pyxis and enroot, built: the plugin, enroot's install prefix and its node-local mount point.

    enroot keeps its runtime state, cache, containers and temp files under `node_local` (set in its
    enroot.conf): a directory each simulated node binds its own over, in its own mount namespace, as
    each real node has its own /run and /var/lib. Not the slurmd's environment: pyxis clears
    slurmstepd's environment before it runs enroot and passes on the job's without
    ENROOT_RUNTIME_PATH/CACHE_PATH/DATA_PATH/TEMP_PATH (pyxis v0.24.0 pyxis_slurmstepd.c,
    slurm_clear_env and enroot_deny_env), so enroot.conf decides where they are."""

    root: Path

    @property
    def plugin(self) -> Path:
        return self.root / "pyxis" / "spank_pyxis.so"

    @property
    def prefix(self) -> Path:
        return self.root / "enroot"

    @property
    def bin(self) -> Path:
        return self.prefix / "bin"

    @property
    def node_local(self) -> Path:
        return self.root / "node-local"

    def local_dirs(self) -> dict[str, Path]:
        """enroot.conf's paths, under `node_local`; ENROOT_CONFIG_PATH holds a node's (the
        cluster's) extra mounts."""
        return {
            "ENROOT_RUNTIME_PATH": self.node_local / "run",
            "ENROOT_CACHE_PATH": self.node_local / "cache",
            "ENROOT_DATA_PATH": self.node_local / "data",
            "ENROOT_TEMP_PATH": self.node_local / "tmp",
            "ENROOT_CONFIG_PATH": self.node_local / "config",
        }

    @property
    def pyxis_runtime(self) -> Path:
        """pyxis's runtime_path= (default /run/pyxis: per node, so under `node_local` too)."""
        return self.node_local / "pyxis"

    def plugstack_line(self) -> str:
        """plugstack.conf's line for pyxis (spank(8): `required PLUGIN ARGS`; pyxis config.c reads
        runtime_path=)."""
        return f"required {self.plugin} runtime_path={self.pyxis_runtime}\n"


def build_key() -> str:
    """Both tarballs' pinned sha256 and the Slurm headers' version: another pyxis, enroot or Slurm
    makes another build."""
    sums = pinned_sums()
    header = Path("/usr/include/slurm/slurm_version.h")
    version = header.read_text() if header.is_file() else ""
    parts = [sums[PYXIS_TARBALL], sums[ENROOT_TARBALL], version]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def build() -> Build:
    """pyxis and enroot built from the verified tarballs, once per cache key (a lock makes
    parallel test workers wait for the first one's build rather than repeat it)."""
    done = Build(cache_root() / f"pyxis-enroot-{build_key()}")
    with _locked(done.root.with_suffix(".lock")):
        if (done.root / "complete").is_file():
            return done
        # in place: enroot's `make install` writes its prefix into the `enroot` script and
        # enroot.conf (its Makefile's sed of @libdir@, @sysconfdir@, DESTDIR included)
        shutil.rmtree(done.root, ignore_errors=True)
        done.root.mkdir(parents=True)
        try:
            _build_into(done)
        except BaseException:
            shutil.rmtree(done.root, ignore_errors=True)
            raise
        (done.root / "complete").write_text(build_key() + "\n")
    return done


def _build_into(done: Build) -> None:
    src = done.root / "src"
    src.mkdir()
    for name in (PYXIS_TARBALL, ENROOT_TARBALL):
        with tarfile.open(verified(name)) as tar:
            tar.extractall(src, filter="data")
    pyxis_src, enroot_src = src / "pyxis-0.24.0", src / "enroot-4.1.2"
    _run(["make", "-j2"], cwd=pyxis_src)
    (done.root / "pyxis").mkdir()
    shutil.copy2(pyxis_src / "spank_pyxis.so", done.plugin)
    makeself = enroot_src / "deps" / "dist" / "makeself" / "bin" / "enroot-makeself"
    makeself.parent.mkdir(parents=True)
    shutil.copy2(shutil.which("makeself") or "makeself", makeself)
    _run(
        ["make", "-o", "deps", "FORCE_GLIBC=1", "install", f"prefix={done.prefix}"], cwd=enroot_src
    )
    conf = done.prefix / "etc" / "enroot" / "enroot.conf"
    lines = [f"{key} {path}" for key, path in done.local_dirs().items()]
    conf.write_text(conf.read_text() + "\n# the Slurm peer's nodes\n" + "\n".join(lines) + "\n")
    done.node_local.mkdir()
    shutil.rmtree(src)


def _run(argv: list[str], cwd: Path) -> None:
    got = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert got.returncode == 0, (
        f"{' '.join(argv)} in {cwd}: rc {got.returncode}\n{got.stderr[-3000:]}"
    )


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# ---- the trainer's image --------------------------------------------------------------------------


def mounts_fstab(paths: Iterable[Path]) -> str:
    """enroot mounts.d lines binding each host path at the same path in every container, read-only
    (enroot conf/mounts/*.fstab: `SRC DST TYPE OPTIONS`, x-create=dir making the mount point)."""
    return "".join(f"{p} {p} none x-create=dir,rbind,ro,nosuid,nodev,rslave 0 -1\n" for p in paths)


def image_key(site_packages: Path) -> str:
    """The interpreter (its prefix and version) and the environment's extension modules decide
    what the image holds."""
    sos = sorted(str(p) for p in site_packages.rglob("*.so*"))
    parts = [IMAGE_RECIPE, sys.base_prefix, _python(), sys.version, IMAGE_HF_HOME, *sos]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _python() -> str:
    """The virtual environment's python as a normal path (`tests/../.venv/bin/python` is one), its
    symlink kept: resolved, it would be the base interpreter, outside the environment."""
    return os.path.abspath(sys.executable)


def trainer_image() -> Path:
    """The squashfs (cached like `build`) of a root file system that runs this virtual
    environment's python once the environment is mounted at its own path."""
    site = Path(sysconfig.get_paths()["purelib"])
    path = cache_root() / f"trainer-image-{image_key(site)}.sqsh"
    with _locked(path.with_suffix(".lock")):
        if path.is_file():
            return path
        with tempfile.TemporaryDirectory(dir=cache_root()) as tmp:
            rootfs = Path(tmp) / "rootfs"
            _fill_root(rootfs, site)
            part = Path(tmp) / "image.sqsh"
            quiet = ["-noappend", "-no-progress", "-quiet", "-all-root", *UNCOMPRESSED]
            _run(["mksquashfs", str(rootfs), str(part), *quiet], cwd=Path(tmp))
            part.rename(path)
    return path


def _fill_root(rootfs: Path, site: Path) -> None:
    """The interpreter at its own path (its standard library without STDLIB_SKIP), /bin/sh (dash:
    pyxis starts every container with `sh -c "kill -STOP $$ ; exit 0"`, pyxis_slurmstepd.c), the
    shared libraries all of them and the environment's extension modules load, and /etc."""
    base = Path(sys.base_prefix)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    exe = Path(os.path.realpath(sys._base_executable))  # type: ignore[attr-defined]
    _copy(exe, rootfs)
    for name in ("python3", "python"):
        if (exe.parent / name).exists() and not (rootfs / str(exe.parent / name)[1:]).exists():
            (rootfs / str(exe.parent / name)[1:]).symlink_to(exe.name)
    libdir = Path(sysconfig.get_config_var("LIBDIR") or base / "lib")
    for lib in libdir.glob("libpython*.so*"):
        _copy(lib, rootfs)
    for entry in stdlib.iterdir():
        if entry.name not in STDLIB_SKIP and not entry.name.startswith("config-"):
            _copy(entry, rootfs)
    shell = Path(os.path.realpath(shutil.which("dash") or "/bin/dash"))
    (rootfs / "bin").mkdir(parents=True, exist_ok=True)
    shutil.copy2(shell, rootfs / "bin" / "dash")
    (rootfs / "bin" / "sh").symlink_to("dash")
    elves = [exe, shell, *libdir.glob("libpython*.so*"), *stdlib.rglob("lib-dynload/*.so")]
    elves += [p for p in site.rglob("*.so*") if p.is_file()]
    for lib in sorted(_needed(elves) | _dlopened()):
        _copy(lib, rootfs)
    etc = rootfs / "etc"
    etc.mkdir(exist_ok=True)
    (etc / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (etc / "group").write_text("root:x:0:\n")
    # the CA bundle, as a Debian-based image has it (ca-certificates): sbatch exports the login
    # shell's SSL_CERT_FILE and its kin to the job, and httpx opens them for any request
    bundle = Path("/etc/ssl/certs/ca-certificates.crt")
    if bundle.is_file():
        (etc / "ssl" / "certs").mkdir(parents=True)
        shutil.copy2(bundle, etc / "ssl" / "certs" / bundle.name)
    # what a trainer image's Dockerfile ENV sets (enroot: the image's Env goes to /etc/environment)
    (etc / "environment").write_text(f"HF_HOME={IMAGE_HF_HOME}\nPATH={IMAGE_PATH}\n")
    wrapper = rootfs / IMAGE_PYTHON.lstrip("/")
    wrapper.parent.mkdir(parents=True)
    wrapper.write_text(f'#!/bin/sh\nexec {_python()} "$@"\n')
    wrapper.chmod(0o755)
    for sub in ("tmp", "root", "proc", "sys", "dev", "run"):
        (rootfs / sub).mkdir(exist_ok=True)


def _needed(elves: list[Path]) -> set[Path]:
    """Every shared library ldd resolves for these ELF files (the loader included)."""
    found: set[Path] = set()
    for chunk in range(0, len(elves), 200):
        argv = ["ldd", *map(str, elves[chunk : chunk + 200])]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120).stdout
        for m in re.finditer(r"(?:=>\s*)?(/\S+)\s+\(0x", out):
            found.add(Path(m[1]))
    # the venv's own (torch/lib, *.libs) are mounted with it; the image carries the system's
    return {p for p in found if not str(p).startswith(str(Path(sys.prefix)))}


def _dlopened() -> set[Path]:
    """What glibc loads by name at run time, which ldd does not list: libgcc_s (thread
    cancellation), the NSS modules for files and DNS."""
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    names = ("libgcc_s.so.1", "libnss_files.so.2", "libnss_dns.so.2", "libresolv.so.2")
    return {
        Path(m[3])
        for m in re.finditer(r"^\s*(\S+) \(([^)]*)\) => (\S+)$", out, re.M)
        if m[1] in names and "x86-64" in m[2]
    }


def _copy(src: Path, rootfs: Path) -> None:
    """`src` at its own path under rootfs, symlinks followed (a file's content, a directory's
    tree)."""
    dest = rootfs / str(src)[1:]
    dest.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dest, symlinks=False, dirs_exist_ok=True)
    elif not dest.exists():
        shutil.copy2(os.path.realpath(src), dest)
