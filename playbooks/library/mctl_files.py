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
(`absent`), keep a marked block inside a file the host owns (`blocks`, as
ansible.builtin.blockinfile does: /etc/hosts), report, before writing anything, what
a role needs to know of the host (`look`: exists, size, mode, executable; `read`: the
text of small files such as /proc/cmdline; `digest`: a file's SHA-256), and run read-only
commands after the writes (`commands`: nvidia-smi's answer, chronyc waitsync), so a role
does not pay one module run per stat, `cat` or command. A file can wait for another
(`after`): written only while a given file holds a given text (the node check's program
once its modules are unpacked), else reported in `deferred`.
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
      {content, mode, backup, after} (mode: this file's own octal mode; backup: keep the
      previous version beside it, as ansible.builtin.copy's backup does; after: {path, text},
      write it only while that file holds exactly that text, else list it in `deferred`; check mode reports
      it as it will be once the other file holds that text).
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
  blocks:
    description: >-
      Mapping of absolute path to {marker, block, in_place}: the lines between "# BEGIN <marker>" and
      "# END <marker>" (added at the end when missing) hold exactly *block*. The file is written through
      a rename, or in place with in_place (a file bind-mounted into a container or the lab, where a
      rename cannot replace it). Its mode and owner are kept.
    type: dict
    default: {}
  commands:
    description: >-
      Mapping of a name to {argv, timeout, unless}: read-only commands run after every write, also in check
      mode; each reported in `commands` as {rc, stdout, stderr} (rc 124 when it ran past its timeout, 127 when
      it is not there). They never change the result's changed. unless: {changed: [paths], inactive: [units]}
      skips the command (reported as {rc: null, skipped: why}) when one of those files changed in this run or
      one of those units (also listed in units) was not active as found.
    type: dict
    default: {}
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


MARKER = re.compile(r"^[A-Za-z0-9 ._:/-]{1,80}$")


def _with_block(text, marker, block):
    """*text* with the lines between '# BEGIN marker' and '# END marker' replaced by *block* (added at the end
    when there is no such pair). A BEGIN without its END is refused: the file is not what this module wrote."""
    begin, end = f"# BEGIN {marker}", f"# END {marker}"
    lines = text.splitlines()
    body = block.splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.rstrip() == begin]
    ends = [i for i, ln in enumerate(lines) if ln.rstrip() == end]
    if not starts and not ends:
        return "\n".join([*lines, begin, *body, end]) + "\n"
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise ValueError(f"the markers '{begin}' / '{end}' are not one pair")
    return "\n".join([*lines[:starts[0] + 1], *body, *lines[ends[0]:]]) + "\n"


def _write(dest, data, uid, gid, mode, *, in_place=False):
    """*data* into *dest*: through a temporary file in the same folder and a rename, or (in_place) by
    rewriting the file where it is."""
    if in_place:
        with open(dest, "r+b") as fh:
            fh.write(data)
            fh.truncate()
            fh.flush()
            os.fsync(fh.fileno())
        return
    fd, tmp = tempfile.mkstemp(prefix=".mctl-", dir=os.path.dirname(dest))
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chown(tmp, uid, gid)
        os.chmod(tmp, mode)
        os.replace(tmp, dest)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _command(argv, timeout):
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                              env={**os.environ, "LC_ALL": "C"})
        return {"rc": proc.returncode, "stdout": proc.stdout[-READ_LIMIT:], "stderr": proc.stderr[-4096:]}
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return {"rc": 124, "stdout": out[-READ_LIMIT:], "stderr": f"timed out after {timeout:g} s"}
    except OSError as exc:
        return {"rc": 127, "stdout": "", "stderr": str(exc)}


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
            "blocks": {"type": "dict", "default": {}},
            "commands": {"type": "dict", "default": {}},
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
    for path, spec in p["blocks"].items():
        if not os.path.isabs(path) or not isinstance(spec, dict) or not isinstance(spec.get("block"), str) \
                or not MARKER.match(str(spec.get("marker", ""))):
            module.fail_json(msg=f"each block needs an absolute path, a marker (letters, digits, . _ : / -, "
                                 f"spaces) and a text block: {path!r}")
    for name, spec in p["commands"].items():
        argv = spec.get("argv") if isinstance(spec, dict) else None
        # a number among the words is its text (a templated `{{ timeout | int }}` arrives as one)
        if not isinstance(argv, list) or not argv or not all(isinstance(a, (str, int, float)) and not isinstance(a, bool)
                                                            for a in argv):
            module.fail_json(msg=f"command {name!r}: argv must be a non-empty list of strings")
        spec["argv"] = [str(a) for a in argv]
        try:
            if float(spec.get("timeout", 60)) <= 0:
                raise ValueError
        except (TypeError, ValueError):
            module.fail_json(msg=f"command {name!r}: timeout must be a positive number of seconds")
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
    deferred = []
    for dest, spec in sorted(p["files"].items()):
        if isinstance(spec, dict):
            content, file_mode, backup = spec.get("content"), spec.get("mode"), bool(spec.get("backup"))
            after = spec.get("after")
        else:
            content, file_mode, backup, after = spec, None, False, None
        if not os.path.isabs(dest) or not isinstance(content, str):
            module.fail_json(msg=f"each file needs an absolute path and a text content: {dest!r}")
        if after is not None:
            if not isinstance(after, dict) or not os.path.isabs(str(after.get("path", ""))) \
                    or not isinstance(after.get("text"), str):
                module.fail_json(msg=f"{dest}: after needs an absolute path and a text")
            if _read(after["path"]) != after["text"] and not module.check_mode:    # check mode: as it will be
                deferred.append(dest)
                continue
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
        if backup and before is not None:
            module.backup_local(dest)
        try:
            _write(dest, data, uid, gid, want_mode)
        except OSError as exc:
            module.fail_json(msg=f"cannot write {dest}: {exc}")
    for dest, spec in sorted(p["blocks"].items()):
        try:
            with open(dest, "rb") as fh:
                before = fh.read().decode()
            st = os.stat(dest)
        except FileNotFoundError:
            before, st = "", None
        except (OSError, UnicodeDecodeError) as exc:
            module.fail_json(msg=f"cannot read {dest}: {exc}")
        try:
            after_text = _with_block(before, spec["marker"], spec["block"])
        except ValueError as exc:
            module.fail_json(msg=f"{dest}: {exc}")
        if after_text == before:
            continue
        changed.append(dest)
        if module._diff:
            diffs.append({"before_header": dest, "after_header": dest, "before": before, "after": after_text})
        if module.check_mode:
            continue
        keep_mode = (st.st_mode & 0o7777) if st else mode
        keep_owner = (st.st_uid, st.st_gid) if st else (uid, gid)
        try:
            _write(dest, after_text.encode(), *keep_owner, keep_mode,
                   in_place=bool(spec.get("in_place")) and st is not None)
        except OSError as exc:
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
    result["commands"] = {}
    for name, spec in p["commands"].items():
        unless = spec.get("unless") or {}
        why = next((f"{path} changed" for path in unless.get("changed") or [] if path in changed), None) or next(
            (f"{unit} was {result['units'].get(unit, {}).get('active', 'not looked at')}"
             for unit in unless.get("inactive") or [] if result["units"].get(unit, {}).get("active") != "active"),
            None)
        result["commands"][name] = ({"rc": None, "stdout": "", "stderr": "", "skipped": why} if why else
                                    _command(spec["argv"], float(spec.get("timeout", 60))))
    result.update(changed=bool(changed), changed_files=changed, deferred=deferred)
    if diffs:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
