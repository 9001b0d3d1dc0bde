"""Clusters the cluster planner plans for: nodes of GPUs and the links between them.

A cluster profile is a JSON file (``resources/clusters/*.json`` ship with the app; users add
their own under ``$XDG_CONFIG_HOME/model-memory-workbench/clusters/``), found and read as the
hardware profiles are::

    {
      "name": "2x8-h100-80gb",
      "description": "Two nodes of 8 x H100 80 GB, 400 Gb/s InfiniBand",
      "network": {"bandwidth_gbits": 400, "latency_us": 5},    # between nodes, Gbit/s
      "nodes": [
        {"name": "h100-node", "count": 2,                       # "count" repeats a node
         "cpu_memory": "2TiB",
         "intra_link": {"kind": "nvlink", "bandwidth_gbps": 450, "latency_us": 3},  # GB/s
         "gpus": [{"name": "H100", "count": 8, "memory": "80GiB", "used": "0.5GiB",
                   "compute_tflops": 989, "memory_bandwidth_gbps": 3350}]}
      ]
    }

Network bandwidth is in Gbit/s (how NICs are sold); the intra-node link and GPU memory
bandwidth are in decimal GB/s, compute in dense 16-bit TFLOP/s, like the hardware profiles.
``used`` is memory another process already holds on that GPU (default 0).

Example:
    >>> cluster = load_cluster("2x8-h100-80gb")  # doctest: +SKIP
    >>> cluster.gpu_count, len(cluster.nodes)
    (16, 2)
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.big_modeling.json_files import read_json
from workbench.models.errors import ProfileError
from workbench.models.hardware import profile_size, user_config_dir
from workbench.resources import resources_root

logger = logging.getLogger(__name__)

LINK_KINDS = ("nvlink", "pcie", "infinity-fabric")
MAX_REPEAT = 1024  # a "count" above this is a typo, not a cluster


@dataclass(frozen=True)
class GPUSpec:
    """One accelerator of a node.

    Attributes:
        name: what users see ("NVIDIA H100 80GB HBM3").
        memory_bytes: total device memory.
        used_bytes: memory already held by other processes.
        compute_tflops: dense 16-bit TFLOP/s.
        memory_bandwidth_gbps: device memory bandwidth, GB/s.
    """

    name: str
    memory_bytes: int
    used_bytes: int = 0
    compute_tflops: float = 100.0
    memory_bandwidth_gbps: float = 1000.0

    @property
    def free_bytes(self) -> int:
        return self.memory_bytes - self.used_bytes


@dataclass(frozen=True)
class LinkSpec:
    """A link: ``kind`` (``"nvlink"``, ``"pcie"``, ``"network"``), bandwidth GB/s, latency s."""

    kind: str
    bandwidth_gbps: float
    latency_s: float


@dataclass(frozen=True)
class NodeSpec:
    """One machine: its GPUs, the link between them and its RAM."""

    name: str
    gpus: tuple[GPUSpec, ...]
    intra_link: LinkSpec
    cpu_memory_bytes: int


@dataclass(frozen=True)
class ClusterProfile:
    """Nodes and the network between them.

    Attributes:
        name: profile name (file stem or ``"name"``).
        description: one line for menus.
        nodes: every node, repeats expanded (``node0``, ``node1``... when a node has a count).
        network: the inter-node link (bandwidth in GB/s here, converted from Gbit/s).
        source: the JSON file, or ``None``.
    """

    name: str
    description: str
    nodes: tuple[NodeSpec, ...]
    network: LinkSpec
    source: Path | None = field(default=None, compare=False)

    @property
    def gpu_count(self) -> int:
        return sum(len(node.gpus) for node in self.nodes)

    def iter_gpus(self) -> list[tuple[int, int, GPUSpec]]:
        """Return ``(node_index, local_index, gpu)`` for every GPU, in node order."""
        return [(n, g, gpu) for n, node in enumerate(self.nodes) for g, gpu in enumerate(node.gpus)]

    def to_dict(self) -> dict[str, Any]:
        """Return the profile as JSON data ``cluster_from_dict`` reads (repeats expanded)."""
        return {
            "name": self.name,
            "description": self.description,
            "network": {
                "bandwidth_gbits": self.network.bandwidth_gbps * 8,
                "latency_us": self.network.latency_s * 1e6,
            },
            "nodes": [
                {
                    "name": node.name,
                    "cpu_memory": node.cpu_memory_bytes,
                    "intra_link": {
                        "kind": node.intra_link.kind,
                        "bandwidth_gbps": node.intra_link.bandwidth_gbps,
                        "latency_us": node.intra_link.latency_s * 1e6,
                    },
                    "gpus": [
                        {
                            "name": gpu.name,
                            "memory": gpu.memory_bytes,
                            "used": gpu.used_bytes,
                            "compute_tflops": gpu.compute_tflops,
                            "memory_bandwidth_gbps": gpu.memory_bandwidth_gbps,
                        }
                        for gpu in node.gpus
                    ],
                }
                for node in self.nodes
            ],
        }


def user_clusters_dir() -> Path:
    """Return the folder for the user's own cluster profiles (it may not exist)."""
    return user_config_dir("clusters")


def bundled_clusters_dir() -> Path:
    return resources_root() / "clusters"


def list_clusters() -> list[ClusterProfile]:
    """Return the bundled cluster profiles, then the user's (a user file overrides a name).

    A malformed user file is skipped with a warning in the log; ``load_cluster`` on it raises.
    """
    found: dict[str, ClusterProfile] = {}
    for folder in (bundled_clusters_dir(), user_clusters_dir()):
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.json")):
            try:
                profile = _read_cluster(path)
            except ProfileError as exc:
                logger.warning("skipping cluster profile %s: %s", path, exc)
                continue
            found[profile.name] = profile
    return list(found.values())


def load_cluster(name_or_path: str | os.PathLike[str]) -> ClusterProfile:
    """Return a cluster profile by name (bundled or user) or by JSON path.

    Raises:
        ProfileError: unknown name (lists the known ones) or a malformed file.
    """
    text = os.fspath(name_or_path)
    path = Path(text)
    if text.endswith(".json") or path.is_file():
        if not path.is_file():
            raise ProfileError(f"cluster profile file {text!r} does not exist")
        return _read_cluster(path)
    profiles = {profile.name: profile for profile in list_clusters()}
    if text in profiles:
        return profiles[text]
    known = ", ".join(sorted(profiles))
    raise ProfileError(
        f"unknown cluster profile {text!r}; known cluster profiles: {known} (or give a .json path)"
    )


def _read_cluster(path: Path) -> ClusterProfile:
    data = read_json(
        path,
        what="a cluster profile",
        fix="Fix the file or remove it from the clusters folder.",
        error=ProfileError,
    )
    return cluster_from_dict(data, source=path)


def cluster_from_dict(data: Any, *, source: Path | None = None) -> ClusterProfile:
    """Build a cluster profile from JSON data (what ``ClusterProfile.to_dict`` writes).

    Raises:
        ProfileError: naming the file (or "cluster profile data"), the node or GPU, the field
            and the problem.
    """
    where = f"cluster profile {source}" if source else "cluster profile data"
    if not isinstance(data, dict):
        raise ProfileError(f"{where} must hold a JSON object")
    raw_nodes = data.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise ProfileError(f"{where} needs a non-empty 'nodes' list")
    network_raw = data.get("network", {})
    if not isinstance(network_raw, dict):
        raise ProfileError(f"{where}: 'network' must be an object")
    network = LinkSpec(
        "network",
        _number(network_raw, "bandwidth_gbits", 10.0, f"{where}, network") / 8,
        _number(network_raw, "latency_us", 50.0, f"{where}, network", allow_zero=True) / 1e6,
    )
    nodes: list[NodeSpec] = []
    for i, raw in enumerate(raw_nodes):
        node_where = f"{where}, nodes[{i}]"
        if not isinstance(raw, dict):
            raise ProfileError(f"{node_where} must be an object")
        count = _count(raw, node_where)
        node = _node_from_dict(raw, node_where)
        for repeat in range(count):
            name = node.name if count == 1 else f"{node.name}{repeat}"
            nodes.append(NodeSpec(name, node.gpus, node.intra_link, node.cpu_memory_bytes))
    names = [node.name for node in nodes]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ProfileError(f"{where} names nodes twice: {', '.join(duplicates)}")
    return ClusterProfile(
        name=str(data.get("name") or (source.stem if source else "custom")),
        description=str(data.get("description", "")),
        nodes=tuple(nodes),
        network=network,
        source=source,
    )


def _node_from_dict(raw: dict[str, Any], where: str) -> NodeSpec:
    raw_gpus = raw.get("gpus")
    if not isinstance(raw_gpus, list) or not raw_gpus:
        raise ProfileError(f"{where} needs a non-empty 'gpus' list")
    gpus: list[GPUSpec] = []
    for j, raw_gpu in enumerate(raw_gpus):
        gpu_where = f"{where}, gpus[{j}]"
        if not isinstance(raw_gpu, dict) or "memory" not in raw_gpu:
            raise ProfileError(f"{gpu_where} needs at least 'memory'")
        memory = profile_size(raw_gpu, "memory", gpu_where)
        if memory == 0:
            raise ProfileError(f"{gpu_where}: 'memory' must be above 0 bytes")
        used = profile_size(raw_gpu, "used", gpu_where) if raw_gpu.get("used") is not None else 0
        if used >= memory:
            raise ProfileError(
                f"{gpu_where}: 'used' ({used} B) must be below 'memory' ({memory} B)"
            )
        gpu = GPUSpec(
            name=str(raw_gpu.get("name", "GPU")),
            memory_bytes=memory,
            used_bytes=used,
            compute_tflops=_number(raw_gpu, "compute_tflops", 100.0, gpu_where),
            memory_bandwidth_gbps=_number(raw_gpu, "memory_bandwidth_gbps", 1000.0, gpu_where),
        )
        gpus.extend([gpu] * _count(raw_gpu, gpu_where))
    link_raw = raw.get("intra_link", {})
    if not isinstance(link_raw, dict):
        raise ProfileError(f"{where}: 'intra_link' must be an object")
    kind = str(link_raw.get("kind", "pcie"))
    if kind not in LINK_KINDS:
        raise ProfileError(
            f"{where}: intra_link 'kind' must be one of {', '.join(LINK_KINDS)}, got {kind!r}"
        )
    link = LinkSpec(
        kind,
        _number(link_raw, "bandwidth_gbps", 25.0, f"{where}, intra_link"),
        _number(link_raw, "latency_us", 10.0, f"{where}, intra_link", allow_zero=True) / 1e6,
    )
    cpu_memory = profile_size(raw, "cpu_memory", where) if raw.get("cpu_memory") is not None else 0
    return NodeSpec(str(raw.get("name") or "node"), tuple(gpus), link, cpu_memory)


def _count(raw: dict[str, Any], where: str) -> int:
    value = raw.get("count", 1)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_REPEAT:
        raise ProfileError(
            f"{where}: 'count' must be a whole number from 1 to {MAX_REPEAT}, got {value!r}"
        )
    return value


def _number(
    raw: dict[str, Any], key: str, default: float, where: str, *, allow_zero: bool = False
) -> float:
    value = raw.get(key)
    if value is None:
        return default
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        lowest = "0 or more" if allow_zero else "a number above 0"
        raise ProfileError(f"{where}: '{key}' must be {lowest}, got {value!r}")
    return float(value)
