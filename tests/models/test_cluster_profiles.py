"""Cluster profiles: the bundled examples, user files, repeats, and malformed data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.models.cluster import cluster_from_dict, list_clusters, load_cluster
from workbench.models.errors import ProfileError

GIB = 2**30


def test_bundled_clusters_expand_their_node_and_gpu_counts():
    names = {profile.name for profile in list_clusters()}
    assert {"2x8-h100-80gb", "4x1-rtx4090-10gbe", "mixed-a100-l40s"} <= names
    h100 = load_cluster("2x8-h100-80gb")
    assert [node.name for node in h100.nodes] == ["h100-node0", "h100-node1"]
    assert h100.gpu_count == 16
    assert h100.network.bandwidth_gbps == 50.0  # 400 Gbit/s / 8
    assert h100.nodes[0].intra_link.kind == "nvlink"
    assert h100.nodes[1].gpus[7].free_bytes == 80 * GIB - GIB // 2
    mixed = load_cluster("mixed-a100-l40s")
    assert [gpu.memory_bytes // GIB for gpu in mixed.nodes[0].gpus] == [80, 80, 48, 48]


def test_a_user_file_is_found_by_name_and_round_trips(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    folder = tmp_path / "model-memory-workbench" / "clusters"
    folder.mkdir(parents=True)
    data = {"name": "lab", "nodes": [{"name": "box", "gpus": [{"memory": "24GiB", "count": 2}]}]}
    (folder / "lab.json").write_text(json.dumps(data))
    lab = load_cluster("lab")
    assert lab.gpu_count == 2 and lab.source == folder / "lab.json"
    assert cluster_from_dict(lab.to_dict()) == lab


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "must hold a JSON object"),
        ({"nodes": []}, "needs a non-empty 'nodes' list"),
        ({"nodes": [{"gpus": []}]}, r"nodes\[0\] needs a non-empty 'gpus' list"),
        ({"nodes": [{"gpus": [{"name": "x"}]}]}, r"gpus\[0\] needs at least 'memory'"),
        ({"nodes": [{"gpus": [{"memory": "8GiB", "used": "9GiB"}]}]}, "must be below 'memory'"),
        ({"nodes": [{"count": 0, "gpus": [{"memory": "8GiB"}]}]}, "'count' must be a whole number"),
        (
            {"nodes": [{"intra_link": {"kind": "wifi"}, "gpus": [{"memory": 1}]}]},
            "intra_link 'kind' must be one of nvlink, pcie",
        ),
        (
            {"network": {"bandwidth_gbits": -1}, "nodes": [{"gpus": [{"memory": 1}]}]},
            "'bandwidth_gbits' must be a number above 0",
        ),
        (
            {
                "nodes": [
                    {"name": "a", "gpus": [{"memory": 1}]},
                    {"name": "a", "gpus": [{"memory": 1}]},
                ]
            },
            "names nodes twice: a",
        ),
    ],
)
def test_malformed_profiles_name_the_field(data, message):
    with pytest.raises(ProfileError, match=message):
        cluster_from_dict(data)


def test_unknown_name_lists_the_known_ones(tmp_path: Path):
    with pytest.raises(ProfileError, match=r"known cluster profiles: .*2x8-h100-80gb"):
        load_cluster("no-such-cluster")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ProfileError, match=f"{bad}: not valid JSON.*expected a cluster profile"):
        load_cluster(bad)
