"""``workbench profiles [NAME]``: the hardware profiles plans can target (bundled, user, detected)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "profiles",
        help="list hardware profiles for what-if planning",
        description="List the hardware profiles (bundled, the user's, and this machine as "
        "'detected'), or show one in detail. User profiles live in "
        "$XDG_CONFIG_HOME/model-memory-workbench/hardware/*.json.",
    )
    parser.add_argument(
        "name", nargs="?", help="show one profile (name, 'detected' or a .json path)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from workbench.models.hardware import list_profiles, load_profile, user_profiles_dir  # noqa: PLC0415 (torch: not at CLI start)

    profiles = [load_profile(args.name)] if args.name else list_profiles(include_detected=True)
    if args.json:
        json.dump([_profile_data(p) for p in profiles], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    for profile in profiles:
        for line in profile_lines(profile, detailed=bool(args.name)):
            print(line)
    if not args.name:
        print(f"(add your own as JSON files in {user_profiles_dir()})")
    return 0


def _profile_data(profile: Any) -> dict[str, Any]:
    data = profile.to_dict()
    data["source"] = str(profile.source) if profile.source else None
    data["budget_description"] = profile.budget_description()
    return data


def profile_lines(profile: Any, *, detailed: bool = False) -> list[str]:
    """A profile as text: a title line, how its budgets are made (``budget_description``:
    ``"budgets: cuda:0 24 GiB - 1004 MiB margin = 23 GiB"``) and, per device, memory and
    speeds."""
    from workbench.runtime import device_label, format_nbytes  # noqa: PLC0415 (torch: not at CLI start)

    lines = [f"{profile.name:<22} {profile.description}"]
    budgets = profile.budget_description()
    if budgets not in profile.description:  # the detected profile's description says it
        lines.append(f"    {budgets}")
    for spec in profile.devices:
        memory = format_nbytes(spec.memory_bytes)
        if spec.free_bytes is not None:
            memory += f" ({format_nbytes(spec.free_bytes)} free)"
        speed = ""
        if spec.device != "disk":
            speed = f", {spec.compute_tflops:g} TFLOP/s, {spec.memory_bandwidth_gbps:g} GB/s"
        lines.append(f"    {device_label(spec.device):<7} {spec.name}: {memory}{speed}")
    lines.append(
        f"    links   host->device {profile.host_to_device_gbps:g} GB/s, disk read "
        f"{profile.disk_read_gbps:g} GB/s"
    )
    if detailed and profile.source is not None:
        lines.append(f"    file    {profile.source}")
    return lines
