#!/usr/bin/python
"""Ansible module: install (or verify) every component of a tray's software image through apt.

For each component of the image, in the image's order:

* ``delivery: repository``: the repository the component names (``repository:``) must be one the
  inventory defines (``apt_repositories``); its signing key goes to /etc/apt/keyrings, its source
  line to /etc/apt/sources.list.d/mctl-<name>.list and a pin (apt preferences, priority 1001) of
  every package at the image's exact version to /etc/apt/preferences.d/mctl-<component>.pref.
  Packages not installed at that version are installed with apt-get, after an update of that one
  source (the OS's own sources are not touched, so an unreachable distribution mirror cannot fail
  or slow a tray). Afterwards every package is checked with dpkg-query.
* ``delivery: image``: the packages must already be installed at the exact version.

Components marked ``hold: true`` (driver, IMEX) are held (apt-mark hold), as is the kernel the
image names. The first component that cannot be installed or verified fails the host, with the
component's name and apt's own error lines: never a silent skip. Every apt call has a deadline.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: mctl_apt_components
short_description: Install or verify a software image's components through apt, pinned and held
options:
  components: {description: The image's components (mctl_image_spec.components)., type: dict, required: true}
  repositories: {description: "name -> {url, suite, components, key} (key: the armored signing key's text).",
                 type: dict, default: {}}
  kernel_package: {description: Kernel package to verify and hold (empty when the image names none)., type: str, default: ""}
  update_timeout: {description: Seconds one apt-get update may take., type: int, default: 120}
  install_timeout: {description: Seconds one apt-get install may take., type: int, default: 600}
"""

import os
import re
import subprocess
import tempfile

from ansible.module_utils.basic import AnsibleModule

PKG = re.compile(r"^([a-z0-9][a-z0-9+.-]+)(?:=([0-9][A-Za-z0-9.+~:-]*))?$")
NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
ENV = {"DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
KEYRINGS = "/etc/apt/keyrings"
SOURCES = "/etc/apt/sources.list.d"
PREFS = "/etc/apt/preferences.d"


class Failed(Exception):
    pass


def apt_errors(text, limit=400):
    """apt's own error lines (E:/W:/Err:), else the tail of its output."""
    lines = [ln.strip() for ln in text.splitlines() if re.match(r"^\s*(E:|W:|Err:|dpkg: error)", ln)]
    out = "; ".join(lines) if lines else " ".join(text.split()[-40:])
    return out[:limit]


def run(argv, timeout):
    env = dict(os.environ, **ENV)
    try:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, timeout=timeout,
                           stdin=subprocess.DEVNULL, universal_newlines=True)
    except subprocess.TimeoutExpired:
        return 124, f"E: {argv[0]} did not finish within {timeout} s"
    return p.returncode, p.stdout


def write_if_changed(path, text, mode, check):
    try:
        with open(path) as fh:
            if fh.read() == text:
                return False
    except OSError:
        pass
    if not check:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".mctl-")
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    return True


def installed_versions(names):
    """name -> version of the packages dpkg has fully installed."""
    rc, out = run(["dpkg-query", "-W", "-f", "${Package}\t${Version}\t${db:Status-Status}\n"] + list(names), 30)
    have = {}
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[2] == "installed":
            have[parts[0]] = parts[1]
    return have


def held():
    rc, out = run(["apt-mark", "showhold"], 30)
    return set(out.split()) if rc == 0 else set()


def parse_packages(comp_name, comp):
    pkgs = comp.get("packages") or []
    if not pkgs:
        raise Failed(f"component {comp_name}: the image names no packages for it (packages: [name=version, ...]), "
                     "so it can be neither installed nor verified")
    out = []
    for p in pkgs:
        m = PKG.match(str(p))
        if not m:
            raise Failed(f"component {comp_name}: {p!r} is not name=version (the exact Debian version)")
        if m.group(2) is None and comp.get("delivery", "repository") == "repository":
            raise Failed(f"component {comp_name}: {p!r} has no version; a repository component is installed "
                         "at an exact version (name=version)")
        out.append((m.group(1), m.group(2)))
    return out


def version_ok(wanted, have, comp_version):
    """Exact, or (a package of the OS image named without a version) the component's upstream version."""
    if have is None:
        return False
    if wanted is not None:
        return have == wanted
    upstream = re.sub(r"^[0-9]+:", "", have).split("-")[0]
    return upstream == comp_version or upstream.startswith(comp_version + ".")


def source_files(repo_name, repo):
    if not NAME.match(repo_name):
        raise Failed(f"repository name {repo_name!r} is not a plain name")
    url = str(repo.get("url") or "")
    if not re.match(r"^(https?|file)://[^\s\]]+$", url):
        raise Failed(f"repository {repo_name}: url {url!r} is not an http(s) or file URL")
    key = str(repo.get("key") or "")
    if "BEGIN PGP PUBLIC KEY BLOCK" not in key:
        raise Failed(f"repository {repo_name}: no signing key (key_file in apt_repositories.{repo_name})")
    suite = str(repo.get("suite") or "/")
    comps = " ".join(repo.get("components") or [])
    if not re.match(r"^[A-Za-z0-9./_-]+$", suite) or not re.match(r"^[A-Za-z0-9 _-]*$", comps):
        raise Failed(f"repository {repo_name}: suite/components must be plain names")
    keyring = f"{KEYRINGS}/mctl-{repo_name}.asc"
    line = f"deb [signed-by={keyring}] {url} {suite}{(' ' + comps) if comps else ''}\n"
    return keyring, key if key.endswith("\n") else key + "\n", f"{SOURCES}/mctl-{repo_name}.list", \
        "# Written by mctl provisioning (playbooks/roles/components)\n" + line


def pin_text(comp_name, pkgs):
    out = [f"# Written by mctl provisioning: component {comp_name} at the image's exact version\n"]
    for name, version in pkgs:
        out.append(f"\nPackage: {name}\nPin: version {version}\nPin-Priority: 1001\n")
    return "".join(out)


def main():
    module = AnsibleModule(argument_spec={
        "components": {"type": "dict", "required": True},
        "repositories": {"type": "dict", "default": {}},
        "kernel_package": {"type": "str", "default": ""},
        "update_timeout": {"type": "int", "default": 120},
        "install_timeout": {"type": "int", "default": 600},
    }, supports_check_mode=True)
    p = module.params
    check = module.check_mode
    changed = False
    report = {}
    updated = set()
    try:
        to_hold = []
        for comp_name, comp in p["components"].items():
            comp = comp or {}
            pkgs = parse_packages(comp_name, comp)
            delivery = comp.get("delivery", "repository")
            names = [n for n, _ in pkgs]
            have = installed_versions(names)
            cv = str(comp.get("version") or "")
            wrong = [(n, v) for n, v in pkgs if not version_ok(v, have.get(n), cv)]
            entry = {"delivery": delivery, "packages": dict(pkgs), "installed": []}
            if delivery == "repository":
                repo_name = comp.get("repository")
                if not repo_name:
                    raise Failed(f"component {comp_name}: delivery is repository but the image names no repository")
                repo = (p["repositories"] or {}).get(repo_name)
                if repo is None:
                    raise Failed(f"component {comp_name}: repository {repo_name!r} is not defined by the inventory "
                                 f"(apt_repositories.{repo_name}: url, suite, key_file)")
                keyring, key, src, line = source_files(repo_name, repo)
                c1 = write_if_changed(keyring, key, 0o644, check)
                c2 = write_if_changed(src, line, 0o644, check)
                c3 = write_if_changed(f"{PREFS}/mctl-{comp_name.replace('_', '-')}.pref", pin_text(comp_name, pkgs),
                                      0o644, check)
                changed |= c1 or c2 or c3
                entry["repository"] = repo_name
                if wrong and not check:
                    if repo_name not in updated:
                        rc, out = run(["apt-get", "update", "-q", "--error-on=any",
                                       "-o", f"Dir::Etc::sourcelist={src}", "-o", "Dir::Etc::sourceparts=-",
                                       "-o", "APT::Get::List-Cleanup=0", "-o", "Acquire::Retries=0",
                                       "-o", "Acquire::http::Timeout=10"], p["update_timeout"])
                        if rc != 0:
                            raise Failed(f"component {comp_name}: apt-get update of repository {repo_name} "
                                         f"({repo['url']}) failed (exit {rc}): {apt_errors(out)}")
                        updated.add(repo_name)
                    rc, out = run(["apt-get", "install", "-y", "-q", "--no-install-recommends",
                                   "--allow-change-held-packages", "--allow-downgrades",
                                   "-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold"]
                                  + [f"{n}={v}" for n, v in wrong], p["install_timeout"])
                    if rc != 0:
                        raise Failed(f"component {comp_name}: apt-get install of "
                                     f"{' '.join(f'{n}={v}' for n, v in wrong)} failed (exit {rc}): {apt_errors(out)}")
                    entry["installed"] = [f"{n}={v}" for n, v in wrong]
                    changed = True
                    have = installed_versions(names)
                    wrong = [(n, v) for n, v in pkgs if not version_ok(v, have.get(n), cv)]
                elif wrong:
                    entry["installed"] = [f"{n}={v}" for n, v in wrong]
                    changed = True
                    wrong = []
            if wrong:
                raise Failed(f"component {comp_name} ({delivery}): " + ", ".join(
                    f"{n} wanted {v or cv + '.*'}, {'installed ' + have[n] if n in have else 'not installed'}" for n, v in wrong))
            if comp.get("hold"):
                to_hold.extend(names)
            report[comp_name] = entry
        if p["kernel_package"]:
            kp = p["kernel_package"]
            if not installed_versions([kp]):
                raise Failed(f"kernel {kp}: the image's kernel package is not installed")
            to_hold.append(kp)
        new_holds = sorted(set(to_hold) - held())
        if new_holds:
            changed = True
            if not check:
                rc, out = run(["apt-mark", "hold"] + new_holds, 60)
                if rc != 0:
                    raise Failed(f"apt-mark hold {' '.join(new_holds)} failed (exit {rc}): {apt_errors(out)}")
    except Failed as exc:
        module.fail_json(msg=str(exc), changed=changed, components=report)
    module.exit_json(changed=changed, components=report, held=sorted(set(to_hold)))


if __name__ == "__main__":
    main()
