"""Operating-system side of the local PostgreSQL: binaries, the ``postgres`` user, paths."""

from __future__ import annotations

import glob
import grp
import os
import pwd
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

OS_USER = "postgres"


def find_bindir() -> Path:
    """Directory holding ``postgres``/``initdb``: the major $CDC_OUTBOX_PG_VERSION names
    (``pg_versions``; it wins), else $CDC_OUTBOX_PG_BINDIR, pg_config, or the newest
    /usr/lib/postgresql/*/bin."""
    from cdc_outbox_dev.sandbox import pg_versions  # it imports this module

    major = pg_versions.selected_major(os.environ)
    if major is not None:
        return pg_versions.bindir_for(major)
    env = os.environ.get("CDC_OUTBOX_PG_BINDIR")
    candidates: list[Path] = [Path(env)] if env else []
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        if out.returncode == 0:
            candidates.append(Path(out.stdout.strip()))

    def version(path: str) -> float:
        match = re.search(r"/postgresql/(\d+(?:\.\d+)?)/", path)
        return float(match.group(1)) if match else 0.0

    debian = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=version, reverse=True)
    candidates += [Path(p).parent for p in debian]
    which = shutil.which("postgres")
    if which:
        candidates.append(Path(which).parent)
    for cand in candidates:
        if (cand / "postgres").is_file() and (cand / "initdb").is_file():
            return cand
    raise FileNotFoundError(
        "PostgreSQL server binaries not found (install the 'postgresql' package or set "
        "CDC_OUTBOX_PG_BINDIR)"
    )


def run_as_postgres() -> tuple[dict[str, Any], pwd.struct_passwd | None]:
    """Popen keyword arguments that drop root to the ``postgres`` user (empty when not root)."""
    if os.geteuid() != 0:
        return {}, None
    try:
        user = pwd.getpwnam(OS_USER)
    except KeyError as exc:
        raise RuntimeError(
            f"running as root, but OS user {OS_USER!r} does not exist (install postgresql)"
        ) from exc
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}, user


def reachable(path: Path, user: pwd.struct_passwd) -> bool:
    """True when ``user`` can search every directory from / down to ``path``."""
    groups = {user.pw_gid} | {g.gr_gid for g in groups_of(user.pw_name)}
    for part in [path, *path.parents]:
        st = part.stat()
        if st.st_uid == user.pw_uid:
            ok = bool(st.st_mode & 0o100)
        elif st.st_gid in groups:
            ok = bool(st.st_mode & 0o010)
        else:
            ok = bool(st.st_mode & 0o001)
        if not ok:
            return False
    return True


def groups_of(name: str) -> list[grp.struct_group]:
    """Supplementary groups listing ``name`` as a member."""
    return [g for g in grp.getgrall() if name in g.gr_mem]
