"""Device placement with the reference's names (`comlrl.schedulers`)."""

from coopflow.schedulers.device_scheduler import DeviceScheduler, normalize_parallel_training

__all__ = ["DeviceScheduler", "normalize_parallel_training"]
