"""playbooks/library/mctl_files.py, run as Ansible runs a module (its arguments in a file), on a temporary folder.

The roles write their small files, make their folders and look at the host through it, one module
run per role and host (docs/decisions.md D53): what it reports decides the roles' handlers and checks."""

from __future__ import annotations

import grp
import hashlib
import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

MODULE = Path(__file__).resolve().parents[2] / "playbooks/library/mctl_files.py"
OWNER = pwd.getpwuid(os.getuid()).pw_name
GROUP = grp.getgrgid(os.getgid()).gr_name


def run(tmp_path: Path, check: bool = False, diff: bool = False, **args) -> dict:
    args = {"owner": OWNER, "group": GROUP, **args, "_ansible_check_mode": check, "_ansible_diff": diff,
            "_ansible_tmpdir": str(tmp_path)}
    argfile = tmp_path / "args.json"
    argfile.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    proc = subprocess.run([sys.executable, str(MODULE), str(argfile)], capture_output=True, text=True, timeout=60)
    return json.loads(proc.stdout)


def test_writes_only_what_differs_and_makes_folders(tmp_path, processes):
    d = tmp_path / "etc" / "mctl"
    files = {str(d / "a.conf"): "a\n", str(d / "prog"): {"content": "#!/bin/sh\n", "mode": "0755"}}
    check = run(tmp_path, check=True, diff=True, dirs=[str(d)], files=files)
    assert check["changed"] and not d.exists()                       # check mode writes nothing
    assert check["changed_files"] == [str(d), str(d / "a.conf"), str(d / "prog")]
    assert {x.get("after_header") for x in check["diff"]} >= {str(d / "a.conf"), str(d / "prog")}
    first = run(tmp_path, dirs=[str(d)], files=files)
    assert first["changed"] and (d / "a.conf").read_text() == "a\n"
    assert oct((d / "prog").stat().st_mode & 0o777) == "0o755" and oct((d / "a.conf").stat().st_mode & 0o777) == "0o644"
    again = run(tmp_path, dirs=[str(d)], files=files)
    assert again["changed"] is False and again["changed_files"] == []
    (d / "a.conf").chmod(0o600)                                      # a mode drift alone is repaired
    assert run(tmp_path, dirs=[str(d)], files=files)["changed_files"] == [str(d / "a.conf")]


def test_look_and_read_report_the_state_before_writing(tmp_path, processes):
    f, flag = tmp_path / "rec", tmp_path / "flag"
    flag.write_text("x\n")
    flag_mode = f"{flag.stat().st_mode & 0o7777:04o}"
    out = run(tmp_path, look=[str(f), str(flag)], read=[str(f), "/proc/cmdline"], files={str(f): "one"},
              absent=[str(flag)])
    assert out["looked"][str(f)]["exists"] is False and out["looked"][str(flag)] == {
        "exists": True, "size": 2, "executable": False, "isdir": False, "mode": flag_mode}
    assert out["text"][str(f)] is None and isinstance(out["text"]["/proc/cmdline"], str)
    assert f.read_text() == "one" and not flag.exists() and out["changed_files"] == [str(f), str(flag)]
    again = run(tmp_path, read=[str(f)], absent=[str(flag)], digest=[str(f), str(flag)])
    assert again["text"][str(f)] == "one" and again["changed"] is False
    assert again["sha256"] == {str(f): hashlib.sha256(b"one").hexdigest(), str(flag): None}


def test_backup_keeps_the_previous_version(tmp_path, processes):
    f = tmp_path / "config.cfg"
    f.write_text("old\n")
    f.chmod(0o644)
    run(tmp_path, files={str(f): {"content": "new\n", "backup": True}})
    backups = [p for p in tmp_path.iterdir() if p.name.startswith("config.cfg.") and p.name.endswith("~")]
    assert f.read_text() == "new\n" and [b.read_text() for b in backups] == ["old\n"]


def test_bad_input_fails_with_the_path(tmp_path, processes):
    out = run(tmp_path, files={"relative/path": "x"})
    assert out["failed"] and "relative/path" in out["msg"]
    out = run(tmp_path, files={str(tmp_path / "missing-folder" / "f"): "x"})
    assert out["failed"] and "missing-folder/f" in out["msg"]
    out = run(tmp_path, files={str(tmp_path / "f"): {"content": "x", "mode": "rwx"}})
    assert out["failed"] and "bad mode" in out["msg"]


def test_units_reported_in_systemctls_words_before_any_write(tmp_path, processes):
    # A stand-in systemctl on PATH answers as systemd does: the word on stdout, the exit code beside it.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "systemctl"
    fake.write_text('#!/bin/sh\ncase "$1 $2" in\n'
                    '  "is-enabled chrony") echo enabled ;;\n  "is-active chrony") echo active ;;\n'
                    '  "is-enabled nvidia-imex") echo disabled; exit 1 ;;\n  "is-active nvidia-imex") echo inactive; exit 3 ;;\n'
                    '  "is-enabled"*) echo "Failed to get unit file state" >&2; exit 1 ;;\n  *) echo inactive; exit 3 ;;\n'
                    'esac\n')
    fake.chmod(0o755)
    args = {"owner": OWNER, "group": GROUP, "units": ["chrony", "nvidia-imex", "nosuch"],
            "_ansible_check_mode": False, "_ansible_diff": False, "_ansible_tmpdir": str(tmp_path)}
    argfile = tmp_path / "args.json"
    argfile.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    proc = subprocess.run([sys.executable, str(MODULE), str(argfile)], capture_output=True, text=True, timeout=60,
                          env=env)
    out = json.loads(proc.stdout)
    assert out["units"] == {"chrony": {"enabled": "enabled", "active": "active"},
                            "nvidia-imex": {"enabled": "disabled", "active": "inactive"},
                            "nosuch": {"enabled": "not-found", "active": "inactive"}}
    assert out["changed"] is False
    bad = run(tmp_path, units=["chrony; reboot"])
    assert bad.get("failed") and "not a unit name" in bad["msg"]


def test_a_marked_block_is_kept_like_blockinfile_in_place_or_by_rename(tmp_path, processes):
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n# BEGIN mctl site hosts\n10.0.0.9 old\n# END mctl site hosts\n::1 ip6\n")
    hosts.chmod(0o640)
    inode = hosts.stat().st_ino
    spec = {"marker": "mctl site hosts", "block": "127.1.1.1 a\n127.1.1.2 b\n", "in_place": True}
    out = run(tmp_path, diff=True, blocks={str(hosts): spec})
    assert out["changed_files"] == [str(hosts)] and "10.0.0.9 old" in out["diff"][0]["before"]
    assert hosts.read_text() == ("127.0.0.1 localhost\n# BEGIN mctl site hosts\n127.1.1.1 a\n127.1.1.2 b\n"
                                 "# END mctl site hosts\n::1 ip6\n")
    assert hosts.stat().st_ino == inode and oct(hosts.stat().st_mode & 0o777) == "0o640"   # in place, mode kept
    assert run(tmp_path, blocks={str(hosts): spec})["changed"] is False
    fresh = tmp_path / "fresh"
    fresh.write_text("x\n")
    run(tmp_path, blocks={str(fresh): {"marker": "m", "block": "y"}})
    assert fresh.read_text() == "x\n# BEGIN m\ny\n# END m\n"
    broken = tmp_path / "broken"
    broken.write_text("# BEGIN m\nno end\n")
    out = run(tmp_path, blocks={str(broken): {"marker": "m", "block": "y"}})
    assert out["failed"] and "not one pair" in out["msg"] and broken.read_text() == "# BEGIN m\nno end\n"
    out = run(tmp_path, blocks={str(fresh): {"marker": "m\n# END m", "block": "y"}})
    assert out["failed"] and "marker" in out["msg"]


def test_commands_run_after_the_writes_and_report_rc_and_output(tmp_path, processes):
    f = tmp_path / "f"
    out = run(tmp_path, check=False, files={str(f): "written\n"},
              commands={"cat": {"argv": ["cat", str(f)]}, "slow": {"argv": ["sleep", "5"], "timeout": 0.5},
                        "none": {"argv": [str(tmp_path / "no-such-tool")]}})
    assert out["commands"]["cat"] == {"rc": 0, "stdout": "written\n", "stderr": ""}
    assert out["commands"]["slow"]["rc"] == 124 and out["commands"]["none"]["rc"] == 127
    check = run(tmp_path, check=True, commands={"echo": {"argv": ["echo", "hi"]}})
    assert check["commands"]["echo"]["stdout"] == "hi\n" and check["changed"] is False   # read-only: check mode too
    out = run(tmp_path, commands={"bad": {"argv": "echo hi"}})
    assert out["failed"] and "argv" in out["msg"]


def test_a_file_can_wait_for_another_files_text(tmp_path, processes):
    stamp, prog = tmp_path / "stamp", tmp_path / "prog"
    files = {str(prog): {"content": "#!/bin/sh\n", "mode": "0755", "after": {"path": str(stamp), "text": "v2\n"}}}
    out = run(tmp_path, files=files)
    assert out["deferred"] == [str(prog)] and not prog.exists() and out["changed"] is False
    stamp.write_text("v1\n")
    assert run(tmp_path, files=files)["deferred"] == [str(prog)]
    stamp.write_text("v2\n")
    out = run(tmp_path, files=files)
    assert out["deferred"] == [] and out["changed_files"] == [str(prog)] and prog.read_text() == "#!/bin/sh\n"


def test_a_command_is_skipped_when_a_file_it_depends_on_changed_or_its_unit_is_not_active(tmp_path, processes):
    conf = tmp_path / "chrony.conf"
    spec = {"argv": ["echo", "synced"], "unless": {"changed": [str(conf)]}}
    out = run(tmp_path, files={str(conf): "server a\n"}, commands={"wait": spec})
    assert out["commands"]["wait"] == {"rc": None, "stdout": "", "stderr": "", "skipped": f"{conf} changed"}
    out = run(tmp_path, files={str(conf): "server a\n"}, commands={"wait": spec})
    assert out["commands"]["wait"]["rc"] == 0 and out["commands"]["wait"]["stdout"] == "synced\n"
