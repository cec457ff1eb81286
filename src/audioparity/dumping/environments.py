"""Reference environments: another version of a reference's library (NeMo 2.4.1 beside the 3.0.0
the project installs), for a config ``references`` entry that names one (docs/references.md).

An environment is a virtual environment layered on the project's own: its site-packages come
first and hold only its ``packages`` (and what they need that the project's environment lacks or
pins otherwise); every other distribution, torch and audioparity among them, is the project's.
So two references that differ by environment differ by those packages alone. Environments are
built once into a cache shared by every checkout of the machine (like the ports), one folder per
name and digest of what it is built from, found there by that digest (:func:`check_built`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from collections.abc import Mapping, Sequence
from pathlib import Path

from audioparity.contract.errors import AudioparityError
from audioparity.dumping.shared_cache import building, replace_link

log = logging.getLogger("audioparity")

#: The record an environment's folder holds once it is built (what it was built from).
RECORD = "audioparity-environment.json"
#: Where environments are built and found: ``AUDIOPARITY_ENVIRONMENTS``, by default the
#: machine's cache (``make environments`` sets the variable from ``ENVIRONMENTS_CACHE``).
CACHE_VARIABLE = "AUDIOPARITY_ENVIRONMENTS"


def cache() -> Path:
    """The folder that holds the built environments (:data:`CACHE_VARIABLE`)."""
    return Path(os.environ.get(CACHE_VARIABLE)
                or "~/.cache/audioparity/environments").expanduser()


def digest(packages: Sequence[str], base: Path | None = None) -> str:
    """The key of an environment: its packages, the Python and the project environment's
    site-packages it is layered on (``base``, default this interpreter's). 12 hex digits."""
    base = base or Path(sysconfig.get_paths()["purelib"])
    text = json.dumps({"packages": list(packages), "python": sys.version, "base": str(base)})
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def python(folder: Path) -> Path:
    """The interpreter of the environment in ``folder``."""
    return folder / "bin" / "python"


def read_record(folder: Path) -> dict | None:
    """The record of the environment in ``folder`` (None when it is not built)."""
    try:
        return json.loads((folder / RECORD).read_text())
    except (OSError, ValueError):
        return None


def check_built(name: str, packages: Sequence[str], where: Path | None = None) -> Path:
    """The interpreter of environment ``name`` built from ``packages`` for this project
    environment, in ``where`` (default :func:`cache`): ``<where>/<name>-<digest>``.

    Raises:
        AudioparityError: it is not built there (one line saying how to build it).
    """
    where = where or cache()
    folder = where / f"{name}-{digest(packages)}"
    if read_record(folder) is None:
        raise AudioparityError(
            f"reference environment {name!r}: not built for {list(packages)} and this project "
            f"environment (no {folder}); run `make environments` (the configs of config/), or "
            f"`audioparity environments --cache {where} <your config>`")
    return python(folder)


def build(name: str, packages: Sequence[str], cache: Path) -> Path:
    """Environment ``name`` with ``packages`` (pip requirement strings), built into
    ``cache/<name>-<digest>`` unless it is there already, and ``cache/<name>`` pointed at it.
    One run at a time builds it (:func:`~audioparity.dumping.shared_cache.building`), in a folder of
    its own renamed into place; a run that waited reuses what the other built.

    Returns:
        The environment's folder.

    Raises:
        AudioparityError: pip failed (its last lines); nothing is left that looks built.
    """
    key = digest(packages)
    folder = cache / f"{name}-{key}"
    with building(folder):
        if read_record(folder) is None:
            log.info("environments: building %s (%s) in %s", name, ", ".join(packages), folder)
            partial = folder.with_name(folder.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            shutil.rmtree(folder, ignore_errors=True)
            try:
                _create(partial, packages)
            except BaseException:
                shutil.rmtree(partial, ignore_errors=True)
                raise
            (partial / RECORD).write_text(json.dumps(
                {"name": name, "packages": list(packages), "digest": key,
                 "base": sysconfig.get_paths()["purelib"]}, indent=1) + "\n")
            partial.rename(folder)
        else:
            log.info("environments: %s is built (%s)", name, folder)
        replace_link(cache / name, folder.name)
    return folder


def _create(folder: Path, packages: Sequence[str]) -> None:
    """A virtual environment in ``folder`` whose site-packages extends this interpreter's (a
    ``.pth`` that adds it as a site directory, after its own), with ``packages`` installed."""
    venv.EnvBuilder(with_pip=True).create(folder)
    own = Path(subprocess.run([python(folder), "-c", "import sysconfig; print(sysconfig."
                               "get_paths()['purelib'])"], capture_output=True, text=True,
                              check=True).stdout.strip())
    base = sysconfig.get_paths()["purelib"]
    (own / "audioparity-base.pth").write_text(f"import site; site.addsitedir({base!r})\n")
    done = subprocess.run([python(folder), "-m", "pip", "install", "--quiet",
                           "--disable-pip-version-check", *packages],
                          capture_output=True, text=True)
    if done.returncode != 0:
        tail = " | ".join(line for line in done.stderr.splitlines()[-3:] if line.strip())
        raise AudioparityError(f"environments: pip could not install {list(packages)} "
                               f"(exit code {done.returncode}): {tail}")


def build_all(environments: Mapping[str, Mapping[str, Sequence[str]]], cache: Path) -> None:
    """Every environment of a config's ``environments`` (name -> ``{packages}``)."""
    for name, entry in environments.items():
        build(name, entry["packages"], cache)
