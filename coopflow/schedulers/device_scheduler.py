"""`DeviceScheduler`: device specs → torch.device lists (`comlrl.schedulers.device_scheduler`).

A spec is None (the default device: CUDA when available, else CPU), 'auto' (the same), one device string
(broadcast) or a list with one device per slot (a one-element list is broadcast too).
"""

from collections.abc import Sequence

import torch

from coopflow.schemas.config import parallel_mode

__all__ = ["DeviceScheduler", "normalize_parallel_training"]

DeviceSpec = str | torch.device | Sequence[str | torch.device]


def normalize_parallel_training(mode: object) -> str:
    """'none' (also None / 'null'), 'mp' or coopflow's 'ray'; anything else is a ValueError, as in the trainer configs."""
    return parallel_mode(mode)


def _default() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class DeviceScheduler:
    """Static helpers that turn device specs into one torch.device per agent / critic."""

    @staticmethod
    def resolve_devices(spec: DeviceSpec | None, num_devices: int, *, kind: str = "devices") -> list[torch.device]:
        if spec is None or (isinstance(spec, str) and spec == "auto"):
            return [_default()] * num_devices
        items = [spec] if isinstance(spec, (str, torch.device)) else list(spec)
        if len(items) not in (1, num_devices):
            raise ValueError(f"{kind} length ({len(items)}) must be 1 or {num_devices}.")
        devices = [_default() if str(d) == "auto" else torch.device(d) for d in items]
        return devices * num_devices if len(devices) == 1 else devices

    @staticmethod
    def resolve_single_device(*specs: DeviceSpec | None) -> torch.device:
        """The first spec that is set (a list: its first device), else the default device."""
        for s in specs:
            if s is None:
                continue
            first = s if isinstance(s, (str, torch.device)) else (list(s) or [None])[0]
            if first is not None:
                return _default() if str(first) == "auto" else torch.device(first)
        return _default()

    @staticmethod
    def assign_devices(num_agents: int, agent_devices: DeviceSpec | None, critic_devices: DeviceSpec | None, *,
                       use_separate_critic: bool) -> tuple[list[torch.device], list[torch.device]]:
        """(agent devices, critic devices): critics default to their agent's device."""
        agents = DeviceScheduler.resolve_devices(agent_devices, num_agents, kind="agent_devices")
        critics = (DeviceScheduler.resolve_devices(critic_devices, num_agents, kind="critic_devices")
                   if critic_devices is not None and use_separate_critic else list(agents))
        return agents, critics

    @staticmethod
    def assign_shared_critic_device(agent_devices: Sequence[torch.device],
                                    critic_devices: DeviceSpec | None) -> torch.device:
        """MAAC's one critic: the first critic device, else the first agent's."""
        return DeviceScheduler.resolve_single_device(critic_devices, list(agent_devices))
