"""Hostfile parsing and include/exclude: every bad line is one error naming the file and line."""

import pytest

from llmtrain.config.errors import ConfigError
from llmtrain.launch.hostfile import Host, parse_hostfile, select_hosts


def hostfile(tmp_path, text):
    path = tmp_path / "hostfile"
    path.write_text(text)
    return str(path)


def test_hosts_slots_comments_and_blank_lines(tmp_path):
    path = hostfile(tmp_path, "# the nodes\nnode1 slots=8\n\nnode-2.cluster slots=4  # half\nnode_3\n")
    assert parse_hostfile(path) == [Host("node1", 8), Host("node-2.cluster", 4), Host("node_3", 1)]


@pytest.mark.parametrize("text, line, says", [
    ("node1 slots=2\nnode2; rm -rf / slots=2\n", 2, "invalid hostname 'node2;'"),
    ("node1 slots=two\n", 1, "expected 'hostname slots=N'"),
    ("node1 slots=2 extra\n", 1, "expected 'hostname slots=N'"),
    ("node1 slots=0\n", 1, "node1 slots=0: a host runs at least one process"),
    ("node1\nNODE1\n", 2, "host NODE1 is listed twice: line 1 has node1 (host names are case-insensitive)"),
    ("node1\nnode1\n", 2, "host node1 is listed twice: line 1 has node1; keep one line"),
])
def test_bad_lines_name_the_file_and_line(tmp_path, text, line, says):
    path = hostfile(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        parse_hostfile(path)
    assert e.value.key == "cluster.hostfile"
    assert e.value.message.startswith(f"{path}:{line}: ")
    assert says in e.value.message


def test_missing_and_empty_hostfiles(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        parse_hostfile(str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match="lists no hosts"):
        parse_hostfile(hostfile(tmp_path, "# nothing\n\n"))


HOSTS = [Host("node1", 2), Host("node2", 2), Host("node3", 2)]


def test_include_and_exclude_match_in_any_case_and_keep_the_file_order():
    assert select_hosts(HOSTS, "NODE3,node1", None) == [HOSTS[0], HOSTS[2]]
    assert select_hosts(HOSTS, None, "Node2") == [HOSTS[0], HOSTS[2]]
    assert select_hosts(HOSTS, "node1@node2", "node2") == [HOSTS[0]]


def test_unknown_hosts_and_an_empty_selection_are_refused():
    with pytest.raises(ConfigError) as e:
        select_hosts(HOSTS, "node9", None)
    assert (e.value.key, e.value.message) == ("cluster.include", "not in the hostfile: node9")
    with pytest.raises(ConfigError) as e:
        select_hosts(HOSTS, None, "node1,node2,node3")
    assert e.value.message == "no host left after cluster.include / cluster.exclude"
    with pytest.raises(ConfigError, match="invalid hostname"):
        select_hosts(HOSTS, None, "node1;ls")
