"""Lose at most one step when a node is lost: the newest training state kept in memory.

    snap = Snapshots(model, optimizer)                        # every rank, after wrapping
    start = snap.restore(latest_checkpoint_step, load_checkpoint)
    with snap:                                                # saves on a failure or SIGTERM
        for step in range(start.step + 1, total + 1):
            ...; optimizer.step()
            snap.step_done(step, data_position)

The map, step by step:

- `snapshots`: `Snapshots` (what a script holds) and `Restored` (what `restore` loaded);
  saving: what each rank writes when a step fails or the process is told to stop.
- `gate`: when the live state is consistent (`StepGate`: optimizer step hooks and
  `step_done`), and the thread woken by SIGTERM while the main thread may be blocked in a
  collective (`SignalWatch`, through signal.set_wakeup_fd).
- `state`: a state as a JSON skeleton and tensors (replicated, or DTensor Shard(0) rows).
- `store`: snapshot files in node-local memory: atomic, with a trailer (job, step, world,
  shard layout, CRC-32), so that a torn or foreign file is never loaded.
- `ring`: for sharded state (FSDP2), each rank's shard also in the next node's memory.
- `stepcopy`: for a script whose step spans several optimizer steps (an epoch), the state
  of its last `step_done` copied to host memory, saved when the live state is past it.
- `plan`: the agreement, a pure function of what every rank holds (no torch).
- `restore`: the collective restore: announce, agree, serve (broadcast, and point to point
  resharding to a new world size), load, check.
- `report`: lines on stderr and the progress line for elastic-worker.

Only public torch APIs: torch.distributed, torch.distributed.checkpoint.state_dict,
torch.distributed.tensor.DTensor, and the optimizers' step hooks.
"""

from __future__ import annotations

from .restore import Restored
from .snapshots import Snapshots, Stateful
from .state import SnapshotError

__all__ = ["Restored", "SnapshotError", "Snapshots", "Stateful"]
