#!/usr/bin/python
"""Ansible module: write a set of small text files in one module run.

A loop of ansible.builtin.copy costs, per file and host, a remote stat, a file
transfer and a copy module run; on a rack that is 19 hosts x N files of Python
starts on the trays. This module gets every file's content in its arguments and
writes, on each host in one run, only the files whose content, mode or owner
differ: each through a temporary file in the same folder and a rename, so a
reader never sees half a file. Check mode reports what would change; diff mode
shows it.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: mctl_files
short_description: Write several small text files at once, atomically, only where they differ
options:
  files:
    description: Mapping of absolute destination path to the file's whole text.
    type: dict
    required: true
  owner: {description: Owner of every file., type: str, default: root}
  group: {description: Group of every file., type: str, default: root}
  mode: {description: Mode of every file (octal string)., type: str, default: "0644"}
"""

import grp
import os
import pwd
import tempfile

from ansible.module_utils.basic import AnsibleModule


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "files": {"type": "dict", "required": True},
            "owner": {"type": "str", "default": "root"},
            "group": {"type": "str", "default": "root"},
            "mode": {"type": "str", "default": "0644"},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        uid = pwd.getpwnam(p["owner"]).pw_uid
        gid = grp.getgrnam(p["group"]).gr_gid
        mode = int(p["mode"], 8)
    except (KeyError, ValueError) as exc:
        module.fail_json(msg=f"bad owner, group or mode: {exc}")
    changed, diffs = [], []
    for dest, content in sorted(p["files"].items()):
        if not os.path.isabs(dest) or not isinstance(content, str):
            module.fail_json(msg=f"each file needs an absolute path and a text content: {dest!r}")
        data = content.encode()
        try:
            with open(dest, "rb") as fh:
                before = fh.read()
            st = os.stat(dest)
            same = before == data and (st.st_mode & 0o7777) == mode and (st.st_uid, st.st_gid) == (uid, gid)
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
        fd, tmp = tempfile.mkstemp(prefix=".mctl-", dir=folder)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.chown(tmp, uid, gid)
            os.chmod(tmp, mode)
            os.replace(tmp, dest)
        except OSError as exc:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            module.fail_json(msg=f"cannot write {dest}: {exc}")
    result = {"changed": bool(changed), "changed_files": changed}
    if diffs:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
