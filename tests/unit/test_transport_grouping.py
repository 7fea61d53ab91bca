"""clush -b style grouping of fan-out results."""

from mctl.transport import HostResult, HostStatus, group_by_output


def r(host, out="", status=HostStatus.OK, code=0, err="", error=None):
    return HostResult(host, "127.0.0.1", status, exit_code=code, stdout=out, stderr=err, error=error)


def test_identical_output_folds_into_one_node_set_largest_first():
    results = [r(f"t{i:02d}", "6.1.0\n") for i in range(1, 18)] + [r("t18", "6.12.0\n")]
    groups = group_by_output(results)
    assert [(g.nodes, g.count, g.stdout) for g in groups] == [("t[01-17]", 17, "6.1.0\n"), ("t18", 1, "6.12.0\n")]


def test_exit_code_and_status_split_groups_even_with_same_text():
    results = [r("a1", "x\n"), r("a2", "x\n", HostStatus.FAILED, 1),
               r("a3", status=HostStatus.UNREACHABLE, code=None, error="Connection refused"),
               r("a4", status=HostStatus.UNREACHABLE, code=None, error="Connection refused"),
               r("a5", status=HostStatus.TIMEOUT, code=None, error="no SSH answer within 10s")]
    groups = group_by_output(results)
    assert [(g.nodes, g.status.value) for g in groups] == [
        ("a[3-4]", "unreachable"), ("a1", "ok"), ("a2", "failed"), ("a5", "timeout")]
    assert groups[0].error == "Connection refused"


def test_custom_key_can_ignore_stderr():
    results = [r("n1", "same", err="warn a"), r("n2", "same", err="warn b")]
    assert len(group_by_output(results)) == 2
    assert [g.nodes for g in group_by_output(results, key=lambda x: x.stdout)] == ["n[1-2]"]


def test_empty_input_gives_no_groups():
    assert group_by_output([]) == []
