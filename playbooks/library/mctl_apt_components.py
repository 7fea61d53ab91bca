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

What a change does to running work is reported with the result, in check mode too (mctl's provisioning
reads it from its check pass, docs/decisions.md D71): ``disrupts`` lists the components whose packages
are (or would be) installed or removed and that are not named ``harmless`` (a component the role does
not know is disruptive), ``reboot`` those of them named ``reboot`` (their change takes effect at the
next boot). Keys, sources, pins and holds disrupt nothing.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: mctl_apt_components
short_description: Install or verify a software image's components through apt, pinned and held
options:
  components: {description: The image's components (mctl_image_spec.components)., type: dict, default: {}}
  packages: {description: "The image's plain packages (its packages: list), installed from the OS's own sources
             at any version when missing; one dpkg-query when none is (the base role).", type: list, default: []}
  repositories: {description: "name -> {url, suite, components, key} (key: the armored signing key's text).",
                 type: dict, default: {}}
  kernel_package: {description: Kernel package to verify and hold (empty when the image names none)., type: str, default: ""}
  update_timeout: {description: Seconds one apt-get update may take., type: int, default: 120}
  install_timeout: {description: Seconds one apt-get install may take., type: int, default: 600}
  harmless: {description: "Components whose packages can change under running work (reported in neither
             disrupts nor reboot).", type: list, default: []}
  reboot: {description: Components whose change takes effect at the next boot (the driver)., type: list, default: []}
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


def apt_errors(text, limit=700):
    """apt's own error lines (E:/W:/Err:), else the tail of its output."""
    lines = [ln.strip() for ln in text.splitlines()
             if re.match(r"^\s*(E:|W:|Err:|dpkg: error|.*(pre|post)-(installation|removal) script)", ln)]
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


APT_UPDATE = ["apt-get", "update", "-q", "--error-on=any", "-o", "Dir::Etc::sourceparts=-",
              "-o", "APT::Get::List-Cleanup=0", "-o", "Acquire::Retries=0", "-o", "Acquire::http::Timeout=10",
              "-o", "Acquire::Languages=none"]
APT_INSTALL = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "--allow-change-held-packages",
               "--allow-downgrades", "-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold"]
BRANCHED = re.compile(r"^(.+)-([0-9]{3})(-open|-server|-server-open)?$")


def other_branches(pkgs, state):
    """Installed packages of another driver branch than the image's, for the image's branch-named packages
    (nvidia-utils-570 where the image wants nvidia-utils-580): name -> the image's package it gives way to."""
    out = {}
    for name, _v in pkgs:
        m = BRANCHED.match(name)
        if not m:
            continue
        pat = re.compile("^" + re.escape(m.group(1)) + "-([0-9]{3})" + re.escape(m.group(3) or "") + "$")
        for have in state:
            hm = pat.match(have)
            if hm and hm.group(1) != m.group(2) and state[have][1] not in ("not-installed", "config-files"):
                out[have] = name
    return out


def package_state(names, patterns=()):
    """name -> (version, dpkg status) of every package dpkg knows among *names* and the glob *patterns*."""
    rc, out = run(["dpkg-query", "-W", "-f", "${Package}\t${Version}\t${db:Status-Status}\n"]
                  + list(names) + list(patterns), 30)
    state = {}
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[1]:
            state[parts[0]] = (parts[1], parts[2])
    return state


class Plan:
    """The image's components, checked before anything is written: (name, spec, [(pkg, version)], repo)."""

    def __init__(self, components, repositories):
        self.items = []
        for comp_name, comp in components.items():
            comp = comp or {}
            pkgs = parse_packages(comp_name, comp)
            delivery = comp.get("delivery", "repository")
            repo = None
            if delivery == "repository":
                repo_name = comp.get("repository")
                if not repo_name:
                    raise Failed(f"component {comp_name}: delivery is repository but the image names no repository")
                spec = (repositories or {}).get(repo_name)
                if spec is None:
                    raise Failed(f"component {comp_name}: repository {repo_name!r} is not defined by the inventory "
                                 f"(apt_repositories.{repo_name}: url, suite, key_file)")
                repo = (repo_name, spec, source_files(repo_name, spec))
            self.items.append((comp_name, comp, pkgs, delivery, repo))

    def repo(self, comp_name):
        return next(r for c, _s, _p, _d, r in self.items if c == comp_name)

    def names(self):
        return [n for _c, _s, pkgs, _d, _r in self.items for n, _v in pkgs]

    def wrong(self, state):
        """component -> its packages not (fully) installed at the wanted version, in the image's order."""
        out = {}
        for comp_name, comp, pkgs, _d, _r in self.items:
            cv = str(comp.get("version") or "")
            have = {n: v for n, (v, st) in state.items() if st == "installed"}
            bad = [(n, v) for n, v in pkgs if not version_ok(v, have.get(n), cv)]
            if bad:
                out[comp_name] = bad
        return out


def update(plan, repos, timeout):
    """One `apt-get update` of the given repositories' sources only (the OS's own are not read, so a slow
    or unreachable distribution mirror neither fails nor slows a tray). When it fails: one update per
    repository, in the image's order, to name the first component whose repository cannot be read."""
    lines = {}
    for _c, _s, _p, _d, repo in plan.items:
        if repo and repo[0] in repos:
            lines[repo[0]] = repo[2][3].splitlines()[-1] + "\n"

    def one(names):
        fd, tmp = tempfile.mkstemp(prefix="mctl-sources-", suffix=".list")
        with os.fdopen(fd, "w") as fh:
            fh.write("".join(lines[n] for n in sorted(names)))
        try:
            return run(APT_UPDATE + ["-o", f"Dir::Etc::sourcelist={tmp}"], timeout)
        finally:
            os.unlink(tmp)

    rc, out = one(repos)
    if rc == 0:
        return
    for comp_name, _c, _p, _d, repo in plan.items:
        if repo and repo[0] in lines:
            rc1, out1 = one({repo[0]})
            if rc1 != 0:
                raise Failed(f"component {comp_name}: apt-get update of repository {repo[0]} "
                             f"({repo[1]['url']}) failed (exit {rc1}): {apt_errors(out1)}")
            del lines[repo[0]]
    # each repository alone was read: the joint update's failure was passing (kept in apt's words if it recurs)


def install(pkgs, timeout):
    return run(APT_INSTALL + [f"{n}={v}" for n, v in pkgs], timeout)


PLAIN_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]*$")


def plain_missing(names, state):
    """The image's plain packages (`packages:`, from the OS's own sources at any version) that dpkg does not
    have installed, in the image's order; a name that is not a Debian package name is refused."""
    for n in names:
        if not isinstance(n, str) or not PLAIN_NAME.match(n):
            raise Failed(f"packages of the image: {n!r} is not a package name")
    return [n for n in dict.fromkeys(names) if state.get(n, ("", ""))[1] != "installed"]


def plain_packages(names, timeout, check):
    """Install the missing plain packages in one apt-get run (one dpkg-query when none is missing: a re-run
    opens no apt cache). Returns the names installed (or that would be)."""
    missing = plain_missing(names, package_state(names) if names else {})
    if missing and not check:
        rc, out = run(APT_INSTALL + missing, timeout)
        if rc != 0:
            raise Failed(f"packages of the image: apt-get install of {' '.join(missing)} failed (exit {rc}): "
                         f"{apt_errors(out)}")
    return missing


def main():
    module = AnsibleModule(argument_spec={
        "components": {"type": "dict", "default": {}},
        "packages": {"type": "list", "elements": "str", "default": []},
        "repositories": {"type": "dict", "default": {}},
        "kernel_package": {"type": "str", "default": ""},
        "update_timeout": {"type": "int", "default": 120},
        "install_timeout": {"type": "int", "default": 600},
        "harmless": {"type": "list", "elements": "str", "default": []},
        "reboot": {"type": "list", "elements": "str", "default": []},
    }, supports_check_mode=True)
    p = module.params
    check = module.check_mode
    changed = False
    report = {}
    to_hold = []
    try:
        if p["packages"]:
            report["packages"] = {"installed": plain_packages(p["packages"], p["install_timeout"], check)}
            changed |= bool(report["packages"]["installed"])
        plan = Plan(p["components"], p["repositories"])
        # the files first, for every component: keys, sources, pins (unchanged ones are not rewritten)
        for comp_name, comp, pkgs, delivery, repo in plan.items:
            report[comp_name] = {"delivery": delivery, "packages": dict(pkgs), "installed": []}
            if repo:
                repo_name, _spec, (keyring, key, src, line) = repo
                report[comp_name]["repository"] = repo_name
                c1 = write_if_changed(keyring, key, 0o644, check)
                c2 = write_if_changed(src, line, 0o644, check)
                c3 = write_if_changed(f"{PREFS}/mctl-{comp_name.replace('_', '-')}.pref", pin_text(comp_name, pkgs),
                                      0o644, check)
                changed |= c1 or c2 or c3
            if comp.get("hold"):
                to_hold.extend(n for n, _v in pkgs)
        # one dpkg-query for every package, and for other branches of the branch-named ones
        patterns = sorted({f"{m.group(1)}-[0-9][0-9][0-9]{m.group(3) or ''}" for n in plan.names()
                           for m in [BRANCHED.match(n)] if m})
        state = package_state(plan.names(), patterns)
        wrong = plan.wrong(state)
        fetch = {c: pk for c, pk in wrong.items() if plan.repo(c)}
        held_now = held()
        old = {}
        for comp_name, comp, pkgs, _d, repo in plan.items:
            if repo and comp.get("hold"):
                old.update({o: (comp_name, n) for o, n in other_branches(pkgs, state).items()})
        if fetch and check:
            changed = True
            for c, pk in fetch.items():
                report[c]["installed"] = [f"{n}={v}" for n, v in pk]
            for o, (c, _n) in sorted(old.items()):
                report[c].setdefault("removed", []).append(f"{o}={state[o][0]}")
        elif fetch:
            update(plan, {plan.repo(c)[0] for c in fetch}, p["update_timeout"])
            if old:
                # a driver-branch change: the old branch's packages are released and removed before the new
                # branch's are installed (both ship the same programs and libraries)
                comp_of = sorted({c for c, _n in old.values()}, key=lambda c: [i[0] for i in plan.items].index(c))
                gone = sorted(old)
                unhold = sorted(set(gone) & held_now)
                if unhold:
                    rc, out = run(["apt-mark", "unhold"] + unhold, 60)
                    if rc != 0:
                        raise Failed(f"component {comp_of[0]}: apt-mark unhold {' '.join(unhold)} failed "
                                     f"(exit {rc}): {apt_errors(out)}")
                    held_now -= set(unhold)
                rc, out = run(["apt-get", "remove", "-y", "-q", "--allow-change-held-packages"] + gone,
                              p["install_timeout"])
                if rc != 0:
                    raise Failed(f"component {comp_of[0]}: apt-get remove of the old branch's {' '.join(gone)} "
                                 f"failed (exit {rc}): {apt_errors(out)}")
                for c, _n in old.values():
                    report[c].setdefault("removed", [])
                for o, (c, _n) in sorted(old.items()):
                    report[c]["removed"].append(f"{o}={state[o][0]}")
                changed = True
            # every missing package of every component in one apt-get install
            batch = [pk for pks in fetch.values() for pk in pks]
            rc, out = install(batch, p["install_timeout"])
            changed = True
            if rc != 0:
                # name the component: install them one component at a time, in the image's order, until one fails
                state = package_state(plan.names())
                for c, pks in plan.wrong(state).items():
                    if c not in fetch:
                        continue
                    rc, out = install(pks, p["install_timeout"])
                    if rc != 0:
                        raise Failed(f"component {c}: apt-get install of "
                                     f"{' '.join(f'{n}={v}' for n, v in pks)} failed (exit {rc}): {apt_errors(out)}")
            for c, pk in fetch.items():
                report[c]["installed"] = [f"{n}={v}" for n, v in pk]
            state = package_state(plan.names())
            wrong = plan.wrong(state)
        for comp_name, comp, pkgs, delivery, repo in plan.items:
            bad = [] if (check and repo) else wrong.get(comp_name, [])
            if bad:
                cv = str(comp.get("version") or "")
                raise Failed(f"component {comp_name} ({delivery}): " + ", ".join(
                    f"{n} wanted {v or cv + '.*'}, "
                    + (f"installed {state[n][0]}" if state.get(n, ("", ""))[1] == "installed" else
                       f"{state[n][0]} {state[n][1]}" if n in state else "not installed") for n, v in bad))
        if p["kernel_package"]:
            kp = p["kernel_package"]
            if package_state([kp]).get(kp, ("", ""))[1] != "installed":
                raise Failed(f"kernel {kp}: the image's kernel package is not installed")
            to_hold.append(kp)
        new_holds = sorted(set(to_hold) - held_now)
        if new_holds:
            changed = True
            if not check:
                rc, out = run(["apt-mark", "hold"] + new_holds, 60)
                if rc != 0:
                    raise Failed(f"apt-mark hold {' '.join(new_holds)} failed (exit {rc}): {apt_errors(out)}")
    except Failed as exc:
        module.fail_json(msg=str(exc), changed=changed, components=report, **disruption(report, p))
    module.exit_json(changed=changed, components=report, held=sorted(set(to_hold)), **disruption(report, p))


def disruption(report, params):
    """What the packages changed (or would change) do to running work: {disrupts, reboot} (component names)."""
    moved = [c for c, r in report.items() if c != "packages" and (r.get("installed") or r.get("removed"))]
    disrupts = [c for c in moved if c not in params["harmless"]]
    return {"disrupts": disrupts, "reboot": [c for c in disrupts if c in params["reboot"]]}


if __name__ == "__main__":
    main()
