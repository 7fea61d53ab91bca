"""Disruptive changes told from harmless ones: the roles' declarations and the judging of a check pass."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from mctl.ansible.runner import PLAYBOOKS_DIR, TaskChange, _absorb
from mctl.model.disruption import Declaration
from mctl.provision.disruption import can_change, declarations, judge, judge_change, undeclared

COMPONENTS = "Image components installed or verified, pinned and held"
BASE_FILES = "Base files (hosts, limits, sysctls, kernel parameters, chrony)"


def test_every_task_of_the_playbooks_that_can_change_something_declares_what_it_does():
    assert undeclared(PLAYBOOKS_DIR) == []


def test_what_the_roles_declare():
    d = declarations(PLAYBOOKS_DIR)
    assert d[("components", COMPONENTS)] == Declaration(disruptive=True, reboot=True)
    assert d[("imex", "Restart IMEX")] == Declaration(disruptive=True)
    assert d[("imex", "IMEX host service off (Kubernetes sites use the DRA driver's daemons)")].disruptive
    assert d[("slurm_head", "MUNGE restarted to load a new key")].disruptive
    assert d[("nvidia", "Persistence daemon running")].disruptive
    # a file nothing reads live: harmless (the IMEX restart is its handler's, declared apart)
    assert d[("imex", "IMEX daemon configuration")] == Declaration(disruptive=False)
    assert d[("base", BASE_FILES)] == Declaration(disruptive=False)
    assert d[("base", "Boot configuration regenerated with the kernel parameters")] == \
        Declaration(disruptive=False, reboot=True)


def test_task_names_are_unique_within_a_role():
    """A declaration is found by the event's role and task name."""
    from mctl.provision.disruption import _task_files, _walk

    seen: dict[tuple[str, str], str] = {}
    for role, path, tasks in _task_files(PLAYBOOKS_DIR):
        for task in _walk(tasks):
            if not task.get("name") or not can_change(task):
                continue
            key = (role, task["name"])
            assert key not in seen, f"{key} in {path} and {seen[key]}"
            seen[key] = str(path)


def test_a_task_without_a_declaration_is_found(tmp_path):
    (tmp_path / "roles" / "x" / "tasks").mkdir(parents=True)
    (tmp_path / "roles" / "x" / "tasks" / "main.yml").write_text(
        "- name: Restart something\n  ansible.builtin.systemd_service: {name: slurmd, state: restarted}\n"
        "- name: Both\n  tags: [harmless, disruptive]\n  ansible.builtin.command: true\n"
        "- name: Read only\n  ansible.builtin.command: cat /etc/hostname\n  changed_when: false\n"
        "- name: Facts\n  ansible.builtin.set_fact: {a: 1}\n"
        "- block:\n    - ansible.builtin.copy: {dest: /x, content: y}\n      tags: [harmless]\n")
    (tmp_path / "site.yml").write_text("- hosts: all\n  tasks:\n    - name: Play task\n      ansible.builtin.copy: "
                                       "{dest: /y, content: z}\n")
    assert undeclared(tmp_path) == [("roles/x/tasks/main.yml", "Restart something"), ("roles/x/tasks/main.yml", "Both"),
                                    ("roles/x/tasks/main.yml", "copy"), ("site.yml", "Play task")]


def _declared():
    return declarations(PLAYBOOKS_DIR)


def test_a_driver_branch_change_is_disruptive_and_needs_a_reboot():
    res = {"components": {"nvidia_driver": {"installed": ["nvidia-utils-580=580.105.08-0ubuntu1"],
                                            "removed": ["nvidia-utils-570=570.148.08-0ubuntu1"]},
                          "cuda": {"installed": ["cuda-toolkit-13-0=13.0.2-1"]}, "dcgm": {"installed": []}},
           "disrupts": ["nvidia_driver"], "reboot": ["nvidia_driver"]}
    c = judge_change(TaskChange("t1", "components", COMPONENTS, "mctl_apt_components", res), _declared())
    assert c.disrupts == ("nvidia_driver",) and c.reboot and not c.undeclared
    assert c.detail == ("nvidia_driver: installs nvidia-utils-580=580.105.08-0ubuntu1; removes "
                        "nvidia-utils-570=570.148.08-0ubuntu1 | cuda: installs cuda-toolkit-13-0=13.0.2-1")


def test_the_module_narrows_its_declaration():
    """Only pins, keys or harmless components changed: the components task disrupts nothing."""
    res = {"components": {"cuda": {"installed": ["cuda-toolkit-13-0=13.0.2-1"]}}, "disrupts": [], "reboot": []}
    c = judge_change(TaskChange("t1", "components", COMPONENTS, "mctl_apt_components", res), _declared())
    assert c.disrupts == () and not c.reboot


def test_a_declared_task_disrupts_by_its_name_and_an_undeclared_one_counts_as_disruptive():
    c = judge_change(TaskChange("t1", "imex", "Restart IMEX", "ansible.builtin.systemd_service", {}), _declared())
    assert c.disrupts == ("imex: Restart IMEX",) and c.task == "imex: Restart IMEX"
    c = judge_change(TaskChange("t1", "base", BASE_FILES, "mctl_files",
                                {"changed_files": ["/etc/security/limits.d/90-mctl.conf"]}), _declared())
    assert c.disrupts == () and c.detail == "writes /etc/security/limits.d/90-mctl.conf"
    c = judge_change(TaskChange("t1", "", "Something new", "ansible.builtin.shell", {}), _declared())
    assert c.undeclared and c.disrupts == ("undeclared task 'Something new'",)


def test_judge_a_check_pass():
    changes = [TaskChange("t1", "base", BASE_FILES, "mctl_files", {"changed_files": ["/etc/hosts"]}),
               TaskChange("t2", "imex", "IMEX daemon configuration", "mctl_files",
                          {"changed_files": ["/etc/nvidia-imex/config.cfg"]}),
               TaskChange("t2", "imex", "Restart IMEX", "ansible.builtin.systemd_service", {})]
    report = judge(changes, ["t1", "t2", "t3", "t4"], {"t4": "unreachable"}, _declared(), "/runs/x")
    assert report.harmless() == ["t1"] and report.disruptive() == ["t2", "t4"] and report.unchanged() == ["t3"]
    assert report.trays["t2"].disrupting() == ["imex: Restart IMEX"]
    assert report.trays["t4"].disruptive and report.trays["t4"].disrupting() == ["unknown: unreachable"]
    doc = report.to_dict()
    assert doc["run_dir"] == "/runs/x" and doc["trays"]["t1"]["changes"][0]["disruptive"] is False


def test_the_runner_tells_the_changed_tasks_with_what_their_module_reported():
    seen: list[TaskChange] = []
    hosts: dict = {}
    event = {"event": "runner_on_ok", "event_data": {
        "host": "t1", "role": "components", "task": COMPONENTS, "task_action": "mctl_apt_components",
        "res": {"changed": True, "disrupts": ["imex"], "reboot": [], "components": {}, "held": ["x"],
                "stdout": "secret-ish"}}}
    _absorb(event, hosts, None, seen.append)
    _absorb({"event": "runner_on_ok", "event_data": {"host": "t1", "task": "ok", "res": {"changed": False}}},
            hosts, None, seen.append)
    assert seen == [TaskChange("t1", "components", COMPONENTS, "mctl_apt_components",
                               {"components": {}, "disrupts": ["imex"], "reboot": []})]


@pytest.fixture(scope="module")
def apt_module():
    pytest.importorskip("ansible")
    spec = importlib.util.spec_from_file_location("mctl_apt_components",
                                                  Path(PLAYBOOKS_DIR) / "library" / "mctl_apt_components.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_components_module_reports_what_disrupts(apt_module):
    report = {"packages": {"installed": ["numactl"]},
              "nvidia_driver": {"installed": ["a=1"], "removed": ["b=0"]}, "cuda": {"installed": ["c=1"]},
              "imex": {"installed": []}, "slurm": {"installed": [], "removed": ["slurmd=1"]},
              "new_thing": {"installed": ["n=1"]}}
    params = {"harmless": ["cuda", "dcgm"], "reboot": ["nvidia_driver", "cuda"]}
    assert apt_module.disruption(report, params) == {"disrupts": ["nvidia_driver", "slurm", "new_thing"],
                                                     "reboot": ["nvidia_driver"]}
