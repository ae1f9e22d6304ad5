"""Placement and its settings, without a cluster: where a kernel goes, and what `hosts:`/`resources:` may say."""
from __future__ import annotations

import pytest
from conftest import configure

from primefs.errors import PrimefsError
from primefs.store.goals import parse_goal
from primefs.kernels.placement import Node, choose, kernel_needs, never_fits
from primefs.store.settings import check_hosts, check_resources


def nodes():
    return [Node("a", "a", {"CPU": 4.0, "memory": 8e9, "w1": 10.0}), Node("b", "b", {"CPU": 8.0, "memory": 8e9})]


def test_least_loaded_node_that_fits():
    a, b = nodes()
    need = kernel_needs({"num_cpus": 1}, None)
    assert need == {"CPU": 1.0}
    picks = []
    for _ in range(6):
        n = choose([a, b], need)
        n.take(need)
        picks.append(n.name)
    assert picks.count("b") == 4 and picks.count("a") == 2  # by share of CPU: b has twice the room
    assert choose([a, b], kernel_needs({}, {"w1": 1})) is a  # only a has w1
    a.give_back(need)
    assert a.used["CPU"] == 1.0 and a.kernels == 1


def test_kernels_asking_for_nothing_spread_evenly_but_not_to_nodes_without_cpus():
    a, b = nodes()
    head = Node("h", "h", {"memory": 8e9})  # `ray start --head --num-cpus=0`
    for _ in range(10):
        choose([head, a, b], {}).take({})
    assert (head.kernels, a.kernels, b.kernels) == (0, 5, 5)


def test_full_is_not_never():
    a, b = nodes()
    big = kernel_needs({"num_cpus": 4}, None)
    a.take(big)
    b.take(big)
    b.take(big)
    assert choose([a, b], big) is None and never_fits([a, b], big) is None
    why = never_fits([a, b], kernel_needs({"num_cpus": 1}, {"memory": "16G", "num_cpus": 2}))
    assert why.startswith("no node of the Ray cluster has CPU=2, memory=16GiB for one kernel and CPUs")


def test_session_resources_override_the_hosts_defaults():
    assert kernel_needs({"num_cpus": 1, "w1": 1}, {"num_cpus": 0, "memory": 2**30}) == {"w1": 1.0, "memory": 2.0**30}


@pytest.mark.parametrize("hosts, message", [
    ([{"kind": "k8s"}], "hosts[0].kind must be one of local, ray, not 'k8s'"),
    ([{"kind": "ray", "num_cpus": 1}], "hosts[0]: unknown key 'num_cpus' (known: kind, address, resources;"),
    ([{"kind": "ray", "resources": {"memory": "lots"}}], "memory must be a number of bytes or text such as 512M"),
    ([{"kind": "ray", "resources": {"CPU": 1}}], "write num_cpus, not CPU"),
    ([{"kind": "ray", "resources": {"gpu": -1}}], "resources.gpu must be between 0 and 1e+15, not -1"),
    ([{"kind": "ray"}, {"kind": "ray"}], "more than one host of kind ray"),
    ("ray", "`hosts:` must be a list of mappings"),
])
def test_bad_hosts_are_one_clear_line(hosts, message):
    with pytest.raises(PrimefsError, match=None) as exc:
        check_hosts(hosts, "primefs.yaml")
    assert message in str(exc.value)


def test_hosts_and_goal_resources(ws):
    ws = configure(ws, hosts=[{"kind": "ray", "address": "10.0.0.1:6379", "resources": {"memory": "1.5G"}}])
    assert ws.ray_host() == {"kind": "ray", "address": "10.0.0.1:6379", "resources": {"memory": 1610612736}}
    assert check_resources({"num_gpus": 1, "corpus": 2}, "x") == {"num_gpus": 1, "corpus": 2}
    (ws.goals / "g.md").write_text("---\nresources: {num_cpus: 2, memory: 4G}\n---\nwork\n")
    assert parse_goal(ws, ws.goals / "g.md").control["resources"] == {"num_cpus": 2, "memory": 4 * 2**30}
    (ws.goals / "bad.md").write_text("---\nresources: {num_cpus: many}\n---\nwork\n")
    with pytest.raises(PrimefsError, match=r"goals/bad.md: resources.num_cpus must be a finite number"):
        parse_goal(ws, ws.goals / "bad.md")
