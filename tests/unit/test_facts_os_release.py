"""os-release and uname -r parsing, on real files."""

import pytest

from mctl.facts import FactsParseError
from mctl.facts.os_release import parse_kernel_release, parse_os_release

UBUNTU_2404 = '''PRETTY_NAME="Ubuntu 24.04.2 LTS"
NAME="Ubuntu"
VERSION_ID="24.04"
VERSION="24.04.2 LTS (Noble Numbat)"
VERSION_CODENAME=noble
ID=ubuntu
ID_LIKE=debian
HOME_URL="https://www.ubuntu.com/"
SUPPORT_URL="https://help.ubuntu.com/"
BUG_REPORT_URL="https://bugs.launchpad.net/ubuntu/"
PRIVACY_POLICY_URL="https://www.ubuntu.com/legal/terms-and-policies/privacy-policy"
UBUNTU_CODENAME=noble
LOGO=ubuntu-logo
'''


def test_ubuntu_2404():
    os_ = parse_os_release(UBUNTU_2404)
    assert (os_.id, os_.version_id, os_.version_codename) == ("ubuntu", "24.04", "noble")
    assert os_.pretty_name == "Ubuntu 24.04.2 LTS" and os_.id_like == ("debian",)
    assert os_.short == "ubuntu 24.04"


def test_this_machines_os_release_parses():
    # whatever Debian/Ubuntu this runs on: a real file, not a hand-written one
    with open("/etc/os-release") as fh:
        os_ = parse_os_release(fh.read())
    assert os_.id and os_.pretty_name


def test_quotes_escapes_and_comments():
    os_ = parse_os_release('# comment\n\nID="rhel"\nVERSION_ID=\'9.4\'\nPRETTY_NAME="Red Hat \\"Plow\\""\n')
    assert (os_.id, os_.version_id, os_.pretty_name) == ("rhel", "9.4", 'Red Hat "Plow"')


@pytest.mark.parametrize("text", ["", "garbage line\n", "ID=ubuntu\nNAME=Ubuntu Linux\n"])
def test_garbled_is_a_parse_error(text):
    with pytest.raises(FactsParseError):
        parse_os_release(text)


def test_kernel_release():
    assert parse_kernel_release("6.8.0-1025-nvidia-64k\n") == "6.8.0-1025-nvidia-64k"
    for bad in ("", "Linux\n", "6.8.0\n6.9.0\n"):
        with pytest.raises(FactsParseError):
            parse_kernel_release(bad)
