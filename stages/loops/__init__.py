"""The algorithm drivers: the loops that chain stages for each algorithm family.

`segment` (one checkpointed segment of updates, MAGRPO family and actor-critic), `run` (THE segment loop and what
follows training: evaluation, critic re-fit, re-scoring), `actor_critic` (IAC / MAAC's update strategy),
`preference` (MADPO / MARLHF) and `rounds` (THE round loop of iterative MADPO / MARLHF).
"""
