"""A GPU of its own for each GPU job of a local run on a node with several GPUs.

Snakemake 9 bounds how many jobs hold the `gpu` resource at once (`--resources gpu=N`), but tells no job which device
to use (snakemake issue #281, "Handle GPU ids", is open): every job would see every GPU and start on the first. So the
work is split in two. As a local run starts (the workflow's onstart hook, `offer_devices`), the run offers the first
N devices of the node (of CUDA_VISIBLE_DEVICES where it lists them) in `DEVICES_VARIABLE`, which every job process
inherits. Each GPU job, first thing in its script, claims as many free devices as it holds `gpu` (`claim_devices`)
with a non-blocking `fcntl.flock` on one lock file per device, and shows only those to CUDA; the lock lasts as long as
the job's process, and the kernel releases it when the process ends, however it ends. Snakemake's limit guarantees a
free device to every job it starts, so a job that finds none names the fault. Under a cluster executor (SLURM) the
scheduler gives each job its devices and nothing is offered; a job that holds no `gpu`, or a run without the
resource, claims nothing and leaves CUDA_VISIBLE_DEVICES as it is.

This module imports nothing heavy: a job claims before it imports torch, transformers or vLLM, since CUDA reads
CUDA_VISIBLE_DEVICES once, when it initializes.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import time
from pathlib import Path
from typing import IO, Any

__all__ = ["DEVICES_VARIABLE", "LOCKS_VARIABLE", "claim_devices", "log_claim", "node_devices", "offer_devices"]

# The devices a run hands out, comma-separated, as CUDA_VISIBLE_DEVICES names them.
DEVICES_VARIABLE = "CGRPO_GPU_DEVICES"
# The folder of the per-device lock files; unset, the run's .snakemake/gpu_slots. Two runs that share devices (two
# working directories on one node) must share this folder too.
LOCKS_VARIABLE = "CGRPO_GPU_LOCK_DIR"
DEFAULT_LOCKS = Path(".snakemake") / "gpu_slots"
# A finished job's children (an engine's or a compiler's worker processes) can hold its inherited lock for a moment
# after Snakemake has started the next job on its slot.
WAIT_S = 30.0

logger = logging.getLogger(__name__)
# The open lock files of this process's claim: closing one, or the process ending, releases the device.
_held: list[IO[str]] = []
_claimed: list[str] = []


def node_devices(count: int, visible: str | None) -> list[str]:
    """The `count` devices a run with `--resources gpu=<count>` hands out: the first of CUDA_VISIBLE_DEVICES
    (`visible`) where it is set, else 0 to count - 1."""
    if visible is None:
        return [str(index) for index in range(count)]
    listed = [device.strip() for device in visible.split(",") if device.strip()]
    if count > len(listed):
        raise ValueError(
            f"--resources gpu={count} lets {count} GPU jobs run at once, but CUDA_VISIBLE_DEVICES lists "
            f"{len(listed)} device(s) ({visible!r}): give gpu={len(listed)}, or list as many devices as gpu."
        )
    return listed[:count]


def offer_devices(workflow: Any) -> None:
    """Offer every job of a local run the devices of `--resources gpu=N` (the workflow's onstart hook calls it);
    nothing under a cluster executor, whose scheduler assigns devices, or where no `gpu` resource was given."""
    if not (workflow.is_main_process and workflow.local_exec):
        return
    resource = workflow.global_resources.get("gpu")
    if resource is None or not resource.value:
        return
    # Set, not defaulted: a value inherited from an enclosing run would offer that run's devices.
    os.environ[DEVICES_VARIABLE] = ",".join(node_devices(int(resource.value), os.environ.get("CUDA_VISIBLE_DEVICES")))


def claim_devices(count: int, wait_s: float = WAIT_S) -> dict[str, str]:
    """Claim `count` free devices of those the run offers, for as long as this process lives, and return the
    environment that shows only them to CUDA ({} where the run offers none or `count` is 0).

    Call it before anything initializes CUDA, and put the result into `os.environ`.
    """
    offered = os.environ.get(DEVICES_VARIABLE)
    if not count or not offered:
        return {}
    devices = offered.split(",")
    folder = Path(os.environ.get(LOCKS_VARIABLE) or DEFAULT_LOCKS)
    folder.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait_s
    while (claim := _try_claim(devices, count, folder)) is None:
        if time.monotonic() >= deadline:
            raise RuntimeError(
                f"This job waited {wait_s:g} s in vain for {count} free GPU(s) among {offered}, although "
                "Snakemake runs no more GPU jobs than there are GPUs, so a process outside this run holds their locks "
                f"in {folder}: stop it, or give each run on this node devices of its own (CUDA_VISIBLE_DEVICES)."
            )
        time.sleep(0.2)
    for device, handle in claim:
        _claimed.append(device)
        _held.append(handle)
    return {"CUDA_VISIBLE_DEVICES": ",".join(_claimed)}


def _try_claim(devices: list[str], count: int, folder: Path) -> list[tuple[str, IO[str]]] | None:
    """`count` devices with their locked files, or None (every lock let go) where fewer are free."""
    claim = []
    for device in devices:
        # Open for as long as the process holds the device: closing the file releases the lock.
        handle = open(folder / f"gpu-{_file_name(device)}.lock", "a")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        claim.append((device, handle))
        if len(claim) == count:
            return claim
    # Too few free: let the others go, so that two jobs each holding part of what they need cannot wait on each other.
    for _, handle in claim:
        handle.close()
    return None


def _file_name(device: str) -> str:
    # Device ids can be UUIDs ("GPU-8f...", "MIG-...").
    return re.sub(r"[^\w.-]", "_", device)


def log_claim() -> None:
    """Say in the job's log which devices it claimed, if any (a job claims before its log is set up)."""
    if _claimed:
        logger.info(
            "GPU job on device(s) %s (CUDA_VISIBLE_DEVICES) of %s offered by the run",
            ",".join(_claimed),
            os.environ[DEVICES_VARIABLE],
        )
