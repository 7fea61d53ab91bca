#!/usr/bin/python
"""Ansible module: write a set of small text files in one module run.

A loop of ansible.builtin.copy costs, per file and host, a remote stat, a file
transfer and a copy module run; on a rack that is 19 hosts x N files of Python
starts on the trays. This module gets every file's content in its arguments and
writes, on each host in one run, only the files whose content, mode or owner
differ: each through a temporary file in the same folder and a rename, so a
reader never sees half a file. Check mode reports what would change; diff mode
shows it.

In the same run it can make the folders the files go in (`dirs`), remove files
(`absent`) and report, before writing anything, what a role needs to know of the
host (`look`: exists, size, mode, executable; `read`: the text of small files such as
/proc/cmdline; `digest`: a file's SHA-256), so a role does not pay one module run per stat or `cat`.
Used by every role of playbooks/ (it lies in playbooks/library/, next to site.yml
and slurm.yml); docs/decisions.md D53.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: mctl_files
short_description: Write several small text files at once, atomically, only where they differ
options:
  files:
    description: >-
      Mapping of absolute destination path to the file's whole text, or to
      {content, mode, backup} (mode: this file's own octal mode; backup: keep the
      previous version beside it, as ansible.builtin.copy's backup does).
    type: dict
    default: {}
  owner: {description: Owner of every file., type: str, default: root}
  group: {description: Group of every file., type: str, default: root}
  mode: {description: Mode of every file (octal string)., type: str, default: "0644"}
  dirs: {description: "Folders made first (mode dir_mode, owner root), and set to dir_mode where they exist.",
         type: list, default: []}
  dir_mode: {description: Mode of the folders in dirs., type: str, default: "0755"}
  absent: {description: Absolute paths of files to remove., type: list, default: []}
  look: {description: "Paths reported in `looked` (exists, size, executable), as found before any write.",
         type: list, default: []}
  read: {description: "Paths whose text (up to 64 KiB; null when missing) is reported in `text`, before any write.",
         type: list, default: []}
  digest: {description: "Paths whose SHA-256 (hex; null when missing) is reported in `sha256`, before any write.",
           type: list, default: []}
  units: {description: "systemd units whose state is reported in `units` (enabled: systemctl is-enabled's word,
          active: systemctl is-active's), before any write, so a role runs its service task only when the unit
          is not already as wanted.", type: list, default: []}
"""

import grp
import hashlib
import os
import pwd
import re
import subprocess
import tempfile

from ansible.module_utils.basic import AnsibleModule

READ_LIMIT = 65536


def _mode(raw, what):
    try:
        return int(str(raw), 8)
    except ValueError:
        raise ValueError(f"{what}: bad mode {raw!r}") from None


def _look(path):
    try:
        st = os.stat(path)
    except OSError:
        return {"exists": False, "size": 0, "executable": False, "isdir": False, "mode": None}
    return {"exists": True, "size": st.st_size, "executable": os.access(path, os.X_OK),
            "isdir": os.path.isdir(path), "mode": f"{st.st_mode & 0o7777:04o}"}


def _read(path):
    try:
        with open(path, "rb") as fh:
            return fh.read(READ_LIMIT).decode(errors="replace")
    except (FileNotFoundError, NotADirectoryError):
        return None


def _digest(path):
    h = hashlib.sha256()
    try:
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return None
    return h.hexdigest()


UNIT = re.compile(r"^[A-Za-z0-9@._:-]+$")


def _unit(name):
    """systemctl's own words for *name*: is-enabled (enabled, disabled, masked, static, ...; not-found when
    the unit is unknown) and is-active (active, inactive, failed, ...); unknown when systemctl did not answer."""
    out = {}
    for key, verb in (("enabled", "is-enabled"), ("active", "is-active")):
        try:
            proc = subprocess.run(["systemctl", verb, name], capture_output=True, text=True, timeout=30,
                                  env={**os.environ, "LC_ALL": "C"})
            word = (proc.stdout.split() or ["not-found" if proc.returncode and verb == "is-enabled" else "unknown"])[0]
        except (OSError, subprocess.SubprocessError):
            word = "unknown"
        out[key] = word
    return out


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "files": {"type": "dict", "default": {}},
            "owner": {"type": "str", "default": "root"},
            "group": {"type": "str", "default": "root"},
            "mode": {"type": "str", "default": "0644"},
            "dirs": {"type": "list", "elements": "str", "default": []},
            "dir_mode": {"type": "str", "default": "0755"},
            "absent": {"type": "list", "elements": "str", "default": []},
            "look": {"type": "list", "elements": "str", "default": []},
            "read": {"type": "list", "elements": "str", "default": []},
            "digest": {"type": "list", "elements": "str", "default": []},
            "units": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        uid = pwd.getpwnam(p["owner"]).pw_uid
        gid = grp.getgrnam(p["group"]).gr_gid
        mode = _mode(p["mode"], "mode")
        dir_mode = _mode(p["dir_mode"], "dir_mode")
    except (KeyError, ValueError) as exc:
        module.fail_json(msg=f"bad owner, group or mode: {exc}")
    for path in [*p["dirs"], *p["absent"], *p["look"], *p["read"], *p["digest"]]:
        if not os.path.isabs(path):
            module.fail_json(msg=f"each path must be absolute: {path!r}")
    for name in p["units"]:
        if not UNIT.match(name):
            module.fail_json(msg=f"not a unit name: {name!r}")
    result = {"units": {name: _unit(name) for name in p["units"]},
              "looked": {path: _look(path) for path in p["look"]},
              "text": {path: _read(path) for path in p["read"]},
              "sha256": {path: _digest(path) for path in p["digest"]}}
    changed, diffs = [], []
    for folder in p["dirs"]:
        try:
            st = os.stat(folder)
        except FileNotFoundError:
            st = None
        if st is not None and not os.path.isdir(folder):
            module.fail_json(msg=f"{folder} is not a folder")
        if st is not None and (st.st_mode & 0o7777) == dir_mode:
            continue
        changed.append(folder)
        if module._diff:
            diffs.append({"before": {"path": folder, "state": "absent" if st is None else "directory"},
                          "after": {"path": folder, "state": "directory", "mode": p["dir_mode"]}})
        if module.check_mode:
            continue
        try:
            if st is None:
                os.makedirs(folder, dir_mode, exist_ok=True)
            os.chmod(folder, dir_mode)
        except OSError as exc:
            module.fail_json(msg=f"cannot make folder {folder}: {exc}")
    for dest, spec in sorted(p["files"].items()):
        if isinstance(spec, dict):
            content, file_mode, backup = spec.get("content"), spec.get("mode"), bool(spec.get("backup"))
        else:
            content, file_mode, backup = spec, None, False
        if not os.path.isabs(dest) or not isinstance(content, str):
            module.fail_json(msg=f"each file needs an absolute path and a text content: {dest!r}")
        try:
            want_mode = mode if file_mode is None else _mode(file_mode, dest)
        except ValueError as exc:
            module.fail_json(msg=str(exc))
        data = content.encode()
        try:
            with open(dest, "rb") as fh:
                before = fh.read()
            st = os.stat(dest)
            same = before == data and (st.st_mode & 0o7777) == want_mode and (st.st_uid, st.st_gid) == (uid, gid)
        except FileNotFoundError:
            before, same = None, False
        if same:
            continue
        changed.append(dest)
        if module._diff:
            diffs.append({"before_header": dest, "after_header": dest,
                          "before": before.decode(errors="replace") if before is not None else "",
                          "after": content})
        if module.check_mode:
            continue
        folder = os.path.dirname(dest)
        if backup and before is not None:
            module.backup_local(dest)
        try:
            fd, tmp = tempfile.mkstemp(prefix=".mctl-", dir=folder)
        except OSError as exc:
            module.fail_json(msg=f"cannot write {dest}: {exc}")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.chown(tmp, uid, gid)
            os.chmod(tmp, want_mode)
            os.replace(tmp, dest)
        except OSError as exc:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            module.fail_json(msg=f"cannot write {dest}: {exc}")
    for dest in sorted(p["absent"]):
        if not os.path.lexists(dest):
            continue
        if os.path.isdir(dest) and not os.path.islink(dest):
            module.fail_json(msg=f"{dest} is a folder; absent removes files only")
        changed.append(dest)
        if module._diff:
            diffs.append({"before": {"path": dest, "state": "file"}, "after": {"path": dest, "state": "absent"}})
        if module.check_mode:
            continue
        try:
            os.unlink(dest)
        except OSError as exc:
            module.fail_json(msg=f"cannot remove {dest}: {exc}")
    result.update(changed=bool(changed), changed_files=changed)
    if diffs:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
